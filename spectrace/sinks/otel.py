"""OTLP and Prometheus sinks, configured the OpenTelemetry way.

``SPECTRACE_EXPORTER`` picks sinks (:data:`spectrace.settings.EXPORTERS`, comma-separated,
checked by the settings). OTLP is configured only by the standard variables
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_{TRACES,METRICS}_*``,
``OTEL_EXPORTER_OTLP_PROTOCOL`` = ``http/protobuf`` (default) | ``grpc``,
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_METRIC_EXPORT_INTERVAL``).

Nothing here ever blocks the engine: spans go through a bounded batch queue
whose overflow is dropped and counted (``spectrace.export.dropped``), and every
export runs on the SDK's own background threads.
"""

from __future__ import annotations

import logging
import os

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from spectrace.pipeline import Telemetry

log = logging.getLogger("vllm.spectrace")

class MissingExtra(RuntimeError):
    pass


def _protocol(signal: str) -> str:
    value = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    return value.strip().lower()


# The SDK internals the drop count reads (BatchSpanProcessor._batch_processor._queue / _max_queue_size),
# checked on these SDK versions; elsewhere the count reads 0 and spans export as usual (tests/test_otel_sdk.py).
SDK_CHECKED = "opentelemetry-sdk>=1.30,<=1.45.2"


class CountingBatchSpanProcessor(BatchSpanProcessor):
    """A BatchSpanProcessor that counts the spans its full queue drops (SDK internals: ``SDK_CHECKED``)."""

    def __init__(self, exporter, *, on_drop, **kwargs) -> None:
        super().__init__(exporter, **kwargs)
        self._on_drop = on_drop

    def on_end(self, span: ReadableSpan) -> None:
        try:
            processor = self._batch_processor
            if len(processor._queue) >= processor._max_queue_size:  # noqa: SLF001 - SDK 1.x internals
                self._on_drop(1)
        except AttributeError:
            pass
        super().on_end(span)


class _FailureLog:
    """One clear log line when an export path starts failing, one when it recovers."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.failing = False

    def result(self, ok: bool) -> None:
        if not ok and not self.failing:
            self.failing = True
            log.error(
                "spectrace: %s export to %s is failing; spectrace keeps going (bounded queue, drops counted "
                "in spectrace.export.dropped) and vLLM is unaffected",
                self.what,
                os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "the default OTLP endpoint"),
            )
        elif ok and self.failing:
            self.failing = False
            log.warning("spectrace: %s export recovered", self.what)


class LoggedSpanExporter(SpanExporter):
    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.status = _FailureLog("OTLP span")

    def export(self, spans):
        try:
            result = self.inner.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        self.status.result(result == SpanExportResult.SUCCESS)
        return result

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.inner.shutdown()


class LoggedMetricExporter(MetricExporter):
    def __init__(self, inner: MetricExporter) -> None:
        super().__init__(
            preferred_temporality=getattr(inner, "_preferred_temporality", None),
            preferred_aggregation=getattr(inner, "_preferred_aggregation", None),
        )
        self.inner = inner
        self.status = _FailureLog("OTLP metric")

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs):
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception:
            result = MetricExportResult.FAILURE
        self.status.result(result == MetricExportResult.SUCCESS)
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def otlp_span_exporter():
    protocol = _protocol("TRACES")
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise MissingExtra("SPECTRACE_EXPORTER=otlp needs: pip install 'spectrace[otlp]'") from None
    return LoggedSpanExporter(OTLPSpanExporter())


def otlp_metric_reader():
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    protocol = _protocol("METRICS")
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError:
        raise MissingExtra("SPECTRACE_EXPORTER=otlp needs: pip install 'spectrace[otlp]'") from None
    # the SDK reads OTEL_METRIC_EXPORT_INTERVAL itself (default 60000 ms; a bad value: its one warning, the default)
    return PeriodicExportingMetricReader(LoggedMetricExporter(OTLPMetricExporter()))


class OtlpExport(Telemetry):
    """``SPECTRACE_EXPORTER=otlp``: spans and metrics to an OTLP collector.

    The OpenTelemetry SDK schedules this export itself (a batch span processor and a periodic
    metric reader, each on its own thread): not a sink of the flush, but a processor and a reader
    the process's tracer and meter providers take once, when telemetry is built. Spans the full
    queue drops go to ``on_drop``.
    """

    name = "otlp"
    status = "otlp"

    def __init__(self, on_drop=None) -> None:
        self.on_drop = on_drop
        for signal in ("TRACES", "METRICS"):  # a missing extra is found when the sink is chosen
            module = "grpc" if _protocol(signal) == "grpc" else "http"
            try:
                __import__(f"opentelemetry.exporter.otlp.proto.{module}")
            except ImportError:
                raise MissingExtra("SPECTRACE_EXPORTER=otlp needs: pip install 'spectrace[otlp]'") from None

    def span_processor(self):
        return CountingBatchSpanProcessor(otlp_span_exporter(), on_drop=self.on_drop or (lambda n: None))

    def metric_reader(self):
        return otlp_metric_reader()
