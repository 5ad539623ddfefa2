"""OTLP and Prometheus export of real vLLM runs, against real peers on 127.0.0.1."""

from __future__ import annotations


import pytest

import spectrace.store
from spectrace.testing.engine import EngineSpec, run_engines
from spectrace.testing.otlp import OtlpReceiver
from spectrace.testing.prometheus import PrometheusServer, free_port

pytestmark = [pytest.mark.vllm, pytest.mark.server]


def _seeded(zoo, **kwargs) -> EngineSpec:
    return EngineSpec(
        name="seeded",
        target=zoo["target"],
        speculative={"method": "draft_model", "model": zoo["draft_seeded"], "num_speculative_tokens": 3},
        **kwargs,
    )


def _duckdb_by_position(store, run_id):
    con = spectrace.store.open(store)
    rows = con.execute(
        "select position, drafted, accepted from acceptance_by_position where run_id = ? order by position", [run_id]
    ).fetchall()
    return {str(p): (d, a) for p, d, a in rows}


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_otlp_receiver_gets_spans_and_metrics(zoo, scratch, cache_root, protocol):
    store = scratch / f"otlp-{protocol.replace('/', '-')}"
    with OtlpReceiver() as receiver:
        endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
        result = run_engines(
            [_seeded(zoo)],
            store=store,
            cache_root=cache_root,
            env={
                "SPECTRACE_EXPORTER": "duckdb,otlp",
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
                "OTEL_SERVICE_NAME": "vllm-test",
                "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=ci",
                "OTEL_METRIC_EXPORT_INTERVAL": "500",
            },
        )["seeded"]
        assert result.ok, result.error
        spans = receiver.spans()
        drafted = receiver.latest("spectrace.verify.drafted_tokens", ("position", "run_id"))
        accepted = receiver.latest("spectrace.verify.accepted_tokens", ("position", "run_id"))
        findings = receiver.latest("spectrace.runtime.finding", ("code", "severity", "run_id"))  # a run finding (RUNTIME_CODES)
    names = {s["name"] for s in spans}
    assert {"spectrace.run", "spectrace.config.resolve", "spectrace.worker.load_model"} <= names
    assert len({s["trace_id"] for s in spans if s["attributes"].get("spectrace.run_id") == result.run_id}) == 1
    resource = next(s["resource"] for s in spans if s["name"] == "spectrace.run")
    assert resource["service.name"] == "vllm-test"
    assert resource["deployment.environment"] == "ci"
    assert resource["spectrace.run_id"] == result.run_id
    assert resource["spectrace.process.role"] == "frontend" and resource["vllm.version"] == "0.32.0"
    assert resource["host.name"]
    # per-position counts equal the DuckDB figures of the same run
    expected = _duckdb_by_position(store, result.run_id)
    got = {p: (drafted[(p, result.run_id)], accepted[(p, result.run_id)]) for p in expected}
    assert got == expected
    assert findings[("ACCEPTANCE_COLLAPSE", "error", result.run_id)] == 1
    points = receiver.metric_points("spectrace.verify.drafted_tokens")
    assert {"model", "draft_model", "method", "run_id", "position", "context_bucket"} <= set(points[-1]["attributes"])
    # one span per finished request, vLLM's per-request numbers under their own leaf names, equal to the store's view
    prefix = "spectrace.spec_decode."
    fields = ("num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens", "emitted_tokens", "acceptance_histogram")
    sent = {s["attributes"]["spectrace.request.id"]: tuple(s["attributes"][prefix + f] for f in fields)
            for s in spans if s["name"] == "spectrace.request"}
    cursor = spectrace.store.open(store).execute(
        f"select request_id, {', '.join(fields)} from request_spec_decode where run_id = ?", [result.run_id])
    stored = {rid: tuple(values) for rid, *values in cursor.fetchall()}
    assert len(sent) == len(result.tokens) and sent == stored


def test_prometheus_scrape_reproduces_acceptance(zoo, scratch, cache_root):
    store = scratch / "prom-store"
    base = free_port()
    # an offline engine: one endpoint (SPECTRACE_PROMETHEUS_PORT) for all its processes
    with PrometheusServer(scratch / "prom", targets=[f"127.0.0.1:{base}"]) as prom:
        result = run_engines(
            [_seeded(zoo, linger_s=7.0, repeat=2)],
            store=store,
            cache_root=cache_root,
            env={
                "SPECTRACE_EXPORTER": "duckdb,prometheus",
                "SPECTRACE_PROMETHEUS_PORT": str(base),
                "SPECTRACE_PROMETHEUS_HOST": "127.0.0.1",
            },
        )["seeded"]
        assert result.ok, result.error
        # The engine has exited: read the last scraped values (range selections skip staleness markers).
        run = f'run_id="{result.run_id}"'
        q = f"sum by (position) (max_over_time(spectrace_verify_accepted_tokens_total{{{run}}}[10m]))"
        accepted = {r["metric"]["position"]: float(r["value"][1]) for r in prom.query(q)}
        q = f"sum by (position) (max_over_time(spectrace_verify_drafted_tokens_total{{{run}}}[10m]))"
        drafted = {r["metric"]["position"]: float(r["value"][1]) for r in prom.query(q)}
        steps = prom.query(f"max_over_time(spectrace_verify_steps_total{{{run}}}[10m])")
        histogram = prom.query(f"max_over_time(spectrace_verify_acceptance_length_bucket{{{run}}}[10m])")
    expected = _duckdb_by_position(store, result.run_id)
    assert {p: (drafted[p], accepted[p]) for p in expected} == {p: (float(d), float(a)) for p, (d, a) in expected.items()}
    assert float(steps[0]["value"][1]) == expected["0"][0]
    assert sorted(float(r["metric"]["le"]) if r["metric"]["le"] != "+Inf" else 99 for r in histogram) == [1, 2, 3, 4, 99]
