"""``spectrace top``'s model: scrapes or the store in, one frame of numbers out, rendered with rich.

Sources:

- ``/metrics`` URLs (vLLM's API port, where spectrace's series and vLLM's own sit; a headless node's or an
  offline engine's standalone endpoint): each scrape is parsed as Prometheus text and the samples of every
  URL are summed (DP ranks, nodes). Counters are windowed: the frame holds what they gained since the
  snapshot ``window`` seconds ago (per series, so a restarted process's reset counter counts from zero),
  lifetime until a second scrape exists (``--once``: one scrape, lifetime, said in the header).
- a store directory: the latest run (or ``--run``), counts with ``ts`` in the last ``window`` seconds,
  the whole run when nothing was recorded in it (said in the header).

Per draft position: drafted, accepted, rate, the conditional rate (accepted at i+1 / accepted at i) and
vLLM's own rate (its per-position accepted counter over its number of drafts) beside spectrace's; the
cliff is the position :func:`spectrace.audit.rules.acceptance.position_cliff` names, the rule of ``POSITION_CLIFF``.
Without spectrace's series (tracing off), the positions come from vLLM's counters alone.

A page is data from whoever serves it: it is read whole within one deadline (connect and body, :data:`PAGE_DEADLINE_S`)
up to :data:`MAX_PAGE_BYTES`; a sample that is not a number the frame can hold (NaN, ±Inf; a negative or fractional
count; a position, k, rank or bucket bound that is not a number) is left out and counted in the frame's note, naming
the URL and the first such series; every string from it reaches the terminal through ``console.safe`` / ``rich_text``.
"""

from __future__ import annotations

import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Iterable

from spectrace.audit.rules.speedup_figure import SPEEDUP_UNMEASURED, SPEEDUP_WINDOW
from spectrace.console import UsageError, rich_text, safe, terminal

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
MIN_WIDTH, MIN_HEIGHT = 60, 12

Key = tuple[int, str, tuple[tuple[str, str], ...]]  # (source index, sample name, sorted labels)


class TopError(UsageError):
    """Bad input for ``spectrace top``: one line, exit 2."""


# -- scraping ---------------------------------------------------------------------------


def metrics_url(text: str) -> str:
    """``http://host:port`` or ``host:port`` -> ``http://host:port/metrics``; a URL with a path is kept."""
    url = text if "://" in text else f"http://{text}"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise TopError(f"{text!r} is not an http(s) URL")
    if parts.path in ("", "/"):
        url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/metrics", parts.query, ""))
    return url


PAGE_DEADLINE_S = 5.0  # a whole page, connect and body: a server sending a byte a second holds nothing longer
MAX_PAGE_BYTES = 16 << 20  # a vLLM page is well under 1 MB


