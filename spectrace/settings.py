"""The one place that reads spectrace's environment variables.

Everything else receives a :class:`Settings`. Each variable, its default, its
range and its meaning is in ``VARIABLES`` below, from which docs/reference/settings.md is generated.

Every value is checked where it is read, against its range. :meth:`Settings.from_env`
collects the problems: in a vLLM process (``strict=False``, the plugin's path) each
is one log line naming the variable, the value and the default used instead, and
tracing goes on with that default; with ``strict=True`` (the ``spectrace`` command)
they are raised together as one :class:`SettingsError`.

A leaf module: it imports nothing of spectrace, so every other module (the CLI's
``duration`` arguments included) can use it.
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Callable, Mapping

log = logging.getLogger("vllm.spectrace")

# The sinks SPECTRACE_EXPORTER may name (the embedded store, OTLP, the Prometheus series, the fleet lake).
EXPORTERS = ("duckdb", "otlp", "prometheus", "lake")
PIPELINES = ("auto", "thread", "process")  # SPECTRACE_PIPELINE

_FALSE = ("", "0", "false", "no", "off")

# Values a traced process writes into os.environ for the processes vLLM starts from it
# (propagation, not configuration): read back only through :func:`inherited`.
ACTIVE_RUN_ENV = "SPECTRACE_ACTIVE_RUN"
METRICS_DIR_ENV = "SPECTRACE_METRICS_DIR"
_PROPAGATED = (ACTIVE_RUN_ENV, METRICS_DIR_ENV)

PATH_PART_MAX = 128


class SettingsError(ValueError):
    """One or more environment variables out of their range; ``problems`` has one sentence each."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


# -- the one duration grammar ---------------------------------------------------------

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*([smhdw]?)\s*", re.IGNORECASE)
DURATION_EXAMPLES = "e.g. 90s, 15m, 12h, 7d, 2w; a bare number is seconds"


def duration(text: str) -> float:
    """``90s``, ``15m``, ``12h``, ``7d``, ``2w`` or a bare number of seconds (``2.5``) to seconds.

    The one grammar of every duration spectrace reads: settings and command-line flags.
    A sign is parsed (so a range check can say "must be >= 0"); ``nan``, ``inf``, ``1e3``
    and anything else are not durations (ValueError)."""
    match = _DURATION.fullmatch(text or "")
    if not match:
        raise ValueError(f"{text!r} is not a duration ({DURATION_EXAMPLES})")
    return float(match.group(1)) * _UNITS[(match.group(2) or "s").lower()]


def path_part_problem(value: str) -> str | None:
    """Why ``value`` cannot be one path component inside the store, or None.

    Run ids and hosts name folders and files of the store (``<table>/run=<run>/<host>-<pid>-...``):
    no ``/``, ``\\``, NUL or other control characters, not ``.`` or ``..``, no leading ``.``
    (hidden and temporary files), at most 128 characters."""
    if not value:
        return "is empty"
    if len(value) > PATH_PART_MAX:
        return f"is longer than {PATH_PART_MAX} characters"
    if any(c in value for c in "/\\") or any(ord(c) < 32 or ord(c) == 127 for c in value):
        return "must be one path component (no '/', '\\', NUL or control characters)"
    if value in (".", ".."):
        return "is '.' or '..', not a name"
    if value.startswith("."):
        return "must not start with '.'"
    return None


