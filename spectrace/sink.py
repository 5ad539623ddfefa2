"""What a pipeline hands each flush to: the :class:`Sink` protocol, and :class:`Telemetry`, the exporters the
OpenTelemetry SDK schedules itself (a leaf: no numpy, pyarrow or audit, so that a sink's module that a vLLM process
also reads, the exposition directory's, loads no flush).

``spectrace.pipeline`` runs them; ``spectrace.sinks`` builds them from the settings.
"""

from __future__ import annotations

from typing import Any


class Sink:
    """What a pipeline hands each flush to, and what each sink can do, declared here with its default: a sink
    overrides what it offers (the pipeline and the runtime call these, never probe for them). ``export`` runs on
    the flush thread and must not block for long (a sink that talks to a server keeps its own bounded queue and
    backoff)."""

    name = "sink"
    status = ""  # a line for the run record (``exporters``; the name where empty)
    takes_tables = False  # stores the records tables: the runtime then also turns spans into ``spans`` rows

    def export(self, batch: Any) -> None:
        """One flush's batch (``spectrace.pipeline.Batch``)."""

    def close(self) -> None:
        """The last flush was exported: release what the sink holds."""

    def maintain(self) -> None:
        """Maintenance on the flush thread every ``maintain_interval_s`` (the store's compaction, retention, cap)."""

    def stats(self) -> dict[str, Any] | None:
        """The sink's own counters for ``Pipeline.stats``, or None."""
        return None

    def writing(self, run_id: str) -> None:
        """The run this process writes now (a store names its segments by it)."""

    def metric_reader(self) -> Any | None:
        """An OpenTelemetry metric reader the process's meter provider adds, or None."""
        return None

    def span_processor(self) -> Any | None:
        """An OpenTelemetry span processor the tracer provider adds, or None."""
        return None


class Telemetry:
    """An exporter the OpenTelemetry SDK schedules itself (OTLP): a span processor and a metric reader, each on its
    own thread, configured once when the process's providers are built; it takes no batch. Kept beside the sinks
    (``Pipeline.telemetry``), never among them: the flush has nothing to hand it."""

    name = "telemetry"
    status = ""

    def span_processor(self) -> Any | None:
        return None

    def metric_reader(self) -> Any | None:
        return None