def fetch(url: str, timeout: float = PAGE_DEADLINE_S, max_bytes: int = MAX_PAGE_BYTES) -> str:
    """The page at ``url``, read whole within ``timeout`` seconds (connect and body) and at most ``max_bytes``; else
    one TopError. (The read runs on a daemon thread that ends on its own within a socket timeout.)"""
    box: dict[str, Any] = {}

    def read() -> None:
        try:
            box["text"] = _read(url, time.monotonic() + timeout, timeout, max_bytes)
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    reader = threading.Thread(target=read, name="spectrace-scrape", daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive() or not box:
        raise TopError(f"{url}: the page did not arrive within {timeout:g} s (connect and body)")
    if "error" in box:
        raise box["error"]
    return box["text"]


def _read(url: str, deadline: float, timeout: float, max_bytes: int) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            chunks, size = [], 0
            while True:
                if time.monotonic() > deadline:
                    raise TopError(f"{url}: the page did not arrive within {timeout:g} s (connect and body)")
                chunk = response.read1(1 << 16)
                if not chunk:
                    break
                size += len(chunk)
                if size > max_bytes:
                    raise TopError(f"{url}: the page is larger than {max_bytes >> 20} MiB; not read")
                chunks.append(chunk)
            return b"".join(chunks).decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        raise TopError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:  # http.client's errors are OSError or ValueError
        reason = getattr(exc, "reason", None) or exc
        raise TopError(f"cannot reach {url}: {reason}") from None


# the series the frame reads as counts (integers >= 0), and the labels it reads as numbers
_COUNTS = frozenset({
    "spectrace_verify_drafted_tokens_total", "spectrace_verify_accepted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total", "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_accepted_tokens_total", "spectrace_verify_acceptance_length_bucket",
    "spectrace_verify_acceptance_length_count", "spectrace_verify_acceptance_length_sum",
    "spectrace_slice_drafted_tokens_total", "spectrace_slice_accepted_tokens_total",
    "spectrace_worker_verified_drafted_tokens_total", "spectrace_worker_verified_accepted_tokens_total",
})
_INTEGER_LABELS = {"position": "a position", "k": "a k", "rank": "a rank"}


def _unusable(name: str, labels: dict[str, str], value: float) -> str | None:
    """Why a sample is not one the frame can hold, or None."""
    if not math.isfinite(value):
        return f"value {value}"
    if name in _COUNTS and (value < 0 or value != int(value)):
        return f"value {value:g} is not a count"
    for label, what in _INTEGER_LABELS.items():
        text = labels.get(label)
        if text is not None and text != "" and not (text.isascii() and text.isdigit() and len(text) < 10):
            return f"{label}={text!r} is not {what}"
    if name == "spectrace_verify_acceptance_length_bucket":
        le = labels.get("le", "")
        try:
            ok = le == "+Inf" or (math.isfinite(float(le)) and 0 <= float(le) < 1e6)
        except ValueError:
            ok = False
        if not ok:
            return f"le={le!r} is not a bucket bound"
    return None


def _series(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}" if inner else name


def parse(text: str, url: str, notes: list[str] | None = None) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text page; a page that is not one (HTML, JSON, empty) is a TopError. Samples the
    frame cannot hold (:func:`_unusable`) are left out, and counted in one line appended to ``notes``."""
    from prometheus_client.parser import text_string_to_metric_families

    head = text.lstrip()[:1]
    if not head or head in "<{[":
        raise TopError(f"{url}: not Prometheus text (the page starts with {text.lstrip()[:20]!r})")
    try:
        parsed = [(s.name, dict(s.labels), float(s.value)) for family in text_string_to_metric_families(text)
                  for s in family.samples]
    except Exception as exc:  # the parser raises ValueError, IndexError, ... on anything else
        raise TopError(f"{url}: not Prometheus text ({type(exc).__name__}: {exc})") from None
    if not parsed:
        raise TopError(f"{url}: no samples on the page (not Prometheus text?)")
    samples, skipped, first = [], 0, None
    for name, labels, value in parsed:
        why = _unusable(name, labels, value)
        if why is None:
            samples.append((name, labels, value))
            continue
        skipped += 1
        if first is None:
            first = f"{_series(name, labels)[:200]}: {why[:100]}"
    if skipped and notes is not None:
        notes.append(f"{url}: {skipped} series left out (not numbers a frame holds; the first: {first})")
    return samples


def snapshot(texts: Iterable[tuple[str, str]], notes: list[str] | None = None) -> dict[Key, float]:
    """(url, page) pairs -> one snapshot: every sample keyed by its source, name and labels."""
    out: dict[Key, float] = {}
    for index, (url, text) in enumerate(texts):
        for name, labels, value in parse(text, url, notes):
            out[(index, name, tuple(sorted(labels.items())))] = value
    return out


def _counter(name: str) -> bool:
    return name.endswith(("_total", "_bucket", "_count", "_sum"))


def window(latest: dict[Key, float], base: dict[Key, float] | None) -> dict[Key, float]:
    """Counters: what each series gained since ``base`` (a series new since, or reset, counts from zero);
    gauges as they are now. ``base`` None: lifetime."""
    out = {}
    for key, value in latest.items():
        if base is None or not _counter(key[1]):
            out[key] = value
            continue
        before = base.get(key)
        out[key] = value if before is None or value < before else value - before
    return out


# -- the frame ----------------------------------------------------------------------------


@dataclass
class Position:
    position: int
    drafted: float
    accepted: float
    vllm_rate: float | None = None

    @property
    def rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


@dataclass
class Frame:
    sources: list[str]
    scope: str  # "last 60s", "lifetime (one scrape)", "whole run ..."
    positions: list[Position] = field(default_factory=list)
    cliff: int | None = None
    lengths: dict[int, float] = field(default_factory=dict)  # accepted + 1 -> request-steps
    mean_length: float | None = None
    speedup: float | None = None  # the speed-up (acceptance.SPEEDUP_DEFINITION) over the run so far, mean over ranks
    speedup_by_k: dict[int, tuple[float, bool]] = field(default_factory=dict)  # k' -> (speed-up, extrapolated)
    findings: list[tuple[str, str, str, str]] = field(default_factory=list)  # severity, code, role, fix
    slices: list[tuple[str, str, float, float, float | None]] = field(default_factory=list)  # dim, value, drafted, accepted, rest rate
    ranks: list[tuple[str, float, float]] = field(default_factory=list)  # who, drafted, accepted
    vllm_source: bool = False  # positions from vLLM's counters (no spectrace series)
    note: str = ""

    @property
    def break_even(self) -> float | None:
        """The acceptance length at which speculation stops paying, at the estimate's step costs (L / speed-up)."""
        if self.mean_length and self.speedup:
            return self.mean_length / self.speedup
        return None


def _rank_order(rank: str | None) -> tuple[int, int]:
    """No rank first, then ranks by number (``spectrace report``'s ``order by rank nulls first``)."""
    try:
        return (1, int(rank)) if rank not in (None, "") else (0, 0)
    except ValueError:
        return (2, 0)


def _sum(values: dict[Key, float], name: str, by: str | None = None) -> dict[str, float]:
    out: dict[str, float] = {}
    for (_, sample, labels), value in values.items():
        if sample == name:
            key = dict(labels).get(by, "") if by else ""
            out[key] = out.get(key, 0.0) + value
    return out


def _fix(code: str) -> str:
    from spectrace.audit.codes import REGISTRY

    entry = REGISTRY.get(code)
    return entry.fix if entry and entry.fix else ""


def _cliff(positions: list[Position]) -> int | None:
    from spectrace.audit.rules import acceptance

    if len(positions) < 2:
        return None
    return acceptance.position_cliff([p.drafted for p in positions], [p.accepted for p in positions])


def frame_from_metrics(values: dict[Key, float], sources: list[str], scope: str) -> Frame:
    """One frame from windowed samples (:func:`window`)."""
    frame = Frame(sources=sources, scope=scope)
    drafted = _sum(values, "spectrace_verify_drafted_tokens_total", "position")
    accepted = _sum(values, "spectrace_verify_accepted_tokens_total", "position")
    vllm_accepted = _sum(values, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "position")
    vllm_drafts = _sum(values, "vllm:spec_decode_num_drafts_total").get("")
    if drafted or accepted:
        names = sorted({*drafted, *accepted}, key=int)
        frame.positions = [Position(int(p), drafted.get(p, 0.0), accepted.get(p, 0.0)) for p in names]
    elif vllm_accepted:
        frame.vllm_source = True
        frame.positions = [Position(int(p), vllm_drafts or 0.0, vllm_accepted[p]) for p in sorted(vllm_accepted, key=int)]
    for p in frame.positions:
        if vllm_drafts and str(p.position) in vllm_accepted:
            p.vllm_rate = vllm_accepted[str(p.position)] / vllm_drafts
    frame.cliff = _cliff(frame.positions)

    buckets = _sum(values, "spectrace_verify_acceptance_length_bucket", "le")
    previous = 0.0
    for le in sorted((b for b in buckets if b != "+Inf"), key=float):
        frame.lengths[int(float(le))] = buckets[le] - previous
        previous = buckets[le]
    count = _sum(values, "spectrace_verify_acceptance_length_count").get("")
    total = _sum(values, "spectrace_verify_acceptance_length_sum").get("")
    if count:
        frame.mean_length = total / count
    elif vllm_drafts:
        frame.mean_length = 1 + _sum(values, "vllm:spec_decode_num_accepted_tokens_total").get("", 0.0) / vllm_drafts

    # the lowest worker rank's (as spectrace report and SPECULATION_NOT_PAYING: every rank times the same steps)
    estimates = sorted((_rank_order(dict(labels).get("rank")), v) for (_, n, labels), v in values.items()
                       if n == "spectrace_speculation_speedup_estimate" and v > 0)
    frame.speedup = estimates[0][1] if estimates else None
    by_k: dict[int, list[tuple[float, bool]]] = {}
    for (_, n, labels), v in values.items():
        if n == "spectrace_speculation_speedup_by_k":
            lab = dict(labels)
            by_k.setdefault(int(lab.get("k", 0)), []).append((v, lab.get("extrapolated") == "true"))
    frame.speedup_by_k = {k: (sum(v for v, _ in vs) / len(vs), vs[0][1]) for k, vs in sorted(by_k.items())}

    seen = set()
    for (_, n, labels), v in values.items():
        if n in ("spectrace_config_finding", "spectrace_runtime_finding") and v:
            lab = dict(labels)
            seen.add((lab.get("severity", ""), lab.get("code", ""), lab.get("model_role", "")))
    frame.findings = sorted(((s, c, r, _fix(c)) for s, c, r in seen), key=lambda f: (SEVERITY_ORDER.get(f[0], 9), f[1], f[2]))

    sd, sa = {}, {}
    for (_, n, labels), v in values.items():
        if n in ("spectrace_slice_drafted_tokens_total", "spectrace_slice_accepted_tokens_total"):
            lab = dict(labels)
            target = sd if "drafted" in n else sa
            key = (lab.get("dimension", ""), lab.get("value", ""))
            target[key] = target.get(key, 0.0) + v
    whole_d, whole_a = sum(p.drafted for p in frame.positions), sum(p.accepted for p in frame.positions)
    for key in sorted(sd, key=lambda k: (-sd[k], k)):
        rest_d, rest_a = whole_d - sd[key], whole_a - sa.get(key, 0.0)
        frame.slices.append((*key, sd[key], sa.get(key, 0.0), rest_a / rest_d if rest_d > 0 else None))

    rank_d = _sum(values, "spectrace_worker_verified_drafted_tokens_total", "rank")
    rank_a = _sum(values, "spectrace_worker_verified_accepted_tokens_total", "rank")
    frame.ranks = [(f"rank {r}", rank_d[r], rank_a.get(r, 0.0)) for r in sorted(rank_d, key=lambda r: int(r or 0))]
    if len(sources) > 1:
        for index, url in enumerate(sources):
            own = {k: v for k, v in values.items() if k[0] == index}
            d = sum(_sum(own, "spectrace_verify_drafted_tokens_total").values())
            a = sum(_sum(own, "spectrace_verify_accepted_tokens_total").values())
            frame.ranks.append((url, d, a))
    return frame


class MetricsSource:
    """``/metrics`` URLs, scraped and summed; snapshots kept for the window."""

    def __init__(self, urls: list[str], window_s: float, timeout: float = PAGE_DEADLINE_S) -> None:
        self.urls = [metrics_url(u) for u in urls]
        self.window_s = window_s
        self.timeout = timeout
        self.history: list[tuple[float, dict[Key, float]]] = []
        self.texts: list[str] = []  # the last scrape's pages, in URL order

    def frame(self) -> Frame:
        self.texts = [fetch(url, self.timeout) for url in self.urls]
        now = time.monotonic()
        notes: list[str] = []
        latest = snapshot(zip(self.urls, self.texts), notes)
        self.history.append((now, latest))
        # the base: the newest snapshot at least window_s old (older ones are dropped), else the oldest there is
        older = [h for h in self.history[:-1] if now - h[0] >= self.window_s]
        if older:
            base_t, base = older[-1]
            self.history = [h for h in self.history if h[0] >= base_t]
        elif len(self.history) > 1:
            base_t, base = self.history[0]
        else:
            base_t, base = now, None
        scope = "lifetime (one scrape)" if base is None else f"last {now - base_t:.0f}s"
        frame = frame_from_metrics(window(latest, base), self.urls, scope)
        frame.note = "; ".join(notes)
        return frame


# -- the store ---------------------------------------------------------------------------------


def store_findings(con, run: str) -> list[tuple[str, str, str, str]]:
    """The run's active findings (:mod:`spectrace.audit.rules.active`: a recovered collapse is not one, as on
    ``/metrics``), as ``(severity, code, model_role, fix)`` in the frame's order."""
    from spectrace.audit.rules import active

    cursor = con.execute("select code, severity, coalesce(model_role, '') as model_role, coalesce(fix, '') as fix "
                         "from findings where run_id = ? order by ts", [run])
    names = [d[0] for d in cursor.description]
    rows = [dict(zip(names, row)) for row in cursor.fetchall()]
    found = {(r["severity"], r["code"], r["model_role"], r["fix"]) for r in active.active(rows)}
    return sorted(found, key=lambda f: (SEVERITY_ORDER.get(f[0], 9), f[1], f[2]))


class StoreSource:
    """A store directory: the latest run (or ``run``), its last ``window_s`` seconds."""

    def __init__(self, directory: str, window_s: float, run: str | None = None) -> None:
        from pathlib import Path

        self.directory, self.window_s, self.run = directory, window_s, run
        if not Path(directory).is_dir():
            raise TopError(f"no store at {directory}")

    def _con(self):
        from spectrace.store.read import StoreError, open as open_store

        try:
            return open_store(self.directory)
        except StoreError as exc:
            raise TopError(str(exc)) from None

    def frame(self) -> Frame:
        con = self._con()
        run = self.run
        if run is None:
            row = con.execute("select run_id from runs order by started_at desc nulls last, run_id desc limit 1").fetchone()
            if row is None:
                raise TopError(f"no runs in the store at {self.directory}")
            run = row[0]
        elif not con.execute("select count(*) from runs where run_id = ?", [run]).fetchone()[0]:
            raise TopError(f"no run {run!r} in the store at {self.directory}")
        since = time.time_ns() - int(self.window_s * 1e9)
        recent = con.execute("select count(*) from verify_counts where run_id = ? and ts >= make_timestamp_ns(?)",
                             [run, since]).fetchone()[0]
        where, args = ("and ts >= make_timestamp_ns(?)", [since]) if recent else ("", [])
        scope = f"run {run}, last {self.window_s:.0f}s" if recent else f"run {run}, whole run (nothing in the last {self.window_s:.0f}s)"
        frame = Frame(sources=[self.directory], scope=scope)
        rows = con.execute(
            f"select position, sum(drafted), sum(accepted) from verify_counts where run_id = ? and source = 'engine_core' "
            f"{where} group by position order by position", [run, *args]).fetchall()
        frame.positions = [Position(int(p), float(d or 0), float(a or 0)) for p, d, a in rows]
        frame.cliff = _cliff(frame.positions)
        lengths = con.execute(
            f"select length, sum(count) from acceptance_lengths where run_id = ? and source = 'engine_core' {where} "
            "group by length order by length", [run, *args]).fetchall()
        frame.lengths = {int(length): float(n) for length, n in lengths}
        steps = sum(frame.lengths.values())
        if steps:
            frame.mean_length = sum(k * n for k, n in frame.lengths.items()) / steps
        from spectrace.queries.report import run_speedup  # the report's figure: the lowest worker rank's, whole run

        whole = run_speedup(con, run)
        frame.speedup = whole[0] if whole else None
        frame.findings = store_findings(con, run)
        slices = con.execute("select dimension, value, drafted, accepted, rest_rate from acceptance_by_slice "
                             "where run_id = ? order by drafted desc, dimension, value", [run]).fetchall()
        frame.slices = [(d, str(v), float(dr or 0), float(a or 0), r) for d, v, dr, a, r in slices]
        ranks = con.execute(
            f"select rank, sum(drafted), sum(accepted) from verify_counts where run_id = ? and source = 'worker' {where} "
            "group by rank order by rank", [run, *args]).fetchall()
        frame.ranks = [(f"rank {r}", float(d or 0), float(a or 0)) for r, d, a in ranks]
        return frame


# -- rendering ---------------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.1%}"


def _n(value: float) -> str:
    return f"{value:,.0f}"


def _bar(share: float | None, width: int = 20) -> str:
    if not share:
        return ""
    return "█" * max(1, round(min(share, 1.0) * width))


def plain(frame: Frame, *, error: str | None = None, width: int = 120) -> str:
    """The frame as plain text (no escape codes, no trailing blanks): what ``--once`` and a pipe get."""
    import io

    from rich.console import Console

    out = io.StringIO()
    Console(file=out, color_system=None, force_terminal=False, width=width, legacy_windows=False).print(render(frame, error=error))
    return terminal("\n".join(line.rstrip() for line in out.getvalue().splitlines()).strip("\n") + "\n")


def render(frame: Frame, *, error: str | None = None, live: bool = False, size: tuple[int, int] | None = None):
    """The frame as rich renderables (one Group). Every string from a page or a store is a ``rich_text`` (escaped
    controls, never markup); the rest is spectrace's own. With ``size`` (the terminal's width and height: the live
    view) the sections that fit, then one line that says what is hidden below."""
    from rich.console import Group

    parts = _sections(frame, error=error, live=live)
    if size is not None:
        return fit(parts, *size)
    return Group(*(part for _, part in parts))


def _titled(title: str, table):
    """A table under its title on a line of its own: the title wraps at the terminal's width, never the table's."""
    from rich.console import Group
    from rich.text import Text

    return Group(Text(title, style="bold"), table)


def fit(parts: list[tuple[str, Any]], width: int, height: int):
    """The named sections ``parts`` that fit ``height`` lines at ``width``; the first that does not is cut, and the
    last line says how many lines are hidden and which sections they hold."""
    import io

    from rich.console import Console
    from rich.segment import Segment, Segments
    from rich.text import Text

    console = Console(file=io.StringIO(), width=width, height=height, color_system="truecolor", force_terminal=True,
                      legacy_windows=False)
    rendered = [(name, console.render_lines(part, console.options.update(width=width), pad=False, new_lines=False))
                for name, part in parts]
    total = sum(len(lines) for _, lines in rendered)
    if total <= height:
        lines = [line for _, chunk in rendered for line in chunk]
        marker = None
    else:
        room, lines, hidden = height - 1, [], []
        for name, chunk in rendered:
            if room > 0 and len(chunk) <= room:
                lines.extend(chunk)
                room -= len(chunk)
                continue
            # a table is cut below its head and a row or more (never a title or a head alone); text is hidden whole
            shown = chunk[:room] if len(chunk) > 5 and room >= 5 else []  # title, its blank, head, rule, a row
            lines.extend(shown)
            hidden.append(f"rest of {name}" if shown else name)
            room = 0
        more = total - len(lines)
        text = f"▼ {more} line{'s' if more != 1 else ''} hidden: "
        names, cut = list(hidden), False  # at the pane's width: the first names, then "…"
        while len(text + ", ".join(names + ["…"] * cut)) > width - 1 and len(names) > 1:
            names.pop()
            cut = True
        text += ", ".join(names + ["…"] * cut)
        hint = "  (a taller terminal shows them; --once prints all)"
        marker = Text(text + (hint if len(text + hint) < width else ""), style="reverse", no_wrap=True,
                      overflow="ellipsis")
    segments: list[Any] = []
    for line in lines:
        segments.extend(line)
        segments.append(Segment.line())
    out = [Segments(segments)]
    if marker is not None:
        out.append(marker)
    from rich.console import Group

    return Group(*out)


def _sections(frame: Frame, *, error: str | None = None, live: bool = False) -> list[tuple[str, Any]]:
    """The frame's sections, top to bottom, each with the name the truncation marker gives it."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    style = box.SIMPLE_HEAD if live else box.SIMPLE
    parts: list[tuple[str, Any]] = []
    head = Text()
    head.append("spectrace top", style="bold")
    head.append(f"  {safe(', '.join(frame.sources))}  ·  {safe(frame.scope)}")
    if frame.vllm_source:
        head.append("  ·  vLLM's counters only (no spectrace series: SPECTRACE unset?)", style="yellow")
    if live:
        head.append("  ·  q quits", style="dim")
    parts.append(("header", head))
    if error:
        parts.append(("scrape error", rich_text(f"last scrape failed: {error}", style="red")))

    if frame.positions:
        t = Table(box=style, pad_edge=False)
        with_vllm = any(p.vllm_rate is not None for p in frame.positions)
        for col, just in (("pos", "right"), ("drafted", "right"), ("accepted", "right"), ("rate", "right"),
                          ("", "left"), ("of prev", "right"), *((("vLLM", "right"),) if with_vllm else ()), ("", "left")):
            t.add_column(col, justify=just)
        prev = None
        for p in frame.positions:
            then = p.accepted / prev.accepted if prev is not None and prev.accepted else None
            mark = Text("◀ cliff", style="bold red") if p.position == frame.cliff else ""
            t.add_row(str(p.position), _n(p.drafted), _n(p.accepted), _pct(p.rate), _bar(p.rate), _pct(then),
                      *((_pct(p.vllm_rate),) if with_vllm else ()), mark)
            prev = p
        parts.append(("acceptance", _titled("Acceptance by draft position", t)))
        if frame.cliff is not None:
            parts.append(("cliff", Text(f"cliff: position {frame.cliff + 1} accepts under 5 % of what position {frame.cliff} accepted "
                              "(the rule of POSITION_CLIFF): check the drafter's taps and drafting mode", style="red")))
    else:
        parts.append(("acceptance", Text("no drafts verified yet (no speculative decoding series on the page, or "
                                             "none in the window)", style="yellow")))

    if frame.lengths:
        total = sum(frame.lengths.values()) or 1.0
        t = Table(box=style, pad_edge=False)
        for col, just in (("length", "right"), ("steps", "right"), ("share", "right"), ("", "left")):
            t.add_column(col, justify=just)
        for length, n in sorted(frame.lengths.items()):
            t.add_row(str(length), _n(n), _pct(n / total), _bar(n / total))
        parts.append(("lengths", _titled("Accepted length per request-step (accepted + 1)", t)))

    line = Text()
    pieces = []  # joined with " · ": nothing dangles when one is missing (an idle view has no mean length)
    if frame.mean_length is not None:
        pieces.append((f"tokens per request-step {frame.mean_length:.2f}", ""))
    if frame.speedup is not None:
        # the one speed-up figure (spectrace.audit.rules.speedup_figure.SPEEDUP_DEFINITION), its window and basis beside it
        pieces.append((f"speed-up {frame.speedup:.2f}x ({SPEEDUP_WINDOW}; {SPEEDUP_UNMEASURED})", ""))
        if frame.break_even is not None:
            verdict = ("pays" if frame.speedup >= 1 else "does not pay")
            pieces.append((f"break-even ≈ {frame.break_even:.2f} tokens per step: speculation {verdict}",
                           "green" if frame.speedup >= 1 else "red"))
    for i, (text, colour) in enumerate(pieces):
        line.append(("  ·  " if i else "") + text, style=colour)
    if line:
        parts.append(("speed-up", line))
    if frame.speedup_by_k:
        # relative to the k in force (the highest k' not extrapolated): a prediction to compare k', never a second
        # speed-up beside the one above (its step time without drafts is fitted from the run too, not measured)
        best = max(frame.speedup_by_k.items(), key=lambda kv: kv[1][0])
        in_force = max((k for k, (_, ext) in frame.speedup_by_k.items() if not ext), default=None)
        base = frame.speedup_by_k[in_force][0] if in_force is not None else 0.0
        if base > 0:
            text = f"What k pays, relative to k={in_force} in force: " + "  ".join(
                f"k'={k} {v / base:.2f}{'*' if ext else ''}" for k, (v, ext) in frame.speedup_by_k.items())
            parts.append(("what k pays", Text(text + f"  (highest k'={best[0]}; * extrapolated; fitted from the run "
                                                     "alone, not measured: not advice, see spectrace report)")))

    if frame.findings:
        t = Table(box=style, pad_edge=False)
        for col in ("severity", "code", "model", "fix"):
            t.add_column(col, overflow="fold")
        for severity, code, role, fix in frame.findings:
            t.add_row(rich_text(severity, style={"error": "bold red", "warning": "yellow"}.get(severity, "")),
                      rich_text(code), rich_text(role), rich_text(fix or "—"))
        parts.append((f"{len(frame.findings)} finding{'s' if len(frame.findings) != 1 else ''}", _titled("Findings", t)))
    slices = sorted((s for s in frame.slices if s[4] is not None and s[2]), key=lambda s: (s[3] / s[2] - s[4], -s[2]))
    if slices:
        t = Table(box=style, pad_edge=False)
        for col, just in (("dimension", "left"), ("value", "left"), ("drafted", "right"), ("accepted", "right"),
                          ("rate", "right"), ("the rest", "right")):
            t.add_column(col, justify=just)
        for dimension, value, drafted, accepted, rest in slices[:8]:
            t.add_row(rich_text(dimension), rich_text(value), _n(drafted), _n(accepted),
                      _pct(accepted / drafted if drafted else None), _pct(rest))
        shown = min(len(slices), 8)
        parts.append((f"{shown} slice{'s' if shown != 1 else ''}", _titled("Request slices, worst first", t)))
    if frame.ranks:
        t = Table(box=style, pad_edge=False)
        for col, just in (("who", "left"), ("drafted", "right"), ("accepted", "right"), ("rate", "right")):
            t.add_column(col, justify=just)
        for who, drafted, accepted in frame.ranks:
            t.add_row(rich_text(who), _n(drafted), _n(accepted), _pct(accepted / drafted if drafted else None))
        parts.append((f"{len(frame.ranks)} rank{'s' if len(frame.ranks) != 1 else ''}",
                      _titled("Per rank / source", t)))
    if frame.note:
        parts.append(("note", rich_text(frame.note, style="dim")))
    return parts