def tracing_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``SPECTRACE`` turns tracing on (the plugin asks before importing anything else)."""
    value = (os.environ if env is None else env).get("SPECTRACE")
    return value is not None and value.strip().lower() not in _FALSE


def inherited(name: str) -> str | None:
    """A value a traced parent process wrote into the environment for this one (``ACTIVE_RUN_ENV``,
    ``METRICS_DIR_ENV``); None when unset or empty."""
    if name not in _PROPAGATED:
        raise KeyError(f"{name} is not propagated between spectrace's processes")
    return os.environ.get(name) or None


# -- reading with ranges ----------------------------------------------------------------


class _Reader:
    """Reads variables off ``env``; a value out of its range is noted and the default kept."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.problems: list[tuple[str, str]] = []  # (what is wrong, what is used instead)

    def raw(self, name: str) -> str | None:
        value = self.env.get(name)
        return None if value is None or value.strip() == "" else value

    def refuse(self, name: str, raw: str, why: str, default: object, shown: str | None = None) -> object:
        self.problems.append((f"{name}={raw!r} {why}", shown or _shown(default)))
        return default

    def flag(self, name: str) -> bool:
        value = self.env.get(name)
        return value is not None and value.strip().lower() not in _FALSE

    def number(self, name: str, default, ok: Callable[[float], bool], rule: str, cast=float):
        raw = self.raw(name)
        if raw is None:
            return default
        try:
            value = cast(raw.strip())
        except ValueError:
            return self.refuse(name, raw, f"is not {'an integer' if cast is int else 'a number'} ({rule})", default)
        if not (math.isfinite(value) and ok(value)):
            return self.refuse(name, raw, f"is out of range: {rule}", default)
        return value

    def seconds(self, name: str, default: float, ok: Callable[[float], bool], rule: str) -> float:
        raw = self.raw(name)
        if raw is None:
            return default
        try:
            value = duration(raw)
        except ValueError:
            return self.refuse(name, raw, f"is not a duration ({DURATION_EXAMPLES}; {rule})", default, f"{default:g}s")
        if not ok(value):
            return self.refuse(name, raw, f"is out of range: {rule}", default, f"{default:g}s")
        return value

    def path_part(self, name: str, default, shown: str):
        raw = self.raw(name)
        if raw is None:
            return default
        why = path_part_problem(raw.strip())
        return self.refuse(name, raw, why, default, shown) if why else raw.strip()

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        raw = self.raw(name)
        if raw is None:
            return default
        value = raw.strip().lower()
        if value in choices:
            return value
        return self.refuse(name, raw, f"is not one of {', '.join(choices)}", default)

    def exporters(self, name: str, default: tuple[str, ...]) -> tuple[str, ...]:
        raw = self.raw(name)
        if raw is None:
            return default
        names = tuple(dict.fromkeys(part.strip().lower() for part in raw.split(",") if part.strip()))
        unknown = [n for n in names if n not in EXPORTERS]
        known = tuple(n for n in names if n in EXPORTERS)
        if unknown:
            self.problems.append((
                f"{name}={raw!r} names unknown sink(s) {', '.join(unknown)} (known: {', '.join(EXPORTERS)})",
                ",".join(known or default),
            ))
        return known or default


def _shown(default: object) -> str:
    if default is None:
        return "the default (unset)"
    if isinstance(default, float) and default.is_integer():
        return repr(default)
    return str(default)


_YEARS_10 = 10 * 365 * 86400.0  # a bound on every duration (within threading's TIMEOUT_MAX)


