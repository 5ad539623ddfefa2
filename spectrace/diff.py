"""``spectrace diff A B``: two runs side by side, the before/after of a drafter change.

A and B are each a store directory (its latest run), a run id in the store at ``--dir``, or a ``/metrics``
URL (``http://...``: one scrape, the counters since the processes started, summed over the page). Per draft
position, per context range (the buckets split at the run's boundaries) and per request slice: drafted,
rate and its 95 % Wilson interval (per position a drafted token is a trial; summed over positions a
request-step's k drafts are one, as ``SLICE_ACCEPTANCE_LOW`` counts them), the difference B - A in points,
and whether the intervals are apart; the mean acceptance length; the findings only one of the runs has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spectrace.console import UsageError, format_table, safe, terminal


@dataclass
class Run:
    label: str  # "A" / "B"
    store: str
    run_id: str
    info: dict[str, Any]
    k: int
    positions: dict[int, tuple[int, int]] = field(default_factory=dict)  # position -> (drafted, accepted)
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    slices: dict[tuple[str, str], tuple[int, int, int]] = field(default_factory=dict)  # -> (requests, drafted, accepted)
    mean_length: float | None = None
    steps: int = 0
    findings: set[tuple[str, str, str]] = field(default_factory=set)  # (code, severity, model_role)
    note: str = ""  # series of a scraped page left out (not numbers a counter can hold), counted


_opened: dict[str, Any] = {}  # one connection per store for the whole diff: each file it skips is named once


def _open(directory: str):
    from spectrace.store.read import StoreError, open as open_store

    if not Path(directory).is_dir():
        raise UsageError(f"no store at {directory}")
    key = str(Path(directory).resolve())
    if key not in _opened:
        try:
            _opened[key] = open_store(directory)
        except StoreError as exc:
            raise UsageError(str(exc)) from None
    return _opened[key]


def close() -> None:
    """Close the connections the diff opened."""
    while _opened:
        _opened.popitem()[1].close()


def resolve(arg: str, default_store: str) -> tuple[str, str]:
    """(store, run id) for ``arg``: a store directory (its latest run) or a run id in ``default_store``."""
    if Path(arg).is_dir():
        con = _open(arg)
        row = con.execute("select run_id from runs order by started_at desc nulls last, run_id desc limit 1").fetchone()
        if row is None:
            raise UsageError(f"no runs in the store at {arg}")
        return arg, row[0]
    if not Path(default_store).is_dir():
        raise UsageError(f"{arg!r} is neither a store directory nor a run (no store at {default_store})")
    con = _open(default_store)
    if not con.execute("select count(*) from runs where run_id = ?", [arg]).fetchone()[0]:
        raise UsageError(f"{arg!r} is neither a store directory nor a run in the store at {default_store}")
    return default_store, arg


def is_url(arg: str) -> bool:
    return arg.startswith(("http://", "https://"))


def load_url(label: str, url: str) -> Run:
    """A run from one scrape of ``url``: lifetime counts (spectrace's series, else vLLM's own counters)."""
    from spectrace import top

    source = top.MetricsSource([url], window_s=0)
    frame = source.frame()
    page = top.snapshot(zip(source.urls, source.texts))  # the same checks as the frame's (its note says what was left)
    info_labels = next((dict(labels) for (_, name, labels) in page if name == "spectrace_run_info"), {})
    declared = str(info_labels.get("num_speculative_tokens") or "")
    k = int(declared) if declared.isascii() and declared.isdigit() and len(declared) < 4 else len(frame.positions) or 1
    run = Run(label, source.urls[0], info_labels.get("run_id") or "(scrape)",
              {"method": info_labels.get("method"), "k": k, "draft": info_labels.get("draft_model")}, k)
    run.positions = {p.position: (int(p.drafted), int(p.accepted)) for p in frame.positions}
    run.slices = {(d, v): (0, int(dr), int(a)) for d, v, dr, a, _ in frame.slices}
    run.mean_length = frame.mean_length
    run.steps = int(sum(frame.lengths.values()))
    run.findings = {(code, severity, role) for severity, code, role, _ in frame.findings}
    run.note = frame.note
    return run


def load(label: str, store: str, run_id: str) -> Run:
    con = _open(store)
    row = con.execute("select method, num_speculative_tokens, target_model, draft_model from runs where run_id = ? "
                      "order by started_at desc nulls last limit 1", [run_id]).fetchone()
    info = dict(zip(("method", "k", "target", "draft"), row)) if row else {}
    run = Run(label, store, run_id, info, int(info.get("k") or 1))
    for position, drafted, accepted in con.execute(
            "select position, drafted, accepted from acceptance_by_position where run_id = ? order by position", [run_id]).fetchall():
        run.positions[int(position)] = (int(drafted or 0), int(accepted or 0))
    if run.positions and not info.get("k"):
        run.k = len(run.positions)
    for name, drafted, accepted in con.execute(
            "select context_range, sum(drafted), sum(accepted) from verify_counts where run_id = ? and source = 'engine_core' "
            "and context_range is not null group by context_range", [run_id]).fetchall():
        run.ranges[str(name)] = (int(drafted or 0), int(accepted or 0))
    for dimension, value, requests, drafted, accepted in con.execute(
            "select dimension, value, requests, drafted, accepted from acceptance_by_slice where run_id = ?", [run_id]).fetchall():
        run.slices[(str(dimension), str(value))] = (int(requests or 0), int(drafted or 0), int(accepted or 0))
    lengths = con.execute("select length, sum(count) from acceptance_lengths where run_id = ? and source = 'engine_core' "
                          "group by length", [run_id]).fetchall()
    run.steps = int(sum(n for _, n in lengths))
    if run.steps:
        run.mean_length = sum(int(length) * int(n) for length, n in lengths) / run.steps
    run.findings = {(c, s, r or "") for c, s, r in con.execute(
        "select distinct code, severity, model_role from findings where run_id = ?", [run_id]).fetchall()}
    return run


def _range_key(name: str) -> tuple[float, str]:
    """Context ranges in order of their lower end (``0-64``, ``64-512``, ``512-1k``, ``16k+``)."""
    low = name.split("-")[0].rstrip("+")
    try:
        value = float(low[:-1]) * 1000 if low.endswith("k") else float(low)
    except ValueError:
        value = float("inf")
    return value, name


def _cell(counts: tuple[int, int] | None, k: int) -> tuple[str, str, str, tuple[float, float] | None]:
    from spectrace.audit.rules.slices import wilson

    if not counts or not counts[0]:
        return "—", "—", "—", None
    drafted, accepted = counts
    low, high = wilson(accepted, drafted, k)
    return f"{drafted:,}", f"{accepted / drafted:.1%}", f"{low:.1%}–{high:.1%}", (low, high)


def _compare(a: tuple[int, int] | None, b: tuple[int, int] | None, ka: int, kb: int) -> list[str]:
    da, ra, ia, a_int = _cell(a, ka)
    db, rb, ib, b_int = _cell(b, kb)
    if a_int and b_int:
        delta = (b[1] / b[0] - a[1] / a[0]) * 100
        verdict = "apart" if a_int[1] < b_int[0] or b_int[1] < a_int[0] else "overlap"
        change = f"{delta:+.1f} pts"
    else:
        verdict, change = "", ""
    return [da, ra, ia, db, rb, ib, change, verdict]


HEAD = ["A drafted", "A rate", "A 95 %", "B drafted", "B rate", "B 95 %", "B - A", "intervals"]


def render(a: Run, b: Run) -> str:
    out = ["spectrace diff"]
    for run in (a, b):
        info = run.info
        where = "scraped from" if is_url(run.store) else "in"
        out.append(f"  {run.label}  run {safe(run.run_id)} {where} {safe(run.store)}: {safe(info.get('method') or '?')}, "
                   f"k = {safe(info.get('k') or '?')}, draft {safe(info.get('draft') or '?')}")
        if run.note:
            out.append(f"     {safe(run.note)}")
    out.append("")
    out.append("Acceptance by draft position (95 % intervals; a drafted token is a trial)")
    positions = sorted({*a.positions, *b.positions})
    if positions:
        rows = [[p, *_compare(a.positions.get(p), b.positions.get(p), 1, 1)] for p in positions]
        out.append(format_table(["pos", *HEAD], rows))
    else:
        out.append("  no drafts verified in either run")
    length = lambda r: (f"{r.mean_length:.3f}" + (f" over {r.steps:,} request-steps" if r.steps else "")  # noqa: E731
                        if r.mean_length else "—")
    out += ["", f"Mean acceptance length: A {length(a)}, B {length(b)}"
            + (f"; B - A {b.mean_length - a.mean_length:+.3f}" if a.mean_length and b.mean_length else "")]
    ranges = sorted({*a.ranges, *b.ranges}, key=_range_key)
    if ranges:
        out += ["", "By context range (all positions; a request-step's k drafts are one trial)"]
        rows = [[name, *_compare(a.ranges.get(name), b.ranges.get(name), a.k, b.k)] for name in ranges]
        out.append(format_table(["context", *HEAD], rows))
    # a dimension whose requests all share one value in both runs compares nothing beyond the run itself
    varied = {d for run in (a, b) for d in {d for d, _ in run.slices} if sum(1 for dd, _ in run.slices if dd == d) > 1}
    keys = sorted(k for k in {*a.slices, *b.slices} if k[0] in varied)
    if keys:
        out += ["", "By request slice (all positions; a request-step's k drafts are one trial)"]
        rows = []
        for key in keys:
            sa, sb = a.slices.get(key), b.slices.get(key)
            rows.append([key[0], key[1], *_compare(sa[1:] if sa else None, sb[1:] if sb else None, a.k, b.k)])
        out.append(format_table(["dimension", "value", *HEAD], rows))
    single = {d for d, _ in {*a.slices, *b.slices}} - varied
    if single:
        out += ["", f"Request slices: {len(single)} dimension(s) with one value in both runs ({safe(', '.join(sorted(single)))})"]
    order = {"error": 0, "warning": 1, "info": 2}
    rank = lambda f: (order.get(f[1], 9), f[0], f[2])  # noqa: E731
    only_a, only_b = sorted(a.findings - b.findings, key=rank), sorted(b.findings - a.findings, key=rank)
    out += ["", "Findings that differ" if only_a or only_b else "Findings: the same in both runs"]
    for label, found in (("only in A", only_a), ("only in B", only_b)):
        for code, severity, role in found:
            out.append(f"  {label}  {safe(severity):<7} {safe(code)}" + (f" [{safe(role)}]" if role else ""))
    return terminal("\n".join(out) + "\n")  # values from a page or a store: no control reaches a terminal
