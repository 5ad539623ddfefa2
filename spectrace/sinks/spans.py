"""Spans as rows of the ``spans`` table: an OpenTelemetry span exporter into the pipeline.

``export`` only converts each finished span to a row and appends it to the pipeline's
buffer; the pipeline's flush hands it to the table sinks (the store, the lake) with
every other table. The row has the shape of the OpenTelemetry Collector's ClickHouse
``otel_traces`` table.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from spectrace.pipeline import Pipeline


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def _plain(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return list(value)
    return value


def span_row(span: ReadableSpan) -> dict[str, Any]:
    attributes = {k: _plain(v) for k, v in (span.attributes or {}).items()}
    resource = {k: _plain(v) for k, v in span.resource.attributes.items()}
    ctx = span.get_span_context()
    rank = attributes.get("spectrace.rank", resource.get("spectrace.rank"))
    return {
        "run_id": attributes.get("spectrace.run_id", resource.get("spectrace.run_id")),
        "process_role": attributes.get("spectrace.process.role"),
        "pid": resource.get("process.pid"),
        "host": resource.get("host.name"),
        "rank": rank,
        "trace_id": _hex(ctx.trace_id, 32),
        "span_id": _hex(ctx.span_id, 16),
        "parent_span_id": _hex(span.parent.span_id, 16) if span.parent else "",
        "name": span.name,
        "kind": span.kind.name,
        "service_name": resource.get("service.name"),
        "start_time": span.start_time,
        "end_time": span.end_time,
        "status_code": span.status.status_code.name,
        "status_message": span.status.description or "",
        "attributes": json.dumps(attributes, default=str),
        "resource_attributes": json.dumps(resource, default=str),
        "events": json.dumps(
            [
                {
                    "name": e.name,
                    "timestamp": e.timestamp,
                    "attributes": {k: _plain(v) for k, v in (e.attributes or {}).items()},
                }
                for e in span.events
            ],
            default=str,
        ),
        "links": json.dumps(
            [
                {
                    "trace_id": _hex(link.context.trace_id, 32),
                    "span_id": _hex(link.context.span_id, 16),
                    "attributes": {k: _plain(v) for k, v in (link.attributes or {}).items()},
                }
                for link in span.links
            ],
            default=str,
        ),
    }


class SpanRows(SpanExporter):
    """Appends finished spans to the pipeline's ``spans`` table."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.pipeline.extend("spans", [span_row(s) for s in spans])
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.pipeline.flush()
        return True

    def shutdown(self) -> None:
        self.pipeline.flush()
