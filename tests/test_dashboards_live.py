"""Every panel and alert query against a real Prometheus that scrapes real vLLM runs."""

from __future__ import annotations

import threading
import time

import pytest

from spectrace.dashboards import alerts, build, panel_queries
from spectrace.dashboards.export import to_yaml
from spectrace.testing import wait_until
from spectrace.testing.engine import EngineSpec, run_engines
from spectrace.testing.prometheus import PrometheusServer, free_port

pytestmark = [pytest.mark.vllm, pytest.mark.server]

COLLAPSE = "SpectraceAcceptanceCollapse"


def _spec(zoo, drafter, linger_s, stop):
    return EngineSpec(
        name=drafter,
        target=zoo["target"],
        speculative={"method": "draft_model", "model": zoo[drafter], "num_speculative_tokens": 3},
        # keep drafting until the test has what it needs (the stop file): rates over 15 s windows, the alert's window
        # and `for:` need a steady rate while Prometheus scrapes, on a fast machine as on a loaded one (60 generate
        # calls once took 5 s, less than the 5 s SPECTRACE_EXPOSITION_INTERVAL, and the series first reached the
        # page after the last draft: no rate was ever above 0)
        repeat=2000,
        linger_s=linger_s,  # and stay up (gauges vanish with the process) while the test queries
        stop_file=str(stop),
    )


def _serve(zoo, cache_root, store, base, results, scratch):
    """The healthy drafter's engine, then the one that disagrees, in one child (one vLLM start-up, one endpoint
    ``base``): the second begins when the test has what it needs of the first (its stop file)."""
    results.update(
        run_engines(
            [_spec(zoo, "draft_self", 60.0, scratch / "dash-self.stop"),
             _spec(zoo, "draft_seeded", 5.0, scratch / "dash-seeded.stop")],
            store=store,
            cache_root=cache_root,
            env={
                "SPECTRACE_EXPORTER": "duckdb,prometheus",
                "SPECTRACE_PROMETHEUS_PORT": str(base),
                "SPECTRACE_PROMETHEUS_HOST": "127.0.0.1",
                "SPECTRACE_FLUSH_INTERVAL": "0.5",
            },
        )
    )


def _alert_states(prom, instance_port):
    states = []
    for group in prom.api("rules")["groups"]:
        for rule in group["rules"]:
            if rule.get("name") != COLLAPSE:
                continue
            for alert in rule.get("alerts", []):
                if alert["labels"].get("instance", "").endswith(f":{instance_port}"):
                    states.append(alert["state"])
    return states


def test_panels_and_collapse_alert_on_real_runs(zoo, scratch, cache_root):
    rules = scratch / "spectrace-rules.yaml"
    # the test profile's rules, evaluated every second instead of every 5 s: the same expressions, windows and `for:`,
    # each state change seen up to 4 s sooner
    rules.write_text(to_yaml(alerts.prometheus_rules(alerts.TEST.replace(evaluation_interval="1s"))))
    base = free_port()
    targets = [f"127.0.0.1:{base}"]  # an offline engine: one endpoint (SPECTRACE_PROMETHEUS_PORT) for all its processes
    with PrometheusServer(scratch / "prom-dash", targets=targets, rule_files=[rules]) as prom:
        results: dict = {}
        runner = threading.Thread(target=_serve, args=(zoo, cache_root, scratch / "dash-store", base, results, scratch))
        runner.start()
        try:
            # A healthy drafter (the target itself): data everywhere, the collapse alert stays inactive.
            wait_until(lambda: prom.api("query", query="sum(rate(spectrace_verify_drafted_tokens_total[15s])) > 0")["result"],
                       240, "drafted tokens in Prometheus")
            time.sleep(20)  # longer than the test profile's window + for:
            empty = []
            for dashboard, title, query in panel_queries(step="15s", scrape_interval="1s", time_range="10m"):
                if title in build.MAY_BE_EMPTY:
                    continue
                if not prom.api("query", query=query)["result"]:
                    empty.append((dashboard, title, query))
            healthy_states = _alert_states(prom, base)
            # every alert expression evaluated on the real series (a rule Prometheus cannot evaluate says err)
            health = wait_until(lambda: (h := {r["name"]: (r.get("health"), r.get("lastError") or "") for g in prom.api(
                "rules")["groups"] for r in g["rules"] if r.get("type") == "alerting"}) and all(
                v[0] != "unknown" for v in h.values()) and h, 60, "every alert rule evaluated")
            # A drafter that disagrees, next in the same child: the collapse alert goes firing in Prometheus' own rule
            # state.
            (scratch / "dash-self.stop").touch()
            wait_until(lambda: "firing" in _alert_states(prom, base), 240, "the collapse alert to fire")
        finally:
            (scratch / "dash-self.stop").touch()
            (scratch / "dash-seeded.stop").touch()
            runner.join(timeout=300)
        assert results["draft_self"].ok, results["draft_self"].error
        assert results["draft_seeded"].ok, results["draft_seeded"].error
    assert [t for _, t, _ in empty] == []
    assert "firing" not in healthy_states and "pending" not in healthy_states
    assert set(health) == {r.name for r in alerts.RULES} and all(v == ("ok", "") for v in health.values()), health
