"""What a traced process writes for /metrics (issue #57): real Metrics, ExpositionSink and FileCollector, real
prometheus_client; no vLLM. tests/test_quickstart_live.py reads the same off a real server's /metrics."""

from __future__ import annotations

import re

from opentelemetry.sdk.resources import Resource
from prometheus_client.parser import text_string_to_metric_families

from spectrace.audit import codes
from spectrace.sinks import exposition, metrics


def _page(tmp_path, monkeypatch, feed) -> str:
    monkeypatch.setattr(exposition, "_dir", None)
    monkeypatch.delenv(exposition.DIR_ENV, raising=False)
    sink = exposition.ExpositionSink(tmp_path / "metrics")
    m = metrics.Metrics([sink.metric_reader()], Resource.create({}))
    try:
        feed(m, metrics.common_labels({"target_model": "t", "draft_model": "d", "method": "eagle3"}, "run-1"))
        sink.export(None)
        # and through the collector that serves them beside vLLM's, while the file's process lives
        collected = [s.labels for f in exposition.FileCollector(tmp_path / "metrics").collect() for s in f.samples]
        assert collected and not any(k.startswith("otel_scope") for labels in collected for k in labels)
        return sink.file.path.read_text()
    finally:
        sink.close()
        m.provider.shutdown()


def _findings(text: str) -> dict[str, set[tuple[str, str]]]:
    out: dict[str, set[tuple[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_finding") and s.value == 1:
                out.setdefault(s.name, set()).add((s.labels["code"], s.labels["severity"]))
    return out


def test_series_carry_no_empty_scope_labels_and_runtime_findings_have_their_own_name(tmp_path, monkeypatch):
    def feed(m, labels):
        m.finding(codes.SWA_DROPPED, "error", "draft", labels)
        m.finding(codes.ACCEPTANCE_COLLAPSE, "error", "draft", labels)
        m.finding(codes.SPECULATION_NOT_PAYING, "warning", None, labels)
        m.verify_counts([{"position": 0, "context_bucket": "0-512", "drafted": 4, "accepted": 3}], labels)
        m.dropped.add(1)

    text = _page(tmp_path, monkeypatch, feed)
    assert "otel_scope" not in text, text
    assert _findings(text) == {
        "spectrace_config_finding": {("SWA_DROPPED", "error")},
        "spectrace_runtime_finding": {("ACCEPTANCE_COLLAPSE", "error"), ("SPECULATION_NOT_PAYING", "warning")},
    }
    series = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert series and max(map(len, series)) < 250, max(series, key=len)


def test_a_recovered_collapse_leaves_the_runtime_series(tmp_path, monkeypatch):
    def feed(m, labels):
        m.finding(codes.ACCEPTANCE_COLLAPSE, "error", "draft", labels)
        m.finding(codes.ACCEPTANCE_COLLAPSE, "error", "draft", labels, present=False)
        m.finding(codes.TAP_MISMATCH, "error", "draft", labels)

    assert _findings(_page(tmp_path, monkeypatch, feed)) == {"spectrace_config_finding": {("TAP_MISMATCH", "error")}}


def test_every_help_text_stands_alone(tmp_path, monkeypatch):
    """Every instrument's help says what it counts without pointing elsewhere (no "(README)", no "see ...")."""
    from tools.docs_reference import _exercise

    helps = re.findall(r"^# HELP (\S+) (.*)$", _page(tmp_path, monkeypatch, lambda m, labels: _exercise(m)), re.M)
    assert len(helps) >= 20
    for name, text in helps:
        assert "README" not in text and not re.search(r"\bsee\b", text, re.I) and len(text.split()) >= 3, (name, text)
