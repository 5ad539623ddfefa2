"""The acceptance-length histogram fed with counts (``metrics.record_many``) on the installed
OpenTelemetry SDK: every reader sees exactly what ``count`` calls of ``record`` give it."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader

from spectrace.sinks import metrics

LABELS = {"model": "t", "draft_model": "d", "method": "eagle3", "run_id": "r1"}
# a flush's acceptance lengths, then a second flush with another run's labels
FLUSHES = [({1: 40, 2: 7, 4: 1000}, LABELS), ({3: 2, 5: 1}, {**LABELS, "run_id": "r2"}), ({1: 1, 4: 3}, LABELS)]


def _points(temporality):
    readers = [
        InMemoryMetricReader(preferred_temporality={Histogram: temporality}),
        InMemoryMetricReader(),  # a second reader, cumulative, as Prometheus beside OTLP
    ]
    provider = MeterProvider(metric_readers=readers)
    return provider, readers


def _collect(reader):
    data = reader.get_metrics_data()
    out = {}
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    out[tuple(sorted(p.attributes.items()))] = (
                        tuple(p.bucket_counts), p.sum, p.count, p.min, p.max
                    )
    return out


@pytest.mark.parametrize("temporality", [AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA])
def test_counts_recorded_at_once_equal_one_record_per_request_step(temporality):
    results = []
    for bulk in (False, True):
        provider, readers = _points(temporality)
        histogram = provider.get_meter("spectrace").create_histogram(
            "spectrace.verify.acceptance_length", explicit_bucket_boundaries_advisory=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        )
        collected = []
        for counts, labels in FLUSHES:
            for length, count in counts.items():
                if bulk:
                    metrics.record_many(histogram, length, count, labels)
                else:
                    for _ in range(count):
                        histogram.record(length, labels)
            collected.append([_collect(reader) for reader in readers])  # a collect between flushes
        results.append(collected)
        provider.shutdown()
    assert metrics._bulk_supported, "record_many fell back to the loop on the installed SDK"
    loop, bulk = results
    assert bulk == loop
    # and the numbers are the flushes' own: r1 after the first flush, cumulative reader
    first = loop[0][1][tuple(sorted(LABELS.items()))]
    assert first[2] == 1047 and first[1] == 40 + 14 + 4000 and first[0][:5] == (40, 7, 0, 1000, 0)


def test_the_metrics_sink_is_added_while_a_flush_holds_the_flush_lock():
    """The runtime adds the metrics sink while it builds its telemetry under its own lock, and a flush's drain
    may wait for that lock (a span): adding a sink must never wait for the flush (a worker deadlocked so, once)."""
    import threading

    from spectrace.pipeline import Pipeline, Sink

    pipeline = Pipeline(flush_interval_s=60, max_buffer_rows=10)
    first, second = Sink(), Sink()
    pipeline.add_sink(first)
    with pipeline._flush_lock:  # a flush in progress on another thread
        adding = threading.Thread(target=pipeline.add_sink, args=(second,), kwargs={"first": True})
        adding.start()
        adding.join(timeout=5)
        assert not adding.is_alive()
    assert pipeline.sinks == [second, first]


def test_value_records_reach_their_instruments_through_a_flush_and_nothing_else_calls_one():
    """Run info, the layout's verdicts, taps, the speed-up estimates, slice counts, error counts and drops are value
    records (spectrace.values) a real pipeline's flush hands the metrics sink, which alone turns them into series."""
    import ast
    from pathlib import Path

    from opentelemetry.sdk.resources import Resource

    import spectrace
    from spectrace import values
    from spectrace.pipeline import Pipeline

    reader = InMemoryMetricReader()
    m = metrics.Metrics([reader], Resource.create({}))
    labels = {"r1": LABELS}
    pipeline = Pipeline(flush_interval_s=60, max_buffer_rows=100,
                        sinks=[metrics.MetricsSink(m, lambda run_id: labels.get(run_id, {}), lambda run_id: 3)])
    for value in (values.RunInfo("r1", {"num_speculative_tokens": 3, "model_runner": "v1"}, "0.32.0", "9.9"),
                  values.LayoutVerdicts("r1", [{"model_role": "draft", "layer_index": 0, "declared_type": "full",
                                                "runtime_type": "sliding", "runtime_window": 128, "status": "MISMATCH"}]),
                  values.Taps("r1", [{"expected_id": 2, "tapped_id": 3}]),
                  values.Speedup("r1", 0, 1.25, [{"k": 2, "speedup": 1.5, "extrapolated": False}]),
                  values.SliceCounts("r1", {("temperature", "0"): (10, 7)}),
                  values.ErrorCounts({"worker.verify": 2}), values.Dropped(5)):
        pipeline.note(value)
    assert pipeline.flush() == 0  # no rows: the values ride in the batch beside them
    got = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                got[metric.name] = [(dict(p.attributes), p.value) for p in metric.data.data_points]
    m.shutdown()
    run = dict(LABELS)
    assert got["spectrace.run.info"] == [({**run, "vllm_version": "0.32.0", "spectrace_version": "9.9",
                                           "num_speculative_tokens": "3", "model_runner": "v1"}, 1)]
    assert got["spectrace.attention.layer"][0][0]["status"] == "MISMATCH"
    assert got["spectrace.hidden_states.tap"] == [({**run, "tap": "0", "expected_id": "2", "tapped_id": "3"}, 1)]
    assert got["spectrace.speculation.speedup_estimate"] == [({**run, "rank": "0"}, 1.25)]
    assert got["spectrace.speculation.speedup_by_k"] == [({**run, "rank": "0", "k": "2", "extrapolated": "false"}, 1.5)]
    assert got["spectrace.slice.accepted_tokens"] == [({**run, "dimension": "temperature", "value": "0"}, 7)]
    assert got["spectrace.internal.errors"] == [({"hook": "worker.verify"}, 2)]
    assert got["spectrace.export.dropped"] == [({}, 5)]
    # no module outside spectrace/sinks/ calls a Metrics method (a value goes to the pipeline as a record)
    names = {n for n, v in vars(metrics.Metrics).items() if callable(v) and not n.startswith("_")} - {"shutdown"}
    root = Path(spectrace.__file__).parent
    calls = []
    for path in root.rglob("*.py"):
        if path.parent.name == "sinks":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "metrics"):
                calls.append(f"{path.relative_to(root)}:{node.lineno} {node.func.attr}")
    assert calls == []
