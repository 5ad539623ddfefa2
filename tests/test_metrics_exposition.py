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
    # set, then deleted: monkeypatch records the variable's absence and restores it (delenv alone, the variable
    # absent, records nothing: server_dir's value leaked into the xdist worker and every later engine it started)
    monkeypatch.setenv(exposition.DIR_ENV, "")
    monkeypatch.delenv(exposition.DIR_ENV)
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


def test_a_flush_rewrites_the_exposition_file_before_the_store_writes_its_segments(tmp_path, monkeypatch):
    """/metrics never waits on the store's durable writes: the exposition sink gets each batch before the store (a
    worker's first flush with records once stalled 12-13 s in the store's fsync on a loaded host, and its speed-up
    estimate, computed in that flush's drain, reached the page as much later)."""
    from spectrace.pipeline import Pipeline
    from spectrace.settings import Settings
    from spectrace.sinks import build
    from spectrace import files

    monkeypatch.setattr(exposition, "_dir", None)
    # set, then deleted: monkeypatch records the variable's absence and restores it (delenv alone, the variable
    # absent, records nothing: server_dir's value leaked into the xdist worker and every later engine it started)
    monkeypatch.setenv(exposition.DIR_ENV, "")
    monkeypatch.delenv(exposition.DIR_ENV)
    pipeline, _ = build(Settings(dir=tmp_path / "store", metrics_dir=tmp_path / "metrics",
                                 exporters=("duckdb", "prometheus")))
    assert isinstance(pipeline, Pipeline)
    sink = pipeline.sink("prometheus")
    m = metrics.Metrics([sink.metric_reader()], Resource.create({}))
    on_the_page_at_store_writes = []
    durably = files.write_durably

    def store_write(*args, **kwargs):  # what /metrics serves while the store writes this flush's segments
        on_the_page_at_store_writes.append(sink.file.path.exists()
                                           and "spectrace_speculation_speedup_estimate" in sink.file.path.read_text())
        return durably(*args, **kwargs)

    monkeypatch.setattr(files, "write_durably", store_write)
    try:
        m.speedup_estimate(0.56, 0, metrics.common_labels({}, "run-1"))  # as the drain sets it, before the sinks
        pipeline.append("runs", {"run_id": "run-1"})
        pipeline.flush(periodic=True)  # the flush thread's (the exposition's first write is never held back)
        assert on_the_page_at_store_writes and all(on_the_page_at_store_writes)
        assert [s.name for s in pipeline.sinks].index("prometheus") < [s.name for s in pipeline.sinks].index("duckdb")
    finally:
        pipeline.close()
        m.provider.shutdown()
