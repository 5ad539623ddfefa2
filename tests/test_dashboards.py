"""Dashboards: drift against the committed JSON, structure, every panel query through promtool,
`spectrace dashboards export`, and `spectrace dashboards push` against a stand-in for Grafana's HTTP API.

No Grafana server can be installed here. ``FakeGrafana`` below is NOT Grafana: it is a
loopback http.server that implements the handful of Grafana API endpoints push uses,
checks every request's path, auth header and body the way Grafana 11 documents them,
and records what it was sent.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import spectrace.dashboards
from spectrace.cli import main
from spectrace.dashboards import alerts, build
from spectrace.dashboards.export import to_yaml

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.usefixtures("prometheus_binaries")

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Grafana unit ids the dashboards may use (plus "suffix:<text>" custom units).
UNITS = {"percentunit", "percent", "none", "short", "s", "ms", "reqps", "ops"}
PANEL_TYPES = {"row", "stat", "timeseries", "heatmap", "table", "state-timeline", "alertlist"}
NO_QUERY_TYPES = {"row", "alertlist"}
MACROS = {"__rate_interval", "__interval", "__range"}


def _panels(document):
    for panel in document["panels"]:
        yield panel
        yield from panel.get("panels", [])


# --------------------------------------------------------------------------- generated JSON


def test_committed_files_match_the_generator():
    """Fails on drift: run `python -m spectrace.dashboards.build` and commit the result."""
    for name, text in build.generated_files().items():
        path = build.GENERATED / name
        assert path.exists(), f"{name} missing: run python -m spectrace.dashboards.build"
        assert path.read_text() == text, f"{name} is stale: run python -m spectrace.dashboards.build"
    assert build.main(["--check"]) == 0


@pytest.mark.parametrize("name", sorted(build.DASHBOARDS))
def test_dashboard_structure(name):
    document = json.loads((build.GENERATED / name).read_text())
    assert document["uid"] in (build.ACCEPTANCE_UID, build.CONFIGURATION_UID)
    assert document["title"].startswith("Speculative decoding — ")
    assert set(build.TAGS) <= set(document["tags"])

    variables = {v["name"]: v for v in document["templating"]["list"]}
    assert list(variables) == ["datasource", "model", "draft_model", "instance", "run"]
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for var in ("model", "draft_model", "instance", "run"):
        v = variables[var]
        assert v["type"] == "query" and v["datasource"] == DATASOURCE
        assert v["query"].startswith("label_values(spectrace_run_info") and v["includeAll"] and v["allValue"] == ".*"

    panels = list(_panels(document))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) and i > 0 for i in ids), ids
    titles = [p["title"] for p in panels if p["type"] != "row"]
    assert len(titles) == len(set(titles)), titles
    for panel in panels:
        assert panel["type"] in PANEL_TYPES, panel["type"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        if panel["type"] in NO_QUERY_TYPES:
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel.get("description"), f"{panel['title']}: an SRE needs to know what the panel shows"
        targets = panel["targets"]
        refs = [t["refId"] for t in targets]
        assert targets and all(refs) and len(refs) == len(set(refs)), panel["title"]
        for target in targets:
            assert target["datasource"] == DATASOURCE and target["expr"].strip()
            for var in re.findall(r"\$\{?(\w+)", target["expr"]):
                assert var in variables or var in MACROS, f"{panel['title']}: unknown ${var}"
            assert "spectrace_" in target["expr"] or "spectrace:" in target["expr"] or "ALERTS" in target["expr"]
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if unit is not None:
            assert unit in UNITS or unit.startswith("suffix:"), f"{panel['title']}: unit {unit!r}"
        for override in panel.get("fieldConfig", {}).get("overrides", []):
            for prop in override["properties"]:
                if prop["id"] == "unit":
                    assert prop["value"] in UNITS


def test_acceptance_dashboard_reads_like_an_sre_wants():
    document = json.loads((build.GENERATED / build.ACCEPTANCE_FILE).read_text())
    panels = {p["title"]: p for p in _panels(document)}
    threshold = alerts.PRODUCTION.collapse_threshold
    by_position = panels["Acceptance rate by position"]
    defaults = by_position["fieldConfig"]["defaults"]
    assert defaults["unit"] == "percentunit" and defaults["min"] == 0 and defaults["max"] == 1
    # red below the collapse threshold, drawn as a band
    assert defaults["thresholds"]["steps"] == [{"value": None, "color": "red"}, {"value": threshold, "color": "transparent"}]
    assert defaults["custom"]["thresholdsStyle"]["mode"] == "dashed+area"
    assert by_position["targets"][0]["legendFormat"] == "position {{position}}"
    assert 'sum by (position)' in by_position["targets"][0]["expr"]
    assert panels["Acceptance heatmap: position × time"]["type"] == "heatmap"
    matrix = panels["Acceptance by context bucket × position"]
    assert matrix["type"] == "table" and "context_bucket, position" in matrix["targets"][0]["expr"]
    order = next(t for t in matrix["transformations"] if t["id"] == "organize")["options"]["indexByName"]
    assert list(order)[1:] == ["0-512", "512-1k", "1k-2k", "2k-4k", "4k-8k", "8k-16k", "16k+"]
    assert "spectrace_verify_acceptance_length_sum" in panels["Mean acceptance length over time"]["targets"][0]["expr"]
    rates = [t["expr"] for t in panels["Drafted and accepted tokens"]["targets"]]
    assert any("drafted_tokens_total" in e for e in rates) and any("accepted_tokens_total" in e for e in rates)
    assert "by (rank)" in panels["Acceptance by worker rank"]["targets"][0]["expr"]
    assert "by (instance)" in panels["Acceptance by instance"]["targets"][0]["expr"]
    assert 'ALERTS{alertname="SpectraceAcceptanceCollapse"' in panels["Collapse alert"]["targets"][0]["expr"]
    switches = panels["k switches (dynamic speculation)"]
    assert "spectrace_step_shapes_k_switches_total" in switches["targets"][0]["expr"]
    assert switches["fieldConfig"]["defaults"]["unit"] == "percentunit" and "DYNAMIC_K_THRASHING" in switches["description"]
    assert "sum by (k)" in panels["Verified steps by k"]["targets"][0]["expr"]
    assert 'alertname="SpectraceAcceptanceCollapse"' in panels["Acceptance alert state"]["targets"][0]["expr"]
    for title in ("Acceptance rate", "Position-0 acceptance"):
        steps = panels[title]["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert steps[0]["color"] == "red" and steps[1]["value"] == threshold


def test_configuration_dashboard_highlights_misconfiguration():
    document = json.loads((build.GENERATED / build.CONFIGURATION_FILE).read_text())
    panels = {p["title"]: p for p in _panels(document)}
    errors = panels["Error findings"]
    assert errors["fieldConfig"]["defaults"]["thresholds"]["steps"] == [{"value": None, "color": "green"}, {"value": 1, "color": "red"}]
    assert 'severity="error"' in errors["targets"][0]["expr"]
    findings = panels["Current findings"]
    assert "severity, code" in findings["targets"][0]["expr"] and findings["targets"][0]["format"] == "table"
    severity = next(o for o in findings["fieldConfig"]["overrides"] if o["matcher"]["options"] == "severity")
    mapping = next(p for p in severity["properties"] if p["id"] == "mappings")["value"][0]["options"]
    assert mapping["error"]["color"] == "red"
    for role in ("Target", "Drafter"):
        layout = panels[f"{role} attention layout: declared vs runtime"]
        assert "declared_type, runtime_type, runtime_window, status" in layout["targets"][0]["expr"]
        status = next(o for o in layout["fieldConfig"]["overrides"] if o["matcher"]["options"] == "status")
        assert next(p for p in status["properties"] if p["id"] == "mappings")["value"][0]["options"]["MISMATCH"]["color"] == "red"
    assert 'model_role="draft"' in panels["Drafter attention layout: declared vs runtime"]["targets"][0]["expr"]
    assert "expected_id, tapped_id" in panels["Tap audit: declared vs tapped"]["targets"][0]["expr"]
    info = panels["Method, k and versions"]["targets"][0]["expr"]
    for label in ("method", "num_speculative_tokens", "vllm_version", "spectrace_version"):
        assert label in info


# --------------------------------------------------------------------------- PromQL through promtool


def test_panel_queries_cover_every_target_and_substitute_macros():
    queries = spectrace.dashboards.panel_queries("30s", scrape_interval="10s", time_range="6h", variables={"model": "m1"})
    targets = sum(1 for doc in build.dashboards().values() for _ in build.panel_targets(doc))
    assert len(queries) == targets + 1  # + the collapse annotation
    for dashboard, panel, expr in queries:
        assert "$" not in expr, (dashboard, panel, expr)
    assert any("[40s]" in e for _, _, e in queries)  # $__rate_interval = max(30s + 10s, 4 × 10s)
    assert any("[6h]" in e for _, _, e in queries) and any('model=~"m1"' in e for _, _, e in queries)
    assert build.MAY_BE_EMPTY <= {panel for _, panel, _ in queries}


@needs_promtool
@pytest.mark.parametrize("step,scrape", [("15s", "15s"), ("5m", "30s")])
def test_every_panel_query_passes_promtool(tmp_path, step, scrape):
    rules = [{"record": f"spectrace_panel_query_{i}", "expr": expr}
             for i, (_, _, expr) in enumerate(build.panel_queries(step, scrape_interval=scrape))]
    path = tmp_path / "panels.yaml"
    path.write_text(to_yaml({"groups": [{"name": "panels", "rules": rules}]}))
    result = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def _contract_openmetrics(end: int, points: int = 120, every: int = 15) -> str:
    """Every series of the metrics contract for one deployment, ``points`` samples ``every`` s up to ``end``."""
    common = {"job": "spectrace", "instance": "127.0.0.1:9464", "model": "target-8b", "draft_model": "eagle3-8b",
              "method": "eagle3", "run_id": "run-1"}
    families: dict[str, tuple[str, list[tuple[dict, float, float]]]] = {}  # name -> (type, [(labels, start, slope)])

    def add(family, kind, labels, start=1.0, slope=0.0):
        families.setdefault(family, (kind, []))[1].append(({**common, **labels}, start, slope))

    for position, rate in ((0, 0.7), (1, 0.4)):
        for bucket, factor in (("0-512", 1.0), ("4k-8k", 0.2)):
            labels = {"position": str(position), "context_bucket": bucket}
            add("spectrace_verify_drafted_tokens", "counter", labels, 0, 100)
            add("spectrace_verify_accepted_tokens", "counter", labels, 0, 100 * rate * factor)
    add("spectrace_verify_steps", "counter", {}, 0, 100)
    add("spectrace_worker_verified_drafted_tokens", "counter", {"rank": "0"}, 0, 400)
    add("spectrace_worker_verified_accepted_tokens", "counter", {"rank": "0"}, 0, 200)
    # does speculation pay: 100 steps of 20 ms (5 drafting) per interval, 400 request-steps, 1000 tokens
    for family, slope in (("step_seconds", 2.0), ("draft_seconds", 0.5), ("request_steps", 400), ("tokens", 1000)):
        add(f"spectrace_speculation_{family}", "counter", {"rank": "0"}, 0, slope)
    add("spectrace_speculation_speedup_estimate", "gauge", {"rank": "0"}, 1.4)
    for k_new, value in enumerate((1.0, 1.3, 1.4, 1.2)):
        add("spectrace_speculation_speedup_by_k", "gauge", {"rank": "0", "k": str(k_new), "extrapolated": "false"}, value)
    # request slices: penalized requests accept 20 %, the others 100 %; 120 drafts proposed per interval, 90 verified
    for value, drafted, accepted in (("1.5", 100, 20), ("off", 100, 100)):
        add("spectrace_slice_drafted_tokens", "counter", {"dimension": "repetition_penalty", "value": value}, 0, drafted)
        add("spectrace_slice_accepted_tokens", "counter", {"dimension": "repetition_penalty", "value": value}, 0, accepted)
    add("spectrace_drafts_proposed", "counter", {}, 0, 120)
    add("spectrace_drafts_verified", "counter", {}, 0, 90)
    # dynamic speculation: 40 steps at k 4 in a full batch, 40 at k 1 in two, 30 of each right after the other k
    for band, k_drafted in (("3-4", "4"), ("2", "1")):
        add("spectrace_step_shapes_steps", "counter", {"batch_band": band, "k": k_drafted}, 0, 40)
        add("spectrace_step_shapes_k_switches", "counter", {"batch_band": band, "k": k_drafted}, 0, 30)
    add("spectrace_context_boundary", "gauge", {"model_role": "draft", "field": "max_position_embeddings"}, 4096)
    for code, severity, role in (("SWA_DROPPED", "error", "draft"), ("TAP_MISMATCH", "error", "draft"),
                                 ("METHOD_INFERRED", "info", "draft"), ("DRAFT_CONTEXT_SHORT", "warning", "draft")):
        add("spectrace_config_finding", "gauge", {"code": code, "severity": severity, "model_role": role})
    # status: the audit's verdict the exporter writes (spectrace.audit.layout_status; tests/test_layout_status.py)
    for role, layer, declared, runtime, window, status in (
        ("target", 0, "full", "full", 0, "match"), ("target", 1, "sliding", "sliding", 4096, "match"),
        ("draft", 0, "full", "sliding", 4096, "MISMATCH"), ("draft", 1, "unspecified", "full", 0, "undeclared"),
    ):
        add("spectrace_attention_layer", "gauge", {"model_role": role, "layer_index": str(layer), "declared_type": declared,
                                                   "runtime_type": runtime, "runtime_window": str(window), "status": status})
    for tap, expected, tapped in ((0, 2, 2), (1, 16, 16), (2, 29, 30)):
        add("spectrace_hidden_states_tap", "gauge", {"tap": str(tap), "expected_id": str(expected), "tapped_id": str(tapped)})
    add("spectrace_run_info", "gauge", {"vllm_version": "0.32.0", "spectrace_version": "0.1.0",
                                        "num_speculative_tokens": "2", "model_runner": "gpu"})
    process = {"job": "spectrace", "instance": "127.0.0.1:9464"}
    families["spectrace_export_dropped"] = ("counter", [(process, 0, 0)])
    families["spectrace_internal_errors"] = ("counter", [({**process, "hook": "verify"}, 0, 1)])
    alert = {k: v for k, v in common.items() if k != "run_id"}
    families["ALERTS"] = ("gauge", [
        ({"alertname": "SpectraceAcceptanceCollapse", "alertstate": "firing", "severity": "critical", **alert}, 1, 0),
        ({"alertname": "SpectraceAcceptanceDrop", "alertstate": "pending", "severity": "warning", **alert}, 1, 0),
    ])

    # what the recording rules ("spectrace-recording") write from the two counters: their per-second rates
    for counter in ("drafted", "accepted"):
        _, series = families[f"spectrace_verify_{counter}_tokens"]
        families[f"spectrace:verify_{counter}_tokens:rate"] = ("gauge", [(labels, slope / every, 0) for labels, _, slope in series])

    lines = []
    for family, (kind, series) in families.items():
        lines.append(f"# TYPE {family} {kind}")
        name = f"{family}_total" if kind == "counter" else family
        for labels, start, slope in series:
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines += [f"{name}{{{text}}} {start + slope * i:g} {end - every * (points - 1 - i)}" for i in range(points)]
    # the acceptance-length histogram: lengths 1..3 (k = 2)
    lines.append("# TYPE spectrace_verify_acceptance_length histogram")
    text = ",".join(f'{k}="{v}"' for k, v in common.items())
    for le, slope in (("1.0", 30), ("2.0", 60), ("3.0", 100), ("+Inf", 100)):
        lines += [f'spectrace_verify_acceptance_length_bucket{{{text},le="{le}"}} {slope * i} {end - every * (points - 1 - i)}'
                  for i in range(points)]
    for suffix, slope in (("sum", 210), ("count", 100)):
        lines += [f"spectrace_verify_acceptance_length_{suffix}{{{text}}} {slope * i} {end - every * (points - 1 - i)}"
                  for i in range(points)]
    return "\n".join(lines + ["# EOF"]) + "\n"


@needs_promtool
@pytest.mark.usefixtures("prometheus_binaries")
def test_every_panel_query_returns_data_from_the_metrics_contract(tmp_path):
    """A real Prometheus over backfilled series of every contract metric: no panel query comes back empty."""
    import time

    from spectrace.testing.prometheus import PrometheusServer

    end = int(time.time()) - 5
    (tmp_path / "contract.om").write_text(_contract_openmetrics(end))
    workdir = tmp_path / "prometheus"
    result = subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(tmp_path / "contract.om"),
                             str(workdir / "data")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    with PrometheusServer(workdir, targets=[]) as prometheus:
        answers = {}
        for dashboard, panel, expr in build.panel_queries("15s", scrape_interval="15s", time_range="30m"):
            answers[panel] = prometheus.api("query", query=expr, time=end)["result"]
            assert answers[panel], f"{dashboard} / {panel}: no data\n{expr}"

    def row(panel, **labels):
        return [float(r["value"][1]) for r in answers[panel] if all(r["metric"].get(k) == v for k, v in labels.items())]

    assert row("Error findings") == [2] and row("Warning findings") == [1] and row("Tap findings") == [1]
    assert row("Attention layers declared ≠ runtime") == [1]
    assert {(r["metric"]["layer_index"], r["metric"]["status"])
            for r in answers["Drafter attention layout: declared vs runtime"]} == {("0", "MISMATCH"), ("1", "undeclared")}
    assert {r["metric"]["status"] for r in answers["Target attention layout: declared vs runtime"]} == {"match"}
    assert row("Acceptance rate by position", position="0") == [pytest.approx((0.7 + 0.14) / 2)]
    assert row("Acceptance by context bucket × position", position="1", context_bucket="4k-8k") == [pytest.approx(0.08)]
    assert row("Mean acceptance length over time") == [pytest.approx(2.1)]
    assert row("Acceptance by request slice", value="1.5") == [pytest.approx(0.2)]
    assert row("Drafts never verified") == [pytest.approx(0.25)]
    assert row("k switches (dynamic speculation)") == [pytest.approx(0.75)]
    assert sorted(r["metric"]["k"] for r in answers["Verified steps by k"]) == ["1", "4"]
    assert row("Collapse alert") == [1] and row("Acceptance alert state [A]") == [2] and row("Acceptance alert state [B]") == [1]


def test_substitute_rejects_unknown_variables():
    with pytest.raises(KeyError):
        build.substitute('up{job=~"$cluster"}')


# --------------------------------------------------------------------------- export


def test_export_writes_a_provisioning_tree(tmp_path, capsys):
    out = tmp_path / "provisioning"
    assert main(["dashboards", "export", str(out), "--datasource-uid", "my-prom", "--prometheus-url", "http://prom:9090"]) == 0
    printed = capsys.readouterr().out
    assert "wrote 12 files" in printed and "production profile" in printed
    grafana = out / "grafana" / "provisioning"
    for name in build.DASHBOARDS:
        assert (grafana / "dashboards" / "spectrace" / name).read_text() == (build.GENERATED / name).read_text()
    import yaml

    provider = yaml.safe_load((grafana / "dashboards" / "spectrace.yaml").read_text())["providers"][0]
    assert provider["options"]["path"] == "/etc/grafana/provisioning/dashboards/spectrace"
    assert provider["folderUid"] == alerts.FOLDER_UID and provider["type"] == "file"
    datasource = yaml.safe_load((grafana / "datasources" / "spectrace-prometheus.yaml").read_text())["datasources"][0]
    assert datasource["uid"] == "my-prom" and datasource["url"] == "http://prom:9090" and datasource["type"] == "prometheus"
    rules = yaml.safe_load((grafana / "alerting" / "spectrace-alert-rules.yaml").read_text())
    assert rules == alerts.grafana_provisioning(alerts.PRODUCTION, "my-prom")
    assert {r["data"][0]["datasourceUid"] for r in rules["groups"][0]["rules"]} == {"my-prom"}
    prometheus_rules = yaml.safe_load((out / "prometheus" / "spectrace-rules.yaml").read_text())
    assert prometheus_rules == alerts.prometheus_rules(alerts.PRODUCTION)
    # the recording group alone, for the Prometheus behind Grafana-managed alerts (they read spectrace:*)
    recording = yaml.safe_load((out / "prometheus" / "spectrace-recording-rules.yaml").read_text())
    assert recording == {"groups": [prometheus_rules["groups"][1]]} and all("record" in r for r in recording["groups"][0]["rules"])
    route = yaml.safe_load((out / "alertmanager" / "alertmanager.example.yaml").read_text())["route"]
    assert {r["receiver"] for r in route["routes"]} == {"spectrace-page", "spectrace-ticket"}
    assert "mount" in (out / "README.md").read_text()


@needs_promtool
def test_exported_prometheus_config_and_rules_pass_promtool(tmp_path):
    out = tmp_path / "tree"
    assert main(["dashboards", "export", str(out), "--profile", "test"]) == 0
    result = subprocess.run([PROMTOOL, "check", "config", str(out / "prometheus" / "prometheus.example.yaml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    import yaml

    written = yaml.safe_load((out / "prometheus" / "spectrace-rules.yaml").read_text())
    count = sum(len(group["rules"]) for group in written["groups"])
    assert count >= 9  # 5 alerts, 4 recording rules at least
    assert f"SUCCESS: {count} rules found" in result.stdout  # promtool follows rule_files and reads every rule
    assert "[15s]" in (out / "prometheus" / "spectrace-rules.yaml").read_text()


@pytest.mark.usefixtures("prometheus_binaries")
def test_alertmanager_example_passes_amtool(tmp_path):
    path = tmp_path / "alertmanager.yaml"
    path.write_text(to_yaml(alerts.alertmanager_example()))
    result = subprocess.run(["amtool", "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_export_into_a_file_is_a_one_line_error(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    assert main(["dashboards", "export", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("spectrace: error:") and "not a directory" in err


def test_dashboards_help_lists_both_commands(capsys):
    assert main(["dashboards", "--help"]) == 0
    out = capsys.readouterr().out
    assert "export" in out and "push" in out


# --------------------------------------------------------------------------- push, against a stand-in for Grafana


class FakeGrafana:
    """A stand-in for Grafana's HTTP API (NOT Grafana): the endpoints `dashboards push` calls.

    It checks each request's path, bearer token and body, answers like Grafana 11
    (status codes and JSON shapes), and keeps what it was sent. Anything a real
    Grafana would reject is answered 400/404 and noted in ``problems``.
    """

    TOKEN = "glsa_test_token"

    def __init__(self, datasources=None):
        self.folders: dict[str, dict] = {}
        self.dashboards: dict[str, dict] = {}
        self.rule_groups: dict[tuple[str, str], dict] = {}
        self.datasources = datasources if datasources is not None else [
            {"id": 1, "uid": "prom-main", "name": "Prometheus", "type": "prometheus", "isDefault": True},
            {"id": 2, "uid": "loki", "name": "Loki", "type": "loki", "isDefault": False},
        ]
        self.requests: list[tuple[str, str]] = []
        self.problems: list[str] = []
        self.reject_rule_group: str | None = None
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                fake.requests.append((method, self.path))
                if self.path == "/api/health" and method == "GET":
                    return self._reply(200, {"commit": "abc", "database": "ok", "version": "11.6.0"})
                if self.headers.get("Authorization") != f"Bearer {fake.TOKEN}":
                    return self._reply(401, {"message": "invalid API key", "traceID": ""})
                status, answer = fake.route(method, self.path, body, self.headers)
                return self._reply(status, answer)

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

            def do_PUT(self):
                self._handle("PUT")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def problem(self, text):
        self.problems.append(text)
        return 400, {"message": text}

    def route(self, method, path, body, headers):
        if m := re.fullmatch(r"/api/folders/([\w-]+)", path):
            folder = self.folders.get(m.group(1))
            return (200, folder) if folder else (404, {"message": "folder not found", "status": "not-found"})
        if path == "/api/folders" and method == "POST":
            if set(body) != {"title", "uid"}:
                return self.problem(f"unexpected folder body {body}")
            if body["uid"] in self.folders:
                return 409, {"message": "a folder with the same name already exists"}
            self.folders[body["uid"]] = {"id": len(self.folders) + 1, **body}
            return 200, self.folders[body["uid"]]
        if path == "/api/datasources" and method == "GET":
            return 200, self.datasources
        if m := re.fullmatch(r"/api/datasources/uid/([\w-]+)", path):
            found = [d for d in self.datasources if d["uid"] == m.group(1)]
            return (200, found[0]) if found else (404, {"message": "Data source not found"})
        if path == "/api/dashboards/db" and method == "POST":
            return self.save_dashboard(body)
        if m := re.fullmatch(r"/api/v1/provisioning/folder/([\w-]+)/rule-groups/([\w-]+)", path):
            if method == "PUT":
                return self.save_rule_group(m.group(1), m.group(2), body)
        return 404, {"message": "Not found"}

    def save_dashboard(self, body):
        dashboard = body.get("dashboard") or {}
        if body.get("overwrite") is not True or dashboard.get("id") is not None:
            return self.problem("a second push needs overwrite=true and no dashboard id")
        if body.get("folderUid") not in self.folders:
            return self.problem(f"folder {body.get('folderUid')} does not exist")
        if dashboard.get("uid") not in (build.ACCEPTANCE_UID, build.CONFIGURATION_UID) or not dashboard.get("panels"):
            return self.problem(f"unexpected dashboard {dashboard.get('uid')}")
        version = self.dashboards.get(dashboard["uid"], {}).get("version", 0) + 1
        self.dashboards[dashboard["uid"]] = {"version": version, "body": body}
        return 200, {"id": 7, "uid": dashboard["uid"], "url": f"/d/{dashboard['uid']}/x", "status": "success", "version": version}

    def save_rule_group(self, folder_uid, group, body):
        if self.reject_rule_group:
            return 400, {"message": self.reject_rule_group}
        if folder_uid not in self.folders:
            return 404, {"message": "folder does not exist"}
        if body.get("title") != group or body.get("folderUid") != folder_uid:
            return self.problem(f"rule group body does not match its path: {list(body)}")
        interval = body.get("interval")
        if not isinstance(interval, int) or interval <= 0 or interval % 10:
            return self.problem(f"invalid alert rule: interval ({interval}s) should be non-zero and divided exactly by scheduler interval: 10")
        known = {d["uid"] for d in self.datasources}
        for rule in body["rules"]:
            refs = [q["refId"] for q in rule["data"]]
            if rule["condition"] not in refs or rule["ruleGroup"] != group or rule["folderUID"] != folder_uid:
                return self.problem(f"rule {rule.get('title')}: condition/ruleGroup/folderUID mismatch")
            if not all(q["datasourceUid"] in known | {"__expr__"} for q in rule["data"]):
                return self.problem(f"rule {rule['title']}: unknown data source")
            if not re.fullmatch(r"\d+[smh]", rule["for"]) or rule["noDataState"] not in ("OK", "NoData", "Alerting"):
                return self.problem(f"rule {rule['title']}: bad for/noDataState")
        self.rule_groups[(folder_uid, group)] = body
        return 200, body

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def grafana():
    with FakeGrafana() as server:
        yield server


@pytest.fixture
def token_env(monkeypatch):
    monkeypatch.setenv("GRAFANA_TOKEN", FakeGrafana.TOKEN)


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("spectrace: error: "), err
    assert "Traceback" not in err
    return err


def test_push_creates_folder_dashboards_and_rules_and_is_idempotent(grafana, token_env, capsys):
    assert main(["dashboards", "push", "--url", grafana.url]) == 0
    out = capsys.readouterr().out
    assert "created" in out and "6 rules on data source prom-main" in out
    assert grafana.problems == []
    assert set(grafana.folders) == {"spectrace"} and grafana.folders["spectrace"]["title"] == "Spectrace"
    assert set(grafana.dashboards) == {build.ACCEPTANCE_UID, build.CONFIGURATION_UID}
    sent = grafana.dashboards[build.ACCEPTANCE_UID]["body"]["dashboard"]
    assert {k: v for k, v in sent.items() if k != "id"} == json.loads((build.GENERATED / build.ACCEPTANCE_FILE).read_text())
    group = grafana.rule_groups[("spectrace", "spectrace")]
    assert group == alerts.grafana_rule_group(alerts.PRODUCTION, "prom-main")
    first = (dict(grafana.folders), {u: d["body"] for u, d in grafana.dashboards.items()}, dict(grafana.rule_groups))

    grafana.requests.clear()
    assert main(["dashboards", "push", "--url", grafana.url + "/"]) == 0
    assert "exists" in capsys.readouterr().out
    assert ("POST", "/api/folders") not in grafana.requests
    assert (dict(grafana.folders), {u: d["body"] for u, d in grafana.dashboards.items()}, dict(grafana.rule_groups)) == first
    assert grafana.dashboards[build.ACCEPTANCE_UID]["version"] == 2  # saved again, same content
    assert grafana.problems == []


def test_push_with_token_file_test_profile_and_datasource_uid(grafana, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    grafana.datasources.append({"id": 3, "uid": "prom-2", "name": "Prometheus 2", "type": "prometheus", "isDefault": False})
    token = tmp_path / "token"
    token.write_text(FakeGrafana.TOKEN + "\n")
    assert main(["dashboards", "push", "--url", grafana.url, "--token-file", str(token), "--profile", "test",
                 "--datasource-uid", "prom-2"]) == 0
    group = grafana.rule_groups[("spectrace", "spectrace")]
    assert group["interval"] == 10 and {r["data"][0]["datasourceUid"] for r in group["rules"]} == {"prom-2"}
    assert grafana.problems == []


def test_push_with_a_bad_token_is_a_one_line_error(grafana, monkeypatch, capsys):
    monkeypatch.setenv("GRAFANA_TOKEN", "wrong")
    assert main(["dashboards", "push", "--url", grafana.url]) == 2
    err = _one_line_error(capsys)
    assert "401" in err and "GRAFANA_TOKEN" in err
    assert grafana.dashboards == {} and grafana.folders == {}


def test_push_to_an_unreachable_url_is_a_one_line_error(token_env, capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["dashboards", "push", "--url", f"http://127.0.0.1:{port}", "--timeout", "3"]) == 2
    err = _one_line_error(capsys)
    assert f"cannot reach Grafana at http://127.0.0.1:{port}" in err and "refused" in err.lower()


def test_push_with_a_malformed_url_is_a_one_line_error(token_env, capsys):
    assert main(["dashboards", "push", "--url", "grafana.example:3000"]) == 2
    assert "not a Grafana URL" in _one_line_error(capsys)


def test_push_rejected_payload_is_a_one_line_error(grafana, token_env, capsys):
    grafana.reject_rule_group = "invalid alert rule 'SpectraceAcceptanceDrop':\nfailed to build query 'A'"
    assert main(["dashboards", "push", "--url", grafana.url]) == 2
    err = _one_line_error(capsys)
    assert "rejected the request to save alert rule group spectrace (400 Bad Request)" in err
    assert "invalid alert rule 'SpectraceAcceptanceDrop': failed to build query 'A'" in err


def test_push_without_credentials_is_a_one_line_error(monkeypatch, capsys):
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    assert main(["dashboards", "push", "--url", "http://127.0.0.1:3000"]) == 2
    assert "GRAFANA_TOKEN" in _one_line_error(capsys)


def test_push_needs_an_unambiguous_prometheus_data_source(token_env, capsys):
    with FakeGrafana(datasources=[]) as grafana:
        assert main(["dashboards", "push", "--url", grafana.url]) == 2
        assert "no Prometheus data source" in _one_line_error(capsys)
    several = [{"id": i, "uid": f"p{i}", "name": f"P{i}", "type": "prometheus", "isDefault": False} for i in (1, 2)]
    with FakeGrafana(datasources=several) as grafana:
        assert main(["dashboards", "push", "--url", grafana.url]) == 2
        assert "--datasource-uid" in _one_line_error(capsys)
        assert main(["dashboards", "push", "--url", grafana.url, "--datasource-uid", "nope"]) == 2
        assert "no data source with uid 'nope'" in _one_line_error(capsys)


def test_push_to_something_that_is_not_grafana_is_a_one_line_error(token_env, capsys):
    class Html(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body = b"<html>Prometheus Time Series Collection and Processing Server</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Html)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        assert main(["dashboards", "push", "--url", f"http://127.0.0.1:{server.server_address[1]}"]) == 2
        assert "does not answer like Grafana" in _one_line_error(capsys)
    finally:
        server.shutdown()
        server.server_close()