@dataclass(frozen=True)
class Settings:
    enabled: bool = False
    dir: Path = Path("spectrace-data")
    run_id: str | None = None
    exporters: tuple[str, ...] = ("duckdb", "prometheus")
    flush_interval_s: float = 2.0
    max_buffer_rows: int = 200_000
    step_sample: float = 1.0
    span_every_steps: int = 100
    collapse_threshold: float = 0.1
    collapse_window_tokens: int = 2000
    collapse_min_tokens: int = 200
    record_tokens: bool = False
    # hooks (as in the `hooks` table) whose own work raises at once (SPECTRACE_INJECT_FAULT, comma-separated)
    inject_fault: frozenset[str] = frozenset()
    prometheus_port: int = 9464
    prometheus_host: str = "0.0.0.0"
    metrics_dir: Path | None = None  # per-server exposition files (spectrace.sinks.exposition)
    max_mb: float = 0.0
    retention_s: float = 7 * 86400.0  # SPECTRACE_RETENTION; 0: keep everything
    compact_interval_s: float = 60.0  # SPECTRACE_COMPACT_INTERVAL; 0: this process never compacts
    store_group: bool = False  # SPECTRACE_STORE_GROUP: the store readable by the owner's group (0750/0640, not 0700/0600)
    host: str = field(default_factory=socket.gethostname)  # every row's `host` (SPECTRACE_HOST)
    lake: str | None = None  # DuckLake catalog, e.g. "postgres:dbname=spectrace host=db" (SPECTRACE_LAKE)
    lake_data: str | None = None  # where the lake's data files go (SPECTRACE_LAKE_DATA)
    # SPECTRACE_PIPELINE: "thread" (counting, judging and the sinks on a flush thread of the traced process),
    # "process" (the traced process keeps its hooks and a shipper; a pipeline process does the rest), or "auto":
    # "process" wherever vLLM is loaded (an accelerator or its CPU platform), "thread" without vLLM (resolved by
    # the runtime: ``spectrace.recorder.runtime.pipeline_shape``)
    pipeline: str = "auto"
    # SPECTRACE_SHIP_INTERVAL: how often the shipper hands records to the pipeline process. Each message has fixed
    # costs (a wake with cold caches, the state, a write, acknowledgements): 0.25 s shares them among 12 steps at
    # 50 steps/s instead of 5, and cost the engine process 0.44-0.46 points of a core less than 0.1 s at 256 x 50
    # with the stand-in engine's step unchanged (-0.29 %, -2.40 … +1.86; -0.72 %, -3.05 … +1.66: the two paired in
    # one process, bench/results/ship_interval*.json); 0.5 s saved 0.07 points more
    ship_interval_s: float = 0.25
    # SPECTRACE_EXPOSITION_INTERVAL: the periodic flush rewrites the exposition file at most this often (a flush
    # asked for, the last one, and the first quiet flush after a skipped one always do); 0: every flush
    exposition_interval_s: float = 5.0
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # one hook name, a comma-separated list, or any iterable of names -> a frozenset (hot-path `in`)
        value = self.inject_fault
        if not isinstance(value, frozenset):
            names = value.split(",") if isinstance(value, str) else (value or ())
            object.__setattr__(self, "inject_fault", frozenset(n.strip() for n in names if n and n.strip()))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, strict: bool = False) -> "Settings":
        """Settings from ``env`` (default: ``os.environ``); an unset or empty variable keeps the
        field's default above, the one place each default is written.

        A value out of its range keeps the default too: ``strict=False`` logs one line per
        variable (the variable, the value, the default used) and goes on; ``strict=True``
        raises one :class:`SettingsError` listing every problem. Nothing is deleted because
        of a refused value: a refused retention or size cap is the default, never its sign."""
        env = dict(os.environ if env is None else env)
        d = {f.name: f.default for f in fields(cls) if f.default is not MISSING}
        r = _Reader(env)
        hostname = socket.gethostname()
        settings = cls(
            enabled=r.flag("SPECTRACE"),
            dir=Path(r.raw("SPECTRACE_DIR") or d["dir"]).absolute(),
            run_id=r.path_part("SPECTRACE_RUN_ID", None, "a generated run id"),
            exporters=r.exporters("SPECTRACE_EXPORTER", d["exporters"]),
            flush_interval_s=r.seconds(
                "SPECTRACE_FLUSH_INTERVAL", d["flush_interval_s"], lambda v: 0 < v <= 86400, "> 0 s and at most 1d"
            ),
            max_buffer_rows=r.number("SPECTRACE_MAX_BUFFER_ROWS", d["max_buffer_rows"], lambda v: v >= 1, ">= 1", int),
            step_sample=r.number("SPECTRACE_STEP_SAMPLE", d["step_sample"], lambda v: 0 <= v <= 1, "between 0 and 1"),
            span_every_steps=r.number("SPECTRACE_SPAN_EVERY", d["span_every_steps"], lambda v: v >= 0, ">= 0 (0: no spans)", int),
            collapse_threshold=r.number(
                "SPECTRACE_COLLAPSE_THRESHOLD", d["collapse_threshold"], lambda v: 0 <= v <= 1, "between 0 and 1"
            ),
            collapse_window_tokens=r.number(
                "SPECTRACE_COLLAPSE_WINDOW", d["collapse_window_tokens"], lambda v: v >= 1, ">= 1", int
            ),
            collapse_min_tokens=r.number(
                "SPECTRACE_COLLAPSE_MIN_TOKENS", d["collapse_min_tokens"], lambda v: v >= 1, ">= 1", int
            ),
            record_tokens=r.flag("SPECTRACE_RECORD_TOKENS"),
            inject_fault=env.get("SPECTRACE_INJECT_FAULT") or "",
            prometheus_port=r.number(
                "SPECTRACE_PROMETHEUS_PORT", d["prometheus_port"], lambda v: 0 <= v <= 65535, "a port, 0 to 65535", int
            ),
            prometheus_host=r.raw("SPECTRACE_PROMETHEUS_HOST") or d["prometheus_host"],
            metrics_dir=Path(env[METRICS_DIR_ENV]) if env.get(METRICS_DIR_ENV) else None,
            max_mb=r.number("SPECTRACE_MAX_MB", d["max_mb"], lambda v: v >= 0, ">= 0 (0: no cap)"),
            retention_s=r.seconds(
                "SPECTRACE_RETENTION", d["retention_s"], lambda v: 0 <= v <= _YEARS_10, ">= 0 (0: keep everything), at most 10 years"
            ),
            compact_interval_s=r.seconds(
                "SPECTRACE_COMPACT_INTERVAL", d["compact_interval_s"], lambda v: 0 <= v <= _YEARS_10,
                ">= 0 (0: this process does not compact), at most 10 years",
            ),
            store_group=r.flag("SPECTRACE_STORE_GROUP"),
            host=r.path_part("SPECTRACE_HOST", hostname, f"the hostname {hostname!r}"),
            lake=(r.raw("SPECTRACE_LAKE") or "").strip() or None,
            lake_data=(r.raw("SPECTRACE_LAKE_DATA") or "").strip() or None,
            pipeline=r.choice("SPECTRACE_PIPELINE", d["pipeline"], PIPELINES),
            ship_interval_s=r.seconds(
                "SPECTRACE_SHIP_INTERVAL", d["ship_interval_s"], lambda v: 0.01 <= v <= 60, ">= 0.01 s and at most 60 s"
            ),
            exposition_interval_s=r.seconds(
                "SPECTRACE_EXPOSITION_INTERVAL", d["exposition_interval_s"], lambda v: 0 <= v <= 3600,
                ">= 0 s and at most 1h"
            ),
        )
        if r.problems:
            if strict:
                raise SettingsError([what for what, _ in r.problems])
            for what, used in r.problems:
                log.warning("spectrace: %s; using %s", what, used)
        return settings


