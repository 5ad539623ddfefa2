"""The collector: a source's records drained to rows, then the pipeline, then the sinks and the telemetry.

One code path wherever the flush runs (``SPECTRACE_PIPELINE``, chosen once, at the runtime's start-up):

- ``thread``: in the traced process, on a flush thread; the source is the hooks' own capture
  (``spectrace.recorder.verify.capture.Capture``);
- ``process``: in the pipeline process (``spectrace.collector.process``) the engine's shipper started; the source is
  the :class:`~spectrace.collector.inbox.Inbox` the typed shipments fill (``spectrace.recorder.wire.Shipment``).

The flush, in this order (``spectrace.pipeline``): the verification drain (``spectrace.collector.drain``: rows,
counts, value records and the run judge's findings), the hook error counts, the metric counters; then every sink
(first the metrics sink, ``spectrace.sinks.metrics.MetricsSink``, which alone turns the batch's records into
instruments), then the sinks' maintenance. The engine side of the other shape is
``spectrace.recorder.shipper.ShipperShape``: a runtime holds one of the two (``Runtime.shape``), and nothing else
asks which.
"""

from __future__ import annotations

import logging
from collections import deque

from spectrace import sinks as sink_registry
from spectrace.collector.drain import Drain

log = logging.getLogger("vllm.spectrace")


class Collector:
    """The shape that flushes here: a drain over ``source`` (None: no verification capture), the pipeline with its
    sinks, and the OpenTelemetry processors and metric readers they bring."""

    name = "flush thread"

    def __init__(self, rt, source) -> None:
        self.rt = rt
        self.drain = Drain(source) if source is not None else None
        self._facts: deque = deque()  # load-time readings waiting for the next flush's judge (flushes take turns)

    def pipeline(self):
        """The pipeline (its sources in order, the sinks of ``SPECTRACE_EXPORTER``) and each exporter's status."""
        rt = self.rt
        sources = [self._judge]
        sources += [self._drain] if self.drain is not None else []
        sources += [rt._flush_error_counts, rt._flush_metric_counters]
        return sink_registry.build(rt.settings, sources=sources, on_error=rt.count_error)

    def _drain(self) -> None:
        self.drain.drain(self.rt)

    def facts(self, facts) -> None:
        """A load-time hook's reading (``spectrace.load_facts.LoadFacts``: from this process's hooks, or shipped),
        judged in the next flush (``spectrace.collector.judging``)."""
        self._facts.append(facts)

    def _judge(self) -> None:
        from spectrace.collector import judging

        while self._facts:
            facts = self._facts.popleft()
            try:
                judging.judge(self.rt, facts)
            except Exception as exc:  # one reading that does not judge costs its own findings only
                self.rt.count_error(f"judge.{facts.kind}", exc)

    def telemetry(self, provider, resource) -> None:
        """The span processors (rows, OTLP) and metric readers (Prometheus, OTLP) of the sinks, and the metrics
        sink, first, once a reader exists."""
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        from spectrace.sinks.spans import SpanRows

        rt = self.rt
        pipeline = rt.pipeline
        readers = []
        if any(sink.takes_tables for sink in pipeline.sinks):
            rt._add_span_processor(SimpleSpanProcessor(SpanRows(pipeline)))
        for sink in [*pipeline.sinks, *pipeline.telemetry]:  # those that take spans or metrics from the SDK
            try:
                processor, reader = sink.span_processor(), sink.metric_reader()
                if processor is not None:
                    rt._add_span_processor(processor)
                if reader is not None:
                    readers.append(reader)
                rt.exporter_status[sink.name] = sink.status or sink.name
            except Exception as exc:
                rt.exporter_status[sink.name] = f"unavailable: {exc}"
                log.error("spectrace: the %s sink is unavailable: %s", sink.name, exc)
        if readers:
            from spectrace.sinks.metrics import Metrics, MetricsSink

            rt.metrics = Metrics(readers, resource)
            pipeline.add_sink(MetricsSink(rt.metrics, rt.labels, rt.run_k), first=True)

    def check_agreement(self, exclude: str | None = None) -> None:
        """The engine/worker agreement of every run but ``exclude`` (a run began, or the process ends)."""
        if self.drain is not None:
            self.drain.check_agreement(self.rt, exclude=exclude)

    def at_start(self, first: bool) -> None:
        """This process writes the store: it takes this host's exited shippers' loss ledgers, as a pipeline process
        does at its start (not a forked child: its parent took them)."""
        if first:
            from spectrace.recorder import losses

            losses.write_claimed(self.rt, self.rt.host)

    def at_shutdown(self) -> None:
        if self.rt.agreement_at_exit:  # a pipeline process whose engine ended without its last shipment: not judged
            self.check_agreement()
