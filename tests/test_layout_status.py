"""The Grafana layout status is the audit's verdict: on every layout case below (those of
tests/test_audit.py, through the worker's own call ``audit.audit_model_layout``), the layers the
panel marks MISMATCH are exactly the layers the ``LAYOUT_MISMATCH`` errors name — as a pure rule,
and through the exporter's series in a real Prometheus running the panel's own queries."""

from __future__ import annotations

import subprocess
import time

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource

from spectrace import audit
from spectrace.audit import codes
from spectrace.dashboards import promql
from spectrace.sinks.metrics import Metrics

S, F = "sliding_attention", "full_attention"
W = 2048
DFLASH = {"model_type": "qwen3", "architectures": ["DFlashDraftModel"], "num_hidden_layers": 5, "vocab_size": 151936}
DFLASH_RESOLVED = {**DFLASH, "use_sliding_window": False, "max_window_layers": 28}
MIXED = [S, S, S, S, F]
FLAGGED = {**DFLASH, "layer_types": MIXED, "sliding_window": W, "use_sliding_window": True}
GEMMA = {"model_type": "gemma3_text", "num_hidden_layers": 12, "sliding_window": 512, "sliding_window_pattern": 6}
GEMMA_TYPES = ([S] * 5 + [F]) * 2
HYBRID = {"model_type": "qwen3_next", "num_hidden_layers": 4, "layer_types": ["linear_attention"] * 3 + [F]}
SMALL_SLIDING_TARGET_WINDOW = {"model_type": "qwen3", "num_hidden_layers": 2, "sliding_window": 32}
SMALL_RESOLVED = {"model_type": "qwen3", "num_hidden_layers": 2, "sliding_window": None, "use_sliding_window": False,
                  "layer_types": [F, F]}  # fmt: skip


def _runs(*kinds):
    return [{"runtime_type": kind, "runtime_window": window} for kind, window in kinds]


# name: (role, declared, resolved, what runs, method, the statuses the audit gives)
CASES = {
    "window_only_runs_full": ("draft", {**DFLASH, "sliding_window": W}, {**DFLASH_RESOLVED, "layer_types": [F] * 5, "sliding_window": None},
                              _runs(*[("full", None)] * 5), None, ["explained"] * 5),
    "flagged_runs_as_declared": ("draft", FLAGGED, {**DFLASH_RESOLVED, **FLAGGED}, _runs(*[("sliding", W)] * 4, ("full", None)),
                                 None, ["match"] * 5),
    "flagged_runs_full": ("draft", FLAGGED, {**DFLASH_RESOLVED, **FLAGGED}, _runs(*[("full", None)] * 5), None,
                          ["MISMATCH"] * 4 + ["match"]),
    "pattern_derived_runs_it": ("target", GEMMA, {**GEMMA, "layer_types": GEMMA_TYPES},
                                _runs(*[("sliding", 512) if t == S else ("full", None) for t in GEMMA_TYPES]), None,
                                ["undeclared"] * 12),
    # no layer gets the declared window: the sliding ones differ from resolved, the full ones from config.json's window
    "pattern_derived_ignored": ("target", GEMMA, {**GEMMA, "layer_types": GEMMA_TYPES}, _runs(*[("full", None)] * 12), None,
                                ["MISMATCH"] * 12),
    "hybrid_as_declared": ("target", HYBRID, HYBRID, _runs(*[("linear", None)] * 3, ("full", None)), None, ["match"] * 4),
    "hybrid_linear_runs_full": ("target", HYBRID, HYBRID, _runs(("full", None), *[("linear", None)] * 2, ("full", None)), None,
                                ["MISMATCH", "match", "match", "match"]),
    "mtp_head_on_hybrid": ("draft", HYBRID, HYBRID, _runs(("full", None)), "mtp", ["undeclared"]),
    "draft_model_gets_the_window_back": ("draft", SMALL_SLIDING_TARGET_WINDOW, SMALL_RESOLVED, _runs(*[("sliding", 32)] * 2),
                                         "draft_model", ["explained"] * 2),
    "full_drafter_forced_onto_a_window": ("draft", SMALL_RESOLVED, SMALL_RESOLVED, _runs(*[("sliding", 32)] * 2),
                                          "draft_model", ["MISMATCH"] * 2),
}  # fmt: skip


