"""The OpenTelemetry SDK shortcut spectrace takes (the span queue's drop count), on the installed SDK and
with the internals it reads gone: spans still export, the count reads 0 (no collector, no vLLM)."""

from __future__ import annotations

from importlib import metadata

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from packaging.specifiers import SpecifierSet

from spectrace.sinks.otel import SDK_CHECKED, CountingBatchSpanProcessor


class Collect(SpanExporter):
    def __init__(self) -> None:
        self.names: list[str] = []

    def export(self, spans):
        self.names.extend(s.name for s in spans)
        return SpanExportResult.SUCCESS


def _run(processor_kwargs, n: int):
    exporter, drops = Collect(), []
    provider = TracerProvider()
    provider.add_span_processor(CountingBatchSpanProcessor(exporter, on_drop=drops.append, **processor_kwargs))
    tracer = provider.get_tracer("t")
    for i in range(n):
        tracer.start_span(f"s{i}").end()
    provider.shutdown()
    return exporter.names, sum(drops)


def test_the_installed_sdk_is_in_the_checked_range():
    assert metadata.version("opentelemetry-sdk") in SpecifierSet(SDK_CHECKED.removeprefix("opentelemetry-sdk"))


def test_a_full_queue_counts_what_it_drops():
    names, dropped = _run({"max_queue_size": 4, "schedule_delay_millis": 60_000, "max_export_batch_size": 4}, 50)
    # every dropped span is counted; the queue's worker may take a span between the check and the put,
    # so the count can be one or two high, never low
    assert dropped > 0 and 50 <= len(names) + dropped <= 52


def test_without_the_internals_the_count_is_zero_and_nothing_raises():
    exporter, drops = Collect(), []
    processor = CountingBatchSpanProcessor(exporter, on_drop=drops.append)
    real = processor._batch_processor
    processor._batch_processor = object()  # no _queue: the shortcut finds nothing to read
    span = TracerProvider().get_tracer("t").start_span("x")
    span.end()
    processor._batch_processor = real
    processor.on_end(span)
    processor.force_flush()
    assert drops == [] and exporter.names == ["x"]
    processor.shutdown()


def test_trace_and_span_ids_do_not_follow_the_random_module_vllm_seeds(tmp_path):
    """vLLM seeds ``random`` at every engine start (``seed``, 0 by default); the SDK's default ids come from it, so
    every run of a process, and every restart of a server, made the same trace id. A runtime's do not."""
    import random

    from spectrace.recorder import runtime
    from spectrace.testing import memory_runtime

    def ids(start):
        got = []
        for _ in range(2):
            random.seed(0)
            span = start()
            got.append((span.get_span_context().trace_id, span.get_span_context().span_id))
            span.end()
        return got

    default = TracerProvider().get_tracer("t")
    try:
        same = ids(lambda: default.start_span("a"))
        assert same[0] == same[1]  # the SDK's default generator: the seed decides the ids
        rt, _ = memory_runtime(tmp_path, "r")
        try:
            ours = ids(lambda: rt.start_span("spectrace.run", role="frontend"))
        finally:
            runtime.stop()
        assert ours[0][0] != ours[1][0] and ours[0][1] != ours[1][1] and all(i for pair in ours for i in pair)
    finally:
        random.seed()
