"""Recording rules: per-instance rates, acceptance over replicas per position and context bucket (promtool test rules)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from spectrace.dashboards import alerts, build, promql
from spectrace.dashboards.export import files, ExportOptions, to_yaml

pytestmark = [pytest.mark.server, pytest.mark.usefixtures("prometheus_binaries")]

COMMON = 'job="vllm", model="t", draft_model="d", method="draft_model", model_name="t", run_id="r", otel_scope_name="spectrace"'


def _series(metric, instance, pid, engine, position, bucket, per_minute):
    labels = f'{COMMON}, instance="{instance}", pid="{pid}", engine="{engine}", position="{position}", context_bucket="{bucket}"'
    return {"series": f"{metric}{{{labels}}}", "values": f"0+{per_minute}x10"}


def test_recording_rules_pre_aggregate_over_pids_and_replicas(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(to_yaml(alerts.prometheus_rules("production")))
    # two replicas; replica a runs two engine-core processes (DP=2, pids 1 and 2)
    series = [
        _series(promql.DRAFTED, "a:8000", 1, 0, 0, "0-512", 600), _series(promql.ACCEPTED, "a:8000", 1, 0, 0, "0-512", 300),
        _series(promql.DRAFTED, "a:8000", 2, 1, 0, "0-512", 600), _series(promql.ACCEPTED, "a:8000", 2, 1, 0, "0-512", 60),
        _series(promql.DRAFTED, "b:8000", 3, 0, 0, "1k-2k", 1200), _series(promql.ACCEPTED, "b:8000", 3, 0, 0, "1k-2k", 0),
        _series(promql.DRAFTED, "b:8000", 3, 0, 1, "1k-2k", 1200), _series(promql.ACCEPTED, "b:8000", 3, 0, 1, "1k-2k", 600),
    ]
    fleet = 'job="vllm", model="t", draft_model="d", method="draft_model", model_name="t"'
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [
                {"expr": f'{promql.RECORDED_DRAFTED}{{instance="a:8000", engine="1"}}', "eval_time": "8m",
                 "exp_samples": [{"labels": f'{promql.RECORDED_DRAFTED}{{{fleet}, instance="a:8000", engine="1", run_id="r", position="0", context_bucket="0-512"}}', "value": 10}]},
                # position 0 over both replicas and all processes: (300 + 60 + 0) / (600 + 600 + 1200)
                {"expr": f'{promql.FLEET_BY_POSITION}{{position="0"}}', "eval_time": "8m",
                 "exp_samples": [{"labels": f'{promql.FLEET_BY_POSITION}{{{fleet}, position="0"}}', "value": 0.15}]},
                {"expr": f'{promql.FLEET_BY_CONTEXT}', "eval_time": "8m",
                 "exp_samples": [
                     {"labels": f'{promql.FLEET_BY_CONTEXT}{{{fleet}, context_bucket="0-512"}}', "value": 0.3},
                     {"labels": f'{promql.FLEET_BY_CONTEXT}{{{fleet}, context_bucket="1k-2k"}}', "value": 0.25},
                 ]},
            ],
        }],
    }
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(test))
    result = subprocess.run([shutil.which("promtool"), "test", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboards_read_the_recorded_series():
    exprs = [t["expr"] for d in build.dashboards().values() for p in d["panels"] for t in p.get("targets", [])]
    assert any(promql.RECORDED_ACCEPTED in e for e in exprs) and any(promql.RECORDED_DRAFTED in e for e in exprs)


def test_kubernetes_manifests_shape():
    tree = files(ExportOptions())
    monitor = yaml.safe_load(tree["kubernetes/podmonitor.yaml"])
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "PodMonitor"
    serving, headless = monitor["spec"]["podMetricsEndpoints"]  # vLLM's /metrics; a headless node's own endpoint
    assert (serving["port"], headless["port"]) == ("http", "spectrace") and monitor["spec"]["selector"]["matchLabels"]
    assert serving["path"] == headless["path"] == "/metrics"
    rule = yaml.safe_load(tree["kubernetes/prometheusrule.yaml"])
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["metadata"]["name"] and rule["spec"] == alerts.prometheus_rules(alerts.PRODUCTION)
    names = {g["name"] for g in rule["spec"]["groups"]}
    assert names == {alerts.GROUP, f"{alerts.GROUP}-recording"}
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            assert ("record" in r) != ("alert" in r) and r["expr"]