def _judged(case):
    role, declared, resolved, layers, method, _ = CASES[case]
    plans, findings = audit.audit_model_layout(role, declared, resolved, layers, method=method)
    return role, plans, findings, audit.layout_status(plans, findings)


def _named(findings, severity):
    return {
        layer["layer_index"]
        for f in findings
        if f.code == codes.LAYOUT_MISMATCH and (f.severity == "error") == (severity == "error")
        for layer in f.evidence["layers"]
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_status_is_the_findings_verdict(case):
    _, plans, findings, status = _judged(case)
    assert status == CASES[case][-1]
    assert {i for i, s in enumerate(status) if s == "MISMATCH"} == _named(findings, "error")
    assert {i for i, s in enumerate(status) if s == "explained"} == _named(findings, "info") - _named(findings, "error")
    assert set(status) <= set(audit.LAYOUT_STATUSES)


def _exported_layer_series():
    """spectrace_attention_layer as the exporter writes it, one run per case (the worker's rows + status)."""
    reader = InMemoryMetricReader()
    metrics = Metrics([reader], Resource.create({}))
    for case in CASES:
        role, plans, _, status = _judged(case)
        rows = [{"model_role": role, **plan.as_row(), "process": "worker"} for plan in plans]
        metrics.layout([{**row, "status": s} for row, s in zip(rows, status)], {"run_id": case, "model": "m"})
    data = reader.get_metrics_data()
    points = [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "spectrace.attention.layer"
        for point in metric.data.data_points
    ]
    metrics.shutdown()
    return [dict(point.attributes) for point in points]


def test_the_exporter_writes_the_status_label():
    series = _exported_layer_series()
    assert len(series) == sum(len(CASES[c][-1]) for c in CASES)
    by_case = {}
    for labels in series:
        by_case.setdefault(labels["run_id"], {})[int(labels["layer_index"])] = labels["status"]
    assert {case: [by_case[case][i] for i in sorted(by_case[case])] for case in by_case} == {c: CASES[c][-1] for c in CASES}


@pytest.mark.usefixtures("prometheus_binaries")
def test_the_panels_queries_agree_with_the_findings_in_prometheus(tmp_path):
    from spectrace.testing.prometheus import PrometheusServer

    end = int(time.time()) - 5
    lines = ["# TYPE spectrace_attention_layer gauge"]
    for labels in _exported_layer_series():
        text = ",".join(f'{k}="{v}"' for k, v in {"job": "spectrace", "instance": "i:1", **labels}.items())
        lines += [f"spectrace_attention_layer{{{text}}} 1 {end - 15 * i}" for i in range(4)]
    (tmp_path / "layout.om").write_text("\n".join(lines + ["# EOF"]) + "\n")
    result = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(tmp_path / "layout.om"),
                             str(tmp_path / "prometheus" / "data")], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    with PrometheusServer(tmp_path / "prometheus", targets=[]) as prometheus:
        mismatched = prometheus.api("query", query=promql.layout_mismatches(), time=end)["result"]
        table = prometheus.api("query", query=promql.attention_layout(), time=end)["result"]
    panel = {(r["metric"]["run_id"], int(r["metric"]["layer_index"])) for r in mismatched}
    errors = {(case, i) for case in CASES for i in _named(_judged(case)[2], "error")}
    assert panel == errors and len(errors) == 4 + 12 + 1 + 2  # flagged, Gemma ignored, hybrid, forced window
    statuses = {(r["metric"]["run_id"], int(r["metric"]["layer_index"])): r["metric"]["status"] for r in table}
    assert statuses == {(case, i): s for case in CASES for i, s in enumerate(CASES[case][-1])}
