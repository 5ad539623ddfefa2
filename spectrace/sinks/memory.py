"""An in-memory sink: every flush's records kept as Python rows, for tests.

The same role as the OpenTelemetry SDK's ``InMemorySpanExporter``: a test builds a
:class:`~spectrace.pipeline.Pipeline` (or a runtime) with a :class:`MemorySink`, drives a
capture, flushes, and asserts on whole records, without vLLM or a store on disk::

    sink = MemorySink()
    pipeline = Pipeline(flush_interval_s=1, max_buffer_rows=1000, sinks=[sink])
    ...
    pipeline.flush()
    assert sink.rows("verify_counts") == [...]
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from spectrace.pipeline import Batch, Sink


def _plain(table: pa.Table) -> pa.Table:
    """Timestamps as their integer nanoseconds (Python's datetime has microseconds only)."""
    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            table = table.set_column(i, field.name, table.column(i).cast(pa.int64()))
    return table


class MemorySink(Sink):
    name = "memory"
    status = "memory"
    takes_tables = True  # stores the records tables: the runtime turns spans into rows for it

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.closed = False

    def export(self, batch: Batch) -> None:
        if len(batch):
            self.batches.append(batch)

    def close(self) -> None:
        self.closed = True

    def rows(self, table: str, *, drop: tuple[str, ...] = ("schema_version",)) -> list[dict[str, Any]]:
        """Every row of ``table`` exported so far, in order, as dicts (``drop``: columns left out;
        timestamps as integer nanoseconds)."""
        out = []
        for batch in self.batches:
            for part in batch:
                if part.table == table:
                    out.extend({k: v for k, v in row.items() if k not in drop} for row in _plain(part.arrow).to_pylist())
        return out

    def table_names(self) -> set[str]:
        return {part.table for batch in self.batches for part in batch}

    def clear(self) -> None:
        self.batches.clear()
