"""The one place that reads spectrace's environment variables.

Everything else receives a :class:`Settings`. Each variable, its default and
its meaning is listed in README.md ("Configuration").
"""

from __future__ import annotations

import os
import socket
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

_FALSE = ("", "0", "false", "no", "off")


def _flag(env: dict[str, str], name: str, default: bool = False) -> bool:
    value = env.get(name)
    if value is None:
        return default
    return value.strip().lower() not in _FALSE


def _number(env: dict[str, str], name: str, default: float, cast=float):
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return cast(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _duration(env: dict[str, str], name: str, default: float) -> float:
    """``90s``, ``15m``, ``12h``, ``7d``, ``2w`` or a bare number of seconds; ``0`` turns it off."""
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    unit = raw[-1] if raw[-1] in _UNITS else "s"
    try:
        return float(raw.rstrip("smhdw") if unit != "s" or raw[-1] == "s" else raw) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"{name}={env.get(name)!r} is not a duration (e.g. 90s, 15m, 12h, 7d)") from None


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
    host: str = field(default_factory=socket.gethostname)  # every row's `host` (SPECTRACE_HOST)
    lake: str | None = None  # DuckLake catalog, e.g. "postgres:dbname=spectrace host=db" (SPECTRACE_LAKE)
    lake_data: str | None = None  # where the lake's data files go (SPECTRACE_LAKE_DATA)
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # one hook name, a comma-separated list, or any iterable of names -> a frozenset (hot-path `in`)
        value = self.inject_fault
        if not isinstance(value, frozenset):
            names = value.split(",") if isinstance(value, str) else (value or ())
            object.__setattr__(self, "inject_fault", frozenset(n.strip() for n in names if n and n.strip()))

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "Settings":
        """Settings from ``env`` (default: ``os.environ``); an unset or empty variable keeps the
        field's default above, the one place each default is written."""
        env = dict(os.environ if env is None else env)
        defaults = {f.name: f.default for f in fields(cls) if f.default is not MISSING}
        exporters = tuple(
            part.strip().lower() for part in env.get("SPECTRACE_EXPORTER", "").split(",") if part.strip()
        ) or defaults["exporters"]
        return cls(
            enabled=_flag(env, "SPECTRACE"),
            dir=Path(env.get("SPECTRACE_DIR") or defaults["dir"]).absolute(),
            run_id=env.get("SPECTRACE_RUN_ID") or None,
            exporters=exporters,
            flush_interval_s=_number(env, "SPECTRACE_FLUSH_INTERVAL", defaults["flush_interval_s"]),
            max_buffer_rows=_number(env, "SPECTRACE_MAX_BUFFER_ROWS", defaults["max_buffer_rows"], int),
            step_sample=_number(env, "SPECTRACE_STEP_SAMPLE", defaults["step_sample"]),
            span_every_steps=_number(env, "SPECTRACE_SPAN_EVERY", defaults["span_every_steps"], int),
            collapse_threshold=_number(env, "SPECTRACE_COLLAPSE_THRESHOLD", defaults["collapse_threshold"]),
            collapse_window_tokens=_number(env, "SPECTRACE_COLLAPSE_WINDOW", defaults["collapse_window_tokens"], int),
            collapse_min_tokens=_number(env, "SPECTRACE_COLLAPSE_MIN_TOKENS", defaults["collapse_min_tokens"], int),
            record_tokens=_flag(env, "SPECTRACE_RECORD_TOKENS"),
            inject_fault=env.get("SPECTRACE_INJECT_FAULT") or "",
            prometheus_port=_number(env, "SPECTRACE_PROMETHEUS_PORT", defaults["prometheus_port"], int),
            prometheus_host=env.get("SPECTRACE_PROMETHEUS_HOST") or defaults["prometheus_host"],
            metrics_dir=Path(env["SPECTRACE_METRICS_DIR"]) if env.get("SPECTRACE_METRICS_DIR") else None,
            max_mb=_number(env, "SPECTRACE_MAX_MB", defaults["max_mb"]),
            retention_s=_duration(env, "SPECTRACE_RETENTION", defaults["retention_s"]),
            compact_interval_s=_duration(env, "SPECTRACE_COMPACT_INTERVAL", defaults["compact_interval_s"]),
            host=env.get("SPECTRACE_HOST", "").strip() or socket.gethostname(),
            lake=env.get("SPECTRACE_LAKE", "").strip() or None,
            lake_data=env.get("SPECTRACE_LAKE_DATA", "").strip() or None,
        )