def store_dir(env: Mapping[str, str] | None = None) -> Path:
    """``SPECTRACE_DIR``, or the default store directory (the ``spectrace`` command's ``--dir`` default)."""
    return Path((os.environ if env is None else env).get("SPECTRACE_DIR", "").strip() or Settings.dir)


# -- the documented table -----------------------------------------------------------------
# One row per variable: what docs/reference/settings.md says (generated by ``python -m tools.docs_reference``;
# tests/test_docs.py fails when a variable read above is missing here, or a literal default is not the code's).


@dataclass(frozen=True)
class Variable:
    name: str
    field: str | None  # the Settings field it sets (None: not a Settings field)
    range: str
    meaning: str
    default: str | None = None  # None: the field's default, written as the variable would be; else words


VARIABLES: tuple[Variable, ...] = (
    Variable("SPECTRACE", "enabled", "any value; `0`, `false`, `no`, `off`, empty: off",
             "`1` turns tracing on in every vLLM process", default="unset"),
    Variable("SPECTRACE_DIR", "dir", "a path", "the DuckDB store (Parquet segments, one set per process)"),
    Variable("SPECTRACE_EXPORTER", "exporters", "names from " + ", ".join(f"`{e}`" for e in EXPORTERS),
             "sinks, comma-separated; an unknown name is left out (one log line)"),
    Variable("SPECTRACE_HOST", "host", "one path component",
             "every row's `host`, in every sink (a pod name; two replicas on one machine)", default="the hostname"),
    Variable("SPECTRACE_LAKE", "lake", "a DuckLake catalog string",
             "the lake's catalog (`lake` sink, `--lake`): `postgres:dbname=... host=... user=...`", default="unset"),
    Variable("SPECTRACE_LAKE_DATA", "lake_data", "a path",
             "where the lake's Parquet data files go: a path every replica shares; needed when the lake is created",
             default="kept in the catalog"),
    Variable("SPECTRACE_RUN_ID", "run_id", "one path component",
             "run id of the next engine start (later ones in the same process get `.2`, `.3`, …)", default="generated"),
    Variable("SPECTRACE_FLUSH_INTERVAL", "flush_interval_s", "a duration, > 0, at most `1d`",
             "seconds between background flushes: how fresh the store and the Prometheus series are. Each flush has a "
             "fixed cost (a Parquet file per table, the exposition render): at 1 s the flush thread used 12.6–15.2 ms "
             "of CPU a second at batch 64, at 2 s 7.8 (`bench/profile_flush.py`; Benchmarks)"),
    Variable("SPECTRACE_PIPELINE", "pipeline", "`auto`, `thread`, `process`",
             "where counting, judging and the sinks run: `thread`, a flush thread in each traced process; `process`, one "
             "pipeline process per traced process, so that the engine's process keeps only the hooks and a shipper "
             "(GPU engines: at batch 256 the flush thread cost the engine 13-25 %, the shipper about 1 % of a core; the "
             "CPU engine kept 98.9 / 99.4 % of its throughput at batch 16 / 64 in it, 98.6 / 98.5 % with the flush "
             "thread; Benchmarks); `auto`: `process` in every vLLM process, whatever its platform, `thread` where vLLM "
             "is not loaded. `thread` saves a process per traced process (130–630 MB resident; a multiprocess CPU engine has "
             "three: frontend, engine core, worker)"),
    Variable("SPECTRACE_SHIP_INTERVAL", "ship_interval_s", "a duration, 0.01 s to 60 s",
             "with `SPECTRACE_PIPELINE=process`: how often the shipper hands the records to the pipeline process, and so "
             "the most a `kill -9` of the engine process loses (what it recorded since; what it shipped, its pipeline "
             "process still writes); 0.1 s cost the engine's process 0.45 % of a core more than 0.25 s at batch "
             "256 × 50 steps/s, 0.5 s 0.07 % less (Benchmarks); an idle process (nothing recorded) sends nothing, and "
             "its shipper looks twice as seldom each time, up to once a second"),
    Variable("SPECTRACE_MAX_BUFFER_ROWS", "max_buffer_rows", "integer >= 1",
             "per-process buffer bound; rows beyond it are dropped and counted"),
    Variable("SPECTRACE_STEP_SAMPLE", "step_sample", "0 to 1",
             "fraction of request-steps stored as `verify_steps` rows (counts are always complete)"),
    Variable("SPECTRACE_SPAN_EVERY", "span_every_steps", "integer >= 0",
             "one sampled `spectrace.verify.step` span every N engine steps (0: none)"),
    Variable("SPECTRACE_COLLAPSE_THRESHOLD", "collapse_threshold", "0 to 1",
             "`ACCEPTANCE_COLLAPSE` when position-0 or overall acceptance falls below this"),
    Variable("SPECTRACE_COLLAPSE_WINDOW", "collapse_window_tokens", "integer >= 1",
             "… measured over the last N drafted tokens"),
    Variable("SPECTRACE_COLLAPSE_MIN_TOKENS", "collapse_min_tokens", "integer >= 1",
             "… once at least N drafted tokens are in the window"),
    Variable("SPECTRACE_PROMETHEUS_PORT", "prometheus_port", "0 to 65535",
             "offline engines (`LLM`) and headless nodes (`vllm serve --headless`) only: the fixed port of their "
             "standalone `/metrics` (taken: one log line, no endpoint). `vllm serve` needs no port: spectrace's series "
             "are on vLLM's own `/metrics`"),
    Variable("SPECTRACE_PROMETHEUS_HOST", "prometheus_host", "an address", "address the Prometheus endpoints bind to"),
    Variable(METRICS_DIR_ENV, "metrics_dir", "a path",
             "where each process writes its exposition file (set by spectrace for the processes vLLM starts)",
             default="a fresh temporary directory"),
    Variable("SPECTRACE_EXPOSITION_INTERVAL", "exposition_interval_s", "a duration, 0 to 1h (`0`: every flush)",
             "the periodic flush rewrites the process's exposition file (its series on `/metrics`) at most this "
             "often; a flush asked for, the last one, and the first flush with nothing new after one that skipped "
             "always rewrite it: while records come in the series are at most this (and a flush) behind, and they "
             "catch up one flush after records stop. Rendering them costs 6-8 ms of CPU a time at batch 256 x 50 "
             "steps/s; at the 2 s flush, 5 s took the pipeline process from 0.30-0.42 % of a core to 0.11-0.18 % "
             "(Benchmarks)"),
    Variable("SPECTRACE_MAX_MB", "max_mb", ">= 0 (`0`: no cap)",
             "cap on the store's size; segments of the oldest finished runs are removed first, and the removal is "
             "logged and recorded"),
    Variable("SPECTRACE_RETENTION", "retention_s", "a duration, >= 0",
             "files whose records are older than this are removed (`0`: keep everything), logged and recorded in "
             "`store_evictions`"),
    Variable("SPECTRACE_COMPACT_INTERVAL", "compact_interval_s", "a duration, >= 0",
             "seconds between compaction cycles of each process's own segments (`0`: this process does not compact)"),
    Variable("SPECTRACE_STORE_GROUP", "store_group", "as `SPECTRACE`",
             "`1` makes the store readable by the owner's group: folders `0750`, files `0640` (default: `0700` / "
             "`0600`, whatever the umask)", default="unset"),
    Variable("SPECTRACE_RECORD_TOKENS", "record_tokens", "as `SPECTRACE`",
             "`1` also stores draft token ids in `verify_steps` (off by default: no prompt text or token ids are "
             "recorded)", default="unset"),
    Variable("SPECTRACE_INJECT_FAULT", "inject_fault", "hook names",
             "hook names (as in the `hooks` table), comma-separated, whose own work raises at once, for testing that "
             "a failing hook never hurts vLLM: the work is skipped, the error counted in `internal_errors`, vLLM goes "
             "on", default="unset"),
    Variable(ACTIVE_RUN_ENV, None, "set by spectrace",
             "the run a traced process hands to the processes vLLM starts from it (written by spectrace, not a "
             "setting)", default="set by spectrace"),
)

_DURATION_FIELDS = ("flush_interval_s", "retention_s", "compact_interval_s", "exposition_interval_s")


def documented_default(variable: Variable) -> str:
    """The default column of ``variable``: its words, or the field's default as the variable would be written."""
    if variable.default is not None:
        return variable.default
    value = {f.name: f.default for f in fields(Settings) if f.default is not MISSING}[variable.field]
    if variable.field in _DURATION_FIELDS:
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if value >= size and value % size == 0:
                return f"`{value / size:g}{unit}`"
        return f"`{value:g}s`"
    if isinstance(value, tuple):
        return f"`{','.join(value)}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"
