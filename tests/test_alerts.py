"""Alert rules: promtool checks and unit tests, a real Prometheus on backfilled history, and the named SQL twins.

No Grafana server can run here; the Grafana emission is checked for agreement
with the Prometheus one (same PromQL, thresholds, durations and text).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import spectrace.store
from spectrace.cli import main
from spectrace.dashboards import alerts, promql
from spectrace.dashboards.export import to_yaml
from spectrace.testing import store_pipeline
from spectrace.queries import named
from spectrace.testing.prometheus import PrometheusServer

PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
needs_promtool = pytest.mark.usefixtures("prometheus_binaries")
needs_prometheus = pytest.mark.usefixtures("prometheus_binaries")

DEPLOYMENT = {"job": "vllm", "model": "target-8b", "draft_model": "eagle3-8b", "method": "eagle3"}


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def _labels(**labels: str) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _cumulative(increments: list[float]) -> str:
    total, values = 0.0, []
    for inc in increments:
        values.append(total)
        total += inc
    values.append(total)
    return " ".join(f"{v:g}" for v in values)


def _render(template: str, labels: dict[str, str], value: str) -> str:
    """The Prometheus annotation template with labels and ``$value | humanizePercentage`` filled in."""
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], template)
    text = text.replace("{{ $value | humanizePercentage }}", value)
    assert "{{" not in text, text
    return text


def _expected_alert(rule: alerts.AlertRule, labels: dict[str, str], value: str) -> dict:
    return {
        "exp_labels": {"severity": rule.severity, **labels},
        "exp_annotations": {
            "summary": _render(rule.summary, labels, value),
            "description": _render(rule.description, labels, value),
        },
    }


def _run_unit_test(tmp_path: Path, profile: alerts.Profile, interval: str, series: list[dict], tests: list[dict]) -> None:
    (tmp_path / "rules.yaml").write_text(to_yaml(alerts.prometheus_rules(profile)))
    spec = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": profile.evaluation_interval,
        "tests": [{"interval": interval, "input_series": series, "alert_rule_test": tests}],
    }
    (tmp_path / "test.yaml").write_text(to_yaml(spec))
    result = _promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------- the definitions


@needs_promtool
@pytest.mark.parametrize("name", sorted(alerts.PROFILES))
def test_prometheus_rule_file_passes_promtool_check(tmp_path, name):
    path = tmp_path / "rules.yaml"
    path.write_text(to_yaml(alerts.prometheus_rules(name)))
    result = _promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    groups = alerts.prometheus_rules(name)["groups"]
    count = sum(len(group["rules"]) for group in groups)
    assert count >= 9  # 5 alerts, 4 recording rules at least
    assert f"SUCCESS: {count} rules found" in result.stdout  # promtool read every rule we wrote


@needs_promtool
def test_grafana_rule_queries_pass_promtool_check(tmp_path):
    group = alerts.grafana_rule_group(alerts.PRODUCTION, "prom-uid")
    rules = [{"record": f"spectrace_grafana_rule_{i}", "expr": r["data"][0]["model"]["expr"]} for i, r in enumerate(group["rules"])]
    path = tmp_path / "grafana-queries.yaml"
    path.write_text(to_yaml({"groups": [{"name": "grafana", "rules": rules}]}))
    result = _promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", sorted(alerts.PROFILES))
def test_grafana_and_prometheus_emissions_agree(name):
    p = alerts.profile(name)
    prom = {r["alert"]: r for r in alerts.prometheus_rules(p)["groups"][0]["rules"]}
    group = alerts.grafana_rule_group(p, "prom-uid")
    assert group["title"] == alerts.GROUP and group["folderUid"] == alerts.FOLDER_UID
    # Grafana evaluates on a 10 s tick: the test profile's 5 s becomes 10 s there
    assert group["interval"] == {"production": 60, "test": 10}[name] == alerts.grafana_interval(p)
    assert set(prom) == {r["title"] for r in group["rules"]} == {r.name for r in alerts.RULES}
    for g in group["rules"]:
        definition = alerts.rule(g["title"])
        query, reduce, threshold = g["data"]
        assert query["datasourceUid"] == "prom-uid" and query["model"]["instant"] is True
        assert query["model"]["datasource"] == {"type": "prometheus", "uid": "prom-uid"}
        # the Prometheus expr is exactly the Grafana query compared with the same threshold
        assert prom[g["title"]]["expr"] == f"{promql.paren(query['model']['expr'])} {definition.op} " + re.sub(
            r"\.0$", "", repr(float(threshold["model"]["conditions"][0]["evaluator"]["params"][0])))
        assert reduce["model"] == {"expression": "A", "reducer": "last", "refId": "B", "type": "reduce",
                                   "settings": {"mode": "dropNN"}, "datasource": {"type": "__expr__", "uid": "__expr__"}}
        assert threshold["model"]["conditions"][0]["evaluator"]["type"] == {"<": "lt", ">": "gt"}[definition.op]
        assert g["condition"] == "C" and g["noDataState"] == "OK" and g["execErrState"] == "Error"
        assert g["for"] == prom[g["title"]]["for"] == definition.for_duration(p)
        assert g["labels"] == prom[g["title"]]["labels"] == {"severity": definition.severity}
        assert len(g["uid"]) <= 40 and g["ruleGroup"] == alerts.GROUP and g["folderUID"] == alerts.FOLDER_UID
        for key in ("summary", "description"):
            assert g["annotations"][key] == prom[g["title"]]["annotations"][key].replace("$value ", "$values.B.Value ")
            assert "$value " not in g["annotations"][key]


def test_profiles_set_windows_durations_and_thresholds():
    prod, test = alerts.PRODUCTION, alerts.TEST
    rules = {r["alert"]: r for r in alerts.prometheus_rules(prod)["groups"][0]["rules"]}
    collapse = rules["SpectraceAcceptanceCollapse"]
    assert collapse["for"] == "5m" and collapse["expr"].endswith(") < 0.1")
    assert "* 300 >= 200" in collapse["expr"] and 'position="0"' in collapse["expr"]  # 200 tokens drafted in 5 m
    assert "[24h]" in rules["SpectraceAcceptanceDrop"]["expr"] and rules["SpectraceAcceptanceDrop"]["expr"].endswith("< 0.5")
    # the acceptance alerts read the recorded rates, and the recording rules' window is the profile's rate_window
    for name in ("SpectraceAcceptanceCollapse", "SpectraceAcceptanceDrop"):
        assert promql.RECORDED_ACCEPTED in rules[name]["expr"] and promql.ACCEPTED not in rules[name]["expr"]
    assert all("[5m]" in r["expr"] for r in alerts.prometheus_rules(prod)["groups"][1]["rules"][:2])
    short = {r["alert"]: r for r in alerts.prometheus_rules(test)["groups"][0]["rules"]}
    assert short["SpectraceAcceptanceCollapse"]["for"] == "10s" and "* 15 >= 20" in short["SpectraceAcceptanceCollapse"]["expr"]
    assert all("[15s]" in r["expr"] for r in alerts.prometheus_rules(test)["groups"][1]["rules"][:2])
    assert short["SpectraceConfigError"]["for"] == "0s"
    tuned = alerts.prometheus_rules(test.replace(collapse_threshold=0.25, min_drafted_tokens=5))
    assert tuned["groups"][0]["rules"][0]["expr"].endswith("< 0.25") and ">= 5" in tuned["groups"][0]["rules"][0]["expr"]
    with pytest.raises(ValueError):
        alerts.profile("staging")


def test_every_rule_names_its_cause_and_an_existing_named_query():
    for r in alerts.RULES:
        assert r.severity in ("critical", "warning")
        assert "Likely cause: " in r.description
        assert f"spectrace query --named {r.named_query}" in r.description
        assert r.named_query in named.names(), r.named_query
        for query in re.findall(r"spectrace query --named (\w+)", r.description):
            assert query in named.names()


def test_grafana_provisioning_file_shape():
    doc = alerts.grafana_provisioning(alerts.PRODUCTION, "prom-uid")
    assert doc["apiVersion"] == 1
    (group,) = doc["groups"]
    assert group["folder"] == alerts.FOLDER_TITLE and group["interval"] == "1m" and group["orgId"] == 1
    for r in group["rules"]:
        assert set(r) == {"uid", "title", "condition", "data", "noDataState", "execErrState", "for", "annotations",
                          "labels", "isPaused"}
        # provisioning files expand $VARS in labels (not annotations): labels must hold no "$"
        assert "$" not in json.dumps(r["labels"])
        assert r["data"][0]["relativeTimeRange"]["from"] >= 86400  # the 24 h baseline fits the query range


# --------------------------------------------------------------------------- promtool unit tests


def _acceptance_series(instance: str, phases: list[tuple[int, float, float]], drafted_per_step: float = 100) -> list[dict]:
    """Counters at positions 0 and 1 for phases of (steps, position-0 rate, position-1 rate)."""
    drafted, accepted = {0: [], 1: []}, {0: [], 1: []}
    for steps, rate0, rate1 in phases:
        for position, rate in ((0, rate0), (1, rate1)):
            drafted[position] += [drafted_per_step] * steps
            accepted[position] += [drafted_per_step * rate] * steps
    out = []
    for position in (0, 1):
        labels = dict(DEPLOYMENT, instance=instance, run_id="run-1", position=str(position), context_bucket="0-512")
        out.append({"series": promql.DRAFTED + _labels(**labels), "values": _cumulative(drafted[position])})
        out.append({"series": promql.ACCEPTED + _labels(**labels), "values": _cumulative(accepted[position])})
    return out


@needs_promtool
@pytest.mark.parametrize("name,interval", [("test", 5), ("production", 60)])
def test_collapse_alert_fires_after_for_and_resolves_on_recovery(tmp_path, name, interval):
    """healthy -> collapse -> recovery on one instance; a healthy and an idle instance never alert."""
    p = alerts.profile(name)
    window, hold = alerts.seconds(p.rate_window), alerts.seconds(p.collapse_for)
    healthy, collapsed, recovered = 20, 3 * (window + hold) // interval + 4, 20
    series = _acceptance_series("bad:8000", [(healthy, 0.7, 0.5), (collapsed, 0.02, 0.0), (recovered, 0.7, 0.5)])
    series += _acceptance_series("good:8000", [(healthy + collapsed + recovered, 0.7, 0.5)])
    series += _acceptance_series("idle:8000", [(healthy + collapsed + recovered, 0.0, 0.0)], drafted_per_step=1)
    rule = alerts.rule("SpectraceAcceptanceCollapse")
    start, end = healthy * interval, (healthy + collapsed) * interval
    firing = _expected_alert(rule, dict(DEPLOYMENT, instance="bad:8000"), "1%")  # lower of 2 % (position 0) and 1 % (overall)

    def at(seconds: int, *expected: dict) -> dict:
        return {"eval_time": f"{seconds}s", "alertname": rule.name, "exp_alerts": list(expected)}

    _run_unit_test(tmp_path, p, f"{interval}s", series, [
        at(start - interval),                      # healthy
        at(start + hold - interval),               # collapsed, but not for `for:` yet
        at(start + window + hold + 2 * interval, firing),
        at(end - interval, firing),                # still collapsed
        at(end + window + 2 * interval),           # recovered
    ])


def _finding(code: str, severity: str, values: str, role: str = "draft") -> dict:
    labels = dict(DEPLOYMENT, instance="a:8000", run_id="run-1", code=code, severity=severity, model_role=role)
    return {"series": promql.CONFIG_FINDING + _labels(**labels), "values": values}


@needs_promtool
def test_config_error_and_tap_mismatch_alerts(tmp_path):
    p = alerts.TEST
    # present from 10 s to 25 s, then gone (the exporter stops exporting it)
    series = [
        _finding("SWA_DROPPED", "error", "_ _ 1 1 1 1 stale"),
        _finding("TAP_MISMATCH", "error", "_ _ 1 1 1 1 stale"),
        _finding("METHOD_INFERRED", "warning", "1 1 1 1 1 1 1 1"),
    ]
    config, tap = alerts.rule("SpectraceConfigError"), alerts.rule("SpectraceTapMismatch")

    def labels(code):  # the finding's severity label gives way to the alert's
        return dict(DEPLOYMENT, instance="a:8000", run_id="run-1", code=code, model_role="draft")

    _run_unit_test(tmp_path, p, "5s", series, [
        {"eval_time": "5s", "alertname": config.name, "exp_alerts": []},
        {"eval_time": "15s", "alertname": config.name, "exp_alerts": [
            _expected_alert(config, labels("SWA_DROPPED"), ""), _expected_alert(config, labels("TAP_MISMATCH"), "")]},
        {"eval_time": "15s", "alertname": tap.name, "exp_alerts": [_expected_alert(tap, labels("TAP_MISMATCH"), "")]},
        {"eval_time": "40s", "alertname": config.name, "exp_alerts": []},
        {"eval_time": "40s", "alertname": tap.name, "exp_alerts": []},
    ])


@needs_promtool
def test_acceptance_alerts_hold_off_for_synthetic_acceptance(tmp_path):
    """An instance verifying with vLLM's synthetic sampler (its SYNTHETIC_ACCEPTANCE config finding present) does not
    alert on its drawn acceptance; the same collapse on an instance without the finding does (#58)."""
    p = alerts.TEST
    interval, window, hold = 5, alerts.seconds(p.rate_window), alerts.seconds(p.collapse_for)
    steps = 3 * (window + hold) // interval + 4
    series = _acceptance_series("synthetic:8000", [(steps, 0.02, 0.0)])
    series += _acceptance_series("real:8000", [(steps, 0.02, 0.0)])
    labels = dict(DEPLOYMENT, instance="synthetic:8000", run_id="run-1", code="SYNTHETIC_ACCEPTANCE",
                  severity="warning", model_role="draft")
    series.append({"series": promql.CONFIG_FINDING + _labels(**labels), "values": f"1+0x{steps}"})
    rule = alerts.rule("SpectraceAcceptanceCollapse")
    firing = _expected_alert(rule, dict(DEPLOYMENT, instance="real:8000"), "1%")
    _run_unit_test(tmp_path, p, f"{interval}s", series, [
        {"eval_time": f"{window + hold + 2 * interval}s", "alertname": rule.name, "exp_alerts": [firing]},
    ])
    assert "SYNTHETIC_ACCEPTANCE" in alerts.rule("SpectraceAcceptanceDrop").expr(p)


@needs_promtool
def test_a_synthetic_runs_measured_errors_are_no_config_error_alert_but_its_config_errors_are(tmp_path):
    def finding(gauge, code, instance):
        labels = dict(DEPLOYMENT, instance=instance, run_id="run-1", code=code, severity="error", model_role="draft")
        return {"series": gauge + _labels(**labels), "values": "1 1 1 1 1 1"}

    synthetic = dict(DEPLOYMENT, instance="synthetic:8000", run_id="run-1", code="SYNTHETIC_ACCEPTANCE",
                     severity="warning", model_role="draft")
    series = [{"series": promql.CONFIG_FINDING + _labels(**synthetic), "values": "1 1 1 1 1 1"},
              finding(promql.RUNTIME_FINDING, "ACCEPTANCE_COLLAPSE", "synthetic:8000"),
              finding(promql.CONFIG_FINDING, "SWA_DROPPED", "synthetic:8000"),
              finding(promql.RUNTIME_FINDING, "ACCEPTANCE_COLLAPSE", "real:8000")]
    config = alerts.rule("SpectraceConfigError")

    def labels(code, instance):
        return dict(DEPLOYMENT, instance=instance, run_id="run-1", code=code, model_role="draft")

    _run_unit_test(tmp_path, alerts.TEST, "5s", series, [{"eval_time": "15s", "alertname": config.name, "exp_alerts": [
        _expected_alert(config, labels("SWA_DROPPED", "synthetic:8000"), ""),
        _expected_alert(config, labels("ACCEPTANCE_COLLAPSE", "real:8000"), "")]}])


@needs_promtool
def test_acceptance_shifted_alert_fires_on_a_step_or_decay_until_restored_and_not_for_synthetic(tmp_path):
    """The time signatures (spectrace.audit.rules.drift) on the runtime gauge: present, the alert fires; cleared by
    ACCEPTANCE_RESTORED (the gauge's series goes), it resolves; a synthetic run's signature is no alert."""
    def signature(code, instance, values):
        labels = dict(DEPLOYMENT, instance=instance, run_id="run-1", code=code, severity="warning", model_role="draft")
        return {"series": promql.RUNTIME_FINDING + _labels(**labels), "values": values}

    synthetic = dict(DEPLOYMENT, instance="synthetic:8000", run_id="run-1", code="SYNTHETIC_ACCEPTANCE",
                     severity="warning", model_role="draft")
    series = [signature("ACCEPTANCE_STEP_CHANGE", "a:8000", "_ _ 1 1 1 1 stale"),
              signature("ACCEPTANCE_DECAY", "b:8000", "1 1 1 1 1 1 1 1 1 1"),
              signature("ACCEPTANCE_DECAY", "synthetic:8000", "1 1 1 1 1 1 1 1 1 1"),
              {"series": promql.CONFIG_FINDING + _labels(**synthetic), "values": "1 1 1 1 1 1 1 1 1 1"},
              signature("ACCEPTANCE_COLLAPSE", "c:8000", "1 1 1 1 1 1 1 1 1 1")]  # another alert's
    shifted = alerts.rule("SpectraceAcceptanceShifted")

    def labels(code, instance):
        return dict(DEPLOYMENT, instance=instance, run_id="run-1", code=code, model_role="draft")

    _run_unit_test(tmp_path, alerts.TEST, "5s", series, [
        {"eval_time": "5s", "alertname": shifted.name, "exp_alerts": [
            _expected_alert(shifted, labels("ACCEPTANCE_DECAY", "b:8000"), "")]},
        {"eval_time": "15s", "alertname": shifted.name, "exp_alerts": [
            _expected_alert(shifted, labels("ACCEPTANCE_STEP_CHANGE", "a:8000"), ""),
            _expected_alert(shifted, labels("ACCEPTANCE_DECAY", "b:8000"), "")]},
        {"eval_time": "40s", "alertname": shifted.name, "exp_alerts": [  # the step change restored
            _expected_alert(shifted, labels("ACCEPTANCE_DECAY", "b:8000"), "")]},
    ])


@needs_promtool
def test_a_tap_code_said_as_info_is_no_tap_alert(tmp_path):
    """TAP_CONVENTION info (who trained the drafter cannot be told) is said, not alerted on; its error is."""
    series = [_finding("TAP_CONVENTION", "info", "1 1 1 1 1 1")]
    tap = alerts.rule("SpectraceTapMismatch")
    _run_unit_test(tmp_path, alerts.TEST, "5s", series, [{"eval_time": "15s", "alertname": tap.name, "exp_alerts": []}])
    labels = dict(DEPLOYMENT, instance="a:8000", run_id="run-1", code="TAP_CONVENTION", model_role="draft")
    _run_unit_test(tmp_path, alerts.TEST, "5s", [_finding("TAP_CONVENTION", "error", "1 1 1 1 1 1")], [
        {"eval_time": "15s", "alertname": tap.name, "exp_alerts": [_expected_alert(tap, labels, "")]}])


@needs_promtool
def test_production_finding_alert_waits_for_its_for_duration(tmp_path):
    config = alerts.rule("SpectraceConfigError")
    labels = dict(DEPLOYMENT, instance="a:8000", run_id="run-1", code="SWA_DROPPED", model_role="target")
    _run_unit_test(tmp_path, alerts.PRODUCTION, "30s", [_finding("SWA_DROPPED", "error", "1+0x10", role="target")], [
        {"eval_time": "30s", "alertname": config.name, "exp_alerts": []},
        {"eval_time": "2m", "alertname": config.name, "exp_alerts": [_expected_alert(config, labels, "")]},
    ])


# --------------------------------------------------------------------------- real Prometheus, backfilled history


def _openmetrics(end: int, minutes: int, drop_minutes: int) -> str:
    """Two deployments on 1-minute samples; the first falls from 60 % to 20 % acceptance for the last minutes."""
    lines = []
    deployments = {"eagle3-8b": 0.2, "eagle3-8b-stable": 0.6}
    for family, metric in (("spectrace_verify_drafted_tokens", "drafted"), ("spectrace_verify_accepted_tokens", "accepted")):
        lines.append(f"# TYPE {family} counter")
        for drafter, late_rate in deployments.items():
            for position in (0, 1):
                labels = _labels(**dict(DEPLOYMENT, draft_model=drafter, instance="a:8000", run_id="run-1",
                                        position=str(position), context_bucket="0-512")).replace(", ", ",")
                total = 0.0
                for j in range(minutes, -1, -1):  # oldest first
                    ts = end - 60 * j
                    lines.append(f"{family}_total{labels} {total:g} {ts}")
                    rate = late_rate if j < drop_minutes else 0.6
                    total += 600 if metric == "drafted" else 600 * rate
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


@pytest.fixture
def backfilled_prometheus(tmp_path):
    """A real Prometheus over 26 h of backfilled history, evaluating the production rules (``for: 0s``) every second."""
    end = int(time.time()) - 20
    data = tmp_path / "history.om"
    data.write_text(_openmetrics(end, minutes=26 * 60, drop_minutes=30))
    workdir = tmp_path / "prometheus"
    result = _promtool("tsdb", "create-blocks-from", "openmetrics", str(data), str(workdir / "data"))
    assert result.returncode == 0, result.stdout + result.stderr
    profile = alerts.PRODUCTION.replace(evaluation_interval="1s", collapse_for="0s", drop_for="0s", finding_for="0s")
    document = alerts.prometheus_rules(profile)
    [recording] = [g for g in document["groups"] if g["name"] == f"{alerts.GROUP}-recording"]
    recording["interval"] = "1m"  # the history's resolution (live too: few samples beyond the backfilled ones)
    # the acceptance alerts read recorded series: backfill them over the history, as after loading new rules
    backfill = tmp_path / "recording.yaml"
    backfill.write_text(to_yaml({"groups": [recording]}))
    with PrometheusServer(workdir, targets=[], interval="1s") as raw:
        # under load the server can answer before it serves the backfilled blocks; promtool then
        # evaluates the rules over nothing and writes no block (exit 0): wait for the history first
        deadline = time.monotonic() + 60
        while not raw.api("query", query='count({__name__=~"spectrace_verify_.*_total"})', time=end)["result"]:
            assert time.monotonic() < deadline, "the backfilled history never became queryable"
            time.sleep(0.5)
        for _ in range(3):
            result = _promtool("tsdb", "create-blocks-from", "rules", f"--start={end - 26 * 3600}", f"--end={end}",
                               f"--url=http://127.0.0.1:{raw.port}", f"--output-dir={tmp_path / 'recorded'}", str(backfill))
            assert result.returncode == 0, result.stdout + result.stderr
            if (tmp_path / "recorded").is_dir() and any((tmp_path / "recorded").iterdir()):
                break
    assert (tmp_path / "recorded").is_dir(), "promtool wrote no recorded block: " + result.stdout + result.stderr
    for block in (tmp_path / "recorded").iterdir():
        shutil.move(str(block), str(workdir / "data" / block.name))
    rules = tmp_path / "rules.yaml"
    rules.write_text(to_yaml(document))
    with PrometheusServer(workdir, targets=[], rule_files=[rules], interval="1s") as prometheus:
        yield prometheus, end, profile


@needs_prometheus
def test_drop_rule_on_backfilled_24h_baseline(backfilled_prometheus):
    prometheus, end, profile = backfilled_prometheus
    drop = alerts.rule("SpectraceAcceptanceDrop")

    # the value: current (5 m) acceptance over the deployment's 24 h acceptance
    answer = prometheus.api("query", query=drop.value(profile), time=end)
    values = {r["metric"]["draft_model"]: float(r["value"][1]) for r in answer["result"]}
    baseline = (30 * 0.2 + 1410 * 0.6) / 1440  # 30 dropped minutes within the 24 h window
    assert values["eagle3-8b"] == pytest.approx(0.2 / baseline, abs=1e-3)
    assert values["eagle3-8b-stable"] == pytest.approx(1.0, abs=1e-9)
    # the alert expression keeps only the deployment below half of its baseline
    answer = prometheus.api("query", query=drop.expr(profile), time=end)
    assert [r["metric"]["draft_model"] for r in answer["result"]] == ["eagle3-8b"]
    # 20 % is above the collapse threshold: no collapse
    answer = prometheus.api("query", query=alerts.rule("SpectraceAcceptanceCollapse").expr(profile), time=end)
    assert answer["result"] == []

    # Prometheus' own evaluation of the rule file
    deadline = time.monotonic() + 20
    while True:
        groups = prometheus.api("rules")["groups"]
        states = {r["name"]: r for g in groups for r in g["rules"]}
        if states[drop.name]["state"] == "firing" or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert states[drop.name]["health"] == "ok" and states[drop.name]["state"] == "firing", states[drop.name]
    assert states["SpectraceAcceptanceCollapse"]["state"] == "inactive"
    (alert,) = states[drop.name]["alerts"]
    assert alert["labels"] == dict(DEPLOYMENT, instance="a:8000", severity="warning", alertname=drop.name)
    summary = re.fullmatch(r"Draft acceptance on a:8000 fell to ([\d.]+)% of its baseline", alert["annotations"]["summary"])
    # (the recorded baseline weighs the window's edge minutes a little differently: within 0.1 point)
    assert summary and float(summary.group(1)) == pytest.approx(100 * 0.2 / baseline, abs=0.1)
    assert "spectrace query --named acceptance_drop" in alert["annotations"]["description"]


# --------------------------------------------------------------------------- named SQL twins


@pytest.fixture
def store(tmp_path):
    """Runs of one deployment: two healthy, one collapsed, one dropped; findings for two runs."""
    writer = store_pipeline(tmp_path / "store", retention_s=0, compact_interval_s=0)
    base = 1_700_000_000_000_000_000
    hour = 3_600_000_000_000
    runs = {  # run -> (hours after base, drafted per position, rate at position 0, rate at position 1)
        "healthy-1": (0, 1000, 0.7, 0.5),
        "healthy-2": (2, 1000, 0.7, 0.5),
        "dropped": (4, 1000, 0.3, 0.1),
        "collapsed": (6, 500, 0.04, 0.0),
        "tiny": (7, 50, 0.0, 0.0),  # too few drafted tokens to judge
    }
    for run_id, (hours, drafted, rate0, rate1) in runs.items():
        writer.append("runs", {"run_id": run_id, "process_role": "frontend", "started_at": base + hours * hour,
                               "target_model": "target-8b", "draft_model": "eagle3-8b", "method": "eagle3",
                               "num_speculative_tokens": 2})
        for position, rate in ((0, rate0), (1, rate1)):
            for bucket, share in (("0-512", 0.5), ("512-1k", 0.5)):
                writer.append("verify_counts", {"run_id": run_id, "source": "engine_core", "position": position,
                                                "context_bucket": bucket, "drafted": int(drafted * share),
                                                "accepted": int(drafted * share * rate)})
                # worker counts are not engine-core counts: the views ignore them
                writer.append("verify_counts", {"run_id": run_id, "source": "worker", "position": position,
                                                "context_bucket": bucket, "drafted": 99999, "accepted": 0})
    writer.append("findings", {"run_id": "collapsed", "code": "ACCEPTANCE_COLLAPSE", "severity": "error", "message": "collapse"})
    writer.append("findings", {"run_id": "dropped", "code": "SWA_DROPPED", "severity": "error", "model_role": "draft",
                               "message": "sliding window dropped", "fix": "set use_sliding_window"})
    writer.append("findings", {"run_id": "dropped", "code": "TAP_MISMATCH", "severity": "error", "message": "taps"})
    writer.append("findings", {"run_id": "healthy-1", "code": "METHOD_INFERRED", "severity": "info", "message": "m"})
    # a benchmark run on vLLM's synthetic sampler: its drawn 3 % is neither a collapse nor a drop, nor a baseline
    writer.append("runs", {"run_id": "synthetic", "process_role": "frontend", "started_at": base + 3 * hour,
                           "target_model": "target-8b", "draft_model": "eagle3-8b", "method": "eagle3",
                           "num_speculative_tokens": 2})
    for position in (0, 1):
        writer.append("verify_counts", {"run_id": "synthetic", "source": "engine_core", "position": position,
                                        "context_bucket": "0-512", "drafted": 1000, "accepted": 30})
    writer.append("findings", {"run_id": "synthetic", "code": "SYNTHETIC_ACCEPTANCE", "severity": "warning",
                               "message": "synthetic"})
    writer.flush()
    return tmp_path / "store"


def _named(store: Path, name: str) -> list[dict]:
    con = spectrace.store.open(store)
    result = con.execute(named.load(name))
    columns = [d[0] for d in result.description]
    return [dict(zip(columns, row)) for row in result.fetchall()]


def test_named_acceptance_collapse(store):
    rows = _named(store, "acceptance_collapse")
    assert [(r["run_id"], r["position_0_rate"], r["overall_rate"], r["collapse_findings"]) for r in rows] == [
        ("collapsed", 0.04, 0.02, 1)]
    assert rows[0]["drafted"] == 1000 and rows[0]["draft_model"] == "eagle3-8b" and rows[0]["k"] == 2


def test_named_acceptance_drop(store):
    rows = _named(store, "acceptance_drop")
    # "dropped" (20 %) against healthy-1 and healthy-2 (60 %); "collapsed" against the three before it
    assert [(r["run_id"], r["rate"], r["baseline_rate"], r["baseline_runs"]) for r in rows] == [
        ("dropped", 0.2, 0.6, 2), ("collapsed", 0.02, round(2800 / 6000, 4), 3)]


def test_named_config_errors_and_tap_mismatch(store):
    errors = _named(store, "config_errors")
    assert sorted((r["run_id"], r["code"]) for r in errors) == [
        ("collapsed", "ACCEPTANCE_COLLAPSE"), ("dropped", "SWA_DROPPED"), ("dropped", "TAP_MISMATCH")]
    swa = next(r for r in errors if r["code"] == "SWA_DROPPED")
    assert swa["fix"] == "set use_sliding_window" and swa["target_model"] == "target-8b" and swa["model_role"] == "draft"
    assert [(r["run_id"], r["code"]) for r in _named(store, "tap_mismatch")] == [("dropped", "TAP_MISMATCH")]


def test_named_acceptance_by_position(store):
    rows = _named(store, "acceptance_by_position")
    assert [(r["run_id"], r["position"], r["drafted"], r["rate"]) for r in rows][:4] == [
        ("healthy-1", 0, 1000, 0.7), ("healthy-1", 1, 1000, 0.5), ("healthy-2", 0, 1000, 0.7), ("healthy-2", 1, 1000, 0.5)]
    assert len(rows) == 12  # the synthetic run too: its numbers are shown, only the alerts leave it out


def test_named_queries_run_from_the_cli(store, capsys):
    for name in ("acceptance_collapse", "acceptance_drop", "config_errors", "tap_mismatch", "acceptance_by_position"):
        assert main(["query", "--named", name, "--dir", str(store), "--format", "json"]) == 0
        json.loads(capsys.readouterr().out)
