"""The pipeline's sinks, and the registry a process chooses them from.

Each sink takes every flush's :class:`~spectrace.pipeline.Batch` (``export``):

- ``duckdb``: the per-process Parquet store (``spectrace.store.writer.SegmentSink``);
- ``lake``: one DuckLake for the fleet (``spectrace.lake.sink.LakeSink``);
- ``prometheus``: this process's exposition file, served on vLLM's ``/metrics``
  (``spectrace.sinks.exposition.ExpositionSink``);
- ``otlp``: spans and metrics to an OTLP collector, scheduled by the OpenTelemetry SDK
  (``spectrace.sinks.otel.OtlpExport``): not a sink of the flush but a span processor and a metric
  reader, kept in ``Pipeline.telemetry`` and taken by the process's providers once;
- ``memory``: every batch kept as rows, for tests (``spectrace.sinks.memory.MemorySink``;
  not selectable by ``SPECTRACE_EXPORTER``).

``spans`` turns finished OpenTelemetry spans into rows of the ``spans`` table; ``metrics``
is the process's OpenTelemetry instruments, read by the ``prometheus`` and ``otlp`` sinks.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Sequence

from spectrace.settings import Settings
from spectrace.sink import Sink, Telemetry

if TYPE_CHECKING:  # the pipeline is imported where one is built: a vLLM process reads the exposition module alone
    from spectrace.pipeline import Pipeline

log = logging.getLogger("vllm.spectrace")


def _store(settings: Settings, pipeline: Pipeline) -> Sink:
    from spectrace.store.writer import SegmentSink

    return SegmentSink.from_settings(settings, on_drop=pipeline.count_dropped, record=pipeline.append)


def _lake(settings: Settings, pipeline: Pipeline) -> Sink:
    from spectrace.lake.sink import LakeSink

    return LakeSink.from_settings(settings, on_drop=pipeline.count_dropped)


def _exposition(settings: Settings, pipeline: Pipeline) -> Sink:
    from spectrace.sinks.exposition import ExpositionSink

    return ExpositionSink.from_settings(settings)


def _otlp(settings: Settings, pipeline: Pipeline) -> Telemetry:
    from spectrace.sinks.otel import OtlpExport

    return OtlpExport(on_drop=pipeline.count_dropped)


# Each entry builds one sink (or, for otlp, the SDK's exporter) from the settings; the order here is the order
# sinks get a batch. The exposition file first: it renders what the metrics sink (always first) just updated and
# needs nothing the store or the lake write, so /metrics never waits on their durable writes (on a loaded 2-core
# host a worker's first flush with records spent 12-13 s in the store's segment writes, in fsync, and its series, the
# speed-up estimate among them, reached the page that much after the flush had computed them).
SINKS: dict[str, Callable[[Settings, Pipeline], Sink | Telemetry]] = {
    "prometheus": _exposition,
    "duckdb": _store,
    "lake": _lake,
    "otlp": _otlp,
}


def build(
    settings: Settings,
    *,
    sources: Sequence[Callable[[], None]] = (),
    on_error: Callable[[str, BaseException], None] | None = None,
) -> tuple[Pipeline, dict[str, str]]:
    """The process's pipeline with the sinks ``settings.exporters`` names, and each sink's status.

    A sink that cannot be built (a missing extra, no catalog) is one log line and a status
    ``unavailable: ...``; the others run. An unknown name is logged and skipped.
    """
    from spectrace.pipeline import Pipeline

    pipeline = Pipeline.from_settings(settings, sources=sources, on_error=on_error)
    status: dict[str, str] = {}
    unknown = [name for name in settings.exporters if name not in SINKS]
    if unknown:
        log.error("spectrace: unknown SPECTRACE_EXPORTER value(s) %s; known: %s", unknown, ", ".join(SINKS))
    for name in SINKS:  # registry order, whatever order the variable lists them in
        if name not in settings.exporters:
            continue
        try:
            sink = SINKS[name](settings, pipeline)
        except Exception as exc:
            status[name] = f"unavailable: {exc}"
            log.error("spectrace: the %s sink is unavailable: %s", name, exc)
            continue
        if isinstance(sink, Telemetry):
            pipeline.telemetry.append(sink)
        else:
            pipeline.add_sink(sink)
        status[name] = sink.status or name
    return pipeline, status
