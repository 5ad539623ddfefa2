"""Each setting's range, checked where settings.py reads it (pure: no vLLM)."""

from __future__ import annotations

import logging

import pytest

from spectrace.settings import EXPORTERS, Settings, SettingsError, duration

DEFAULT = Settings.from_env({})

# variable, a value out of its range (or unparsable), the field that keeps its default
REFUSED = [
    ("SPECTRACE_FLUSH_INTERVAL", v, "flush_interval_s") for v in ("0", "-1", "nan", "inf", "soon", "2d")
] + [
    ("SPECTRACE_RETENTION", "-5d", "retention_s"),
    ("SPECTRACE_MAX_MB", "-1", "max_mb"),
    ("SPECTRACE_STEP_SAMPLE", "2", "step_sample"),
    ("SPECTRACE_COLLAPSE_THRESHOLD", "2", "collapse_threshold"),
    ("SPECTRACE_COLLAPSE_THRESHOLD", "-0.1", "collapse_threshold"),
    ("SPECTRACE_MAX_BUFFER_ROWS", "0", "max_buffer_rows"),
    ("SPECTRACE_SPAN_EVERY", "-5", "span_every_steps"),
    ("SPECTRACE_COMPACT_INTERVAL", "-60", "compact_interval_s"),
    ("SPECTRACE_COLLAPSE_WINDOW", "0", "collapse_window_tokens"),
    ("SPECTRACE_COLLAPSE_MIN_TOKENS", "0", "collapse_min_tokens"),
    ("SPECTRACE_PROMETHEUS_PORT", "99999", "prometheus_port"),
    ("SPECTRACE_PROMETHEUS_PORT", "-1", "prometheus_port"),
    ("SPECTRACE_RUN_ID", "a/..", "run_id"),
    ("SPECTRACE_RUN_ID", "..", "run_id"),
    ("SPECTRACE_RUN_ID", "x" * 129, "run_id"),
    ("SPECTRACE_HOST", "a/b", "host"),
    ("SPECTRACE_HOST", "a\\b", "host"),
    ("SPECTRACE_HOST", "a\0b", "host"),
    ("SPECTRACE_EXPORTER", "nosuch", "exporters"),
    ("SPECTRACE_PIPELINE", "fork", "pipeline"),
    ("SPECTRACE_SHIP_INTERVAL", "0", "ship_interval_s"),
    ("SPECTRACE_SHIP_INTERVAL", "2m", "ship_interval_s"),
]


@pytest.mark.parametrize("name, value, field", REFUSED)
def test_out_of_range_is_one_line_and_the_default(name, value, field, caplog):
    with caplog.at_level(logging.WARNING, logger="vllm.spectrace"):
        settings = Settings.from_env({name: value})
    assert getattr(settings, field) == getattr(DEFAULT, field)
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"spectrace: {name}={value!r} ") and "; using " in line
    with pytest.raises(SettingsError) as raised:
        Settings.from_env({name: value}, strict=True)
    assert len(raised.value.problems) == 1 and "using" not in str(raised.value)


@pytest.mark.parametrize(
    "name, value, field, expected",
    [
        ("SPECTRACE_RETENTION", "0", "retention_s", 0.0),  # 0 keeps its meaning: off
        ("SPECTRACE_MAX_MB", "0", "max_mb", 0.0),
        ("SPECTRACE_COMPACT_INTERVAL", "0", "compact_interval_s", 0.0),
        ("SPECTRACE_SPAN_EVERY", "0", "span_every_steps", 0),
        ("SPECTRACE_FLUSH_INTERVAL", "0.5", "flush_interval_s", 0.5),
        ("SPECTRACE_FLUSH_INTERVAL", "2m", "flush_interval_s", 120.0),
        ("SPECTRACE_STEP_SAMPLE", "0", "step_sample", 0.0),
        ("SPECTRACE_STEP_SAMPLE", "1", "step_sample", 1.0),
        ("SPECTRACE_PROMETHEUS_PORT", "0", "prometheus_port", 0),
        ("SPECTRACE_PROMETHEUS_PORT", "65535", "prometheus_port", 65535),
        ("SPECTRACE_RUN_ID", "exp-1.a", "run_id", "exp-1.a"),
        ("SPECTRACE_EXPORTER", "lake, otlp", "exporters", ("lake", "otlp")),
    ],
)
def test_in_range_is_taken(name, value, field, expected):
    assert getattr(Settings.from_env({name: value}, strict=True), field) == expected


def test_strict_lists_every_problem():
    with pytest.raises(SettingsError) as raised:
        Settings.from_env({"SPECTRACE_MAX_MB": "-1", "SPECTRACE_HOST": ".."}, strict=True)
    assert [p.split("=")[0] for p in raised.value.problems] == ["SPECTRACE_MAX_MB", "SPECTRACE_HOST"]


def test_unknown_sink_is_left_out():
    assert Settings.from_env({"SPECTRACE_EXPORTER": "duckdb,foo"}).exporters == ("duckdb",)
    assert EXPORTERS == ("duckdb", "otlp", "prometheus", "lake")


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("15m", 900), ("12h", 43200), ("7d", 604800), ("2w", 1209600), ("2.5", 2.5), (" 1H ", 3600)])
def test_duration(text, seconds):
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["", "nan", "inf", "1e3", "5x", "d"])
def test_not_a_duration(text):
    with pytest.raises(ValueError, match="is not a duration"):
        duration(text)


def test_only_settings_reads_spectrace_variables():
    """No module but settings.py reads a SPECTRACE* variable from the environment; writes for the
    processes vLLM starts (propagation) are allowed where listed."""
    import re
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "spectrace"
    read = re.compile(r"""(os\.environ\.get|os\.getenv|os\.environ\[)\(?\s*["'](SPECTRACE\w*)""")
    writes = {("exporters/exposition.py", "DIR_ENV"), ("recorder/runtime.py", "ACTIVE_RUN_ENV")}
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel == "settings.py":
            continue
        for line in path.read_text().splitlines():
            if read.search(line) and "=" not in line.split("]", 1)[-1][:3]:
                found.append((rel, line.strip()))
            for name in re.findall(r"os\.environ\.get\((\w+_ENV)\)", line):
                if (rel, name) not in writes:
                    found.append((rel, line.strip()))
    assert found == []


def test_the_sink_registry_is_the_settings_list_of_exporters():
    from spectrace.settings import EXPORTERS
    from spectrace.sinks import SINKS

    assert set(SINKS) == set(EXPORTERS)
