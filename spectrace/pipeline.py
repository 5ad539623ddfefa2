"""The flush pipeline: what the hooks captured, in order, to every configured sink.

    hooks (spectrace.recorder) ─ append ─▶ Pipeline buffer ─ flush ─▶ sinks (exposition, store, lake, memory)

One :class:`Pipeline` per process (``Runtime.pipeline``). Its two sides:

Hot side (any thread)
    ``append`` / ``extend`` / ``extend_columns`` put rows of a ``records`` table into a
    bounded in-memory buffer under one lock (``note``: a value record of ``spectrace.values``, which only the
    metrics sink reads). Rows beyond ``max_buffer_rows`` are dropped
    and counted (``dropped``, and of it ``buffer_dropped``); nothing ever blocks the caller.

Flush (the background thread every ``flush_interval_s``, and on ``flush()`` / ``close()``)
    One explicit, ordered sequence — nothing depends on the order callbacks were registered in:

    1. **sources**: each capture drains what it holds into the buffer, in the order given
       (the verification drain, then the error counts, then the metric counters);
    2. **batch**: the buffer is taken and turned into one Arrow table per table and run
       (:class:`Batch`);
    3. **export**: every sink's ``export(batch)``, in the order given (a sink that raises is
       counted in ``errors`` and reported through ``on_error`` — the runtime's ``internal_errors``; the other sinks still get the batch);
    4. **maintenance**: every ``maintain_interval_s``, the ``maintain()`` of the sinks that
       have one (the store's compaction, retention and size cap), on the same thread.

A sink subclasses :class:`Sink`, which declares everything a sink can do with its default:
``export(batch)`` and ``close()``, ``maintain()``, ``stats()``, ``status`` (a line for the run
record), ``writing(run_id)`` (the run this process writes now), ``takes_tables`` (it stores the
records tables, so the runtime also turns spans into ``spans`` rows), ``metric_reader()`` (an
OpenTelemetry metric reader the process's meter provider adds) and ``span_processor()`` (one the
tracer provider adds). Sinks are chosen once, from ``spectrace.sinks.SINKS``, by
the names in ``SPECTRACE_EXPORTER`` (``spectrace.sinks.build``). A sink reports rows it could
not keep through ``Pipeline.count_dropped``, never by touching the pipeline's fields.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from spectrace.arrow_types import ARROW
from spectrace.buffer import RowBuffer
from spectrace.sink import Sink, Telemetry  # noqa: F401  (spectrace.pipeline.Sink: the name sinks use)
from spectrace.records import SCHEMA_VERSION, columns as table_columns
from spectrace.settings import Settings

log = logging.getLogger("vllm.spectrace")

# -- rows to Arrow ------------------------------------------------------------

_ARROW = ARROW  # one map from the records' DuckDB types to Arrow (spectrace.arrow_types)

# The tables a flush builds are kept by the store until its next compaction cycle. Kept in
# Arrow's default pool (mimalloc in the pyarrow wheels), they made every later write up to
# five times slower at batch 256 (bench/hotpath.py's drain table; the system and jemalloc
# pools show no slowdown): they are built in the system allocator's pool instead.
POOL = pa.system_memory_pool()


def arrow_schema(table: str) -> pa.Schema:
    return pa.schema(
        [(name, _ARROW[kind]) for name, kind in table_columns(table)],
        metadata={b"spectrace.schema_version": str(SCHEMA_VERSION).encode()},
    )


def to_arrow(table: str, rows: list[dict[str, Any]]) -> pa.Table:
    """Rows (dicts) to an Arrow table of ``table``'s schema; missing keys are NULL."""
    schema = arrow_schema(table)
    # One C++ pass over the dicts (a struct array), not a Python loop per column:
    # same per-field conversion, missing keys NULL, other keys ignored.
    arrays = pa.array(rows, type=pa.struct(schema), memory_pool=POOL).flatten(memory_pool=POOL)
    i = schema.get_field_index("schema_version")
    arrays[i] = pa.repeat(pa.scalar(SCHEMA_VERSION, type=schema.field(i).type), len(rows), memory_pool=POOL)
    return pa.Table.from_arrays(arrays, schema=schema)


_SEQUENCES = (list, tuple, np.ndarray, pa.Array)


def columns_to_arrow(table: str, columns: dict[str, Any], n: int) -> pa.Table:
    """Columns to an Arrow table of ``table``'s schema: each value is a sequence of ``n``
    values (list, tuple, NumPy array) or one value for every row; missing columns are NULL."""
    schema = arrow_schema(table)
    arrays = []
    for fld in schema:
        value = SCHEMA_VERSION if fld.name == "schema_version" else columns.get(fld.name)
        if isinstance(value, pa.Array):  # built by the producer (a mask for NULLs, say)
            arrays.append(value.cast(fld.type) if value.type != fld.type else value)
            continue
        if isinstance(value, _SEQUENCES):
            arrays.append(pa.array(value, type=fld.type, memory_pool=POOL))
        else:  # one value for every row (run, role, pid, host...): repeated in C, not converted n times
            arrays.append(pa.repeat(pa.scalar(value, type=fld.type), n, memory_pool=POOL))
    return pa.Table.from_arrays(arrays, schema=schema)


def _split_by_run(columns: dict[str, Any], n: int) -> list[tuple[dict[str, Any], int]]:
    """Column sets of one run each (run_id one value), in order of first appearance."""
    runs = columns.get("run_id")
    if not isinstance(runs, _SEQUENCES):
        return [(columns, n)]
    runs = list(runs)
    if runs.count(runs[0]) == n:
        return [({**columns, "run_id": runs[0]}, n)]
    rows_of: dict[Any, list[int]] = defaultdict(list)
    for i, run_id in enumerate(runs):
        rows_of[run_id].append(i)
    return [
        (
            {
                key: [value[i] for i in rows] if isinstance(value, _SEQUENCES) else value
                for key, value in {**columns, "run_id": run_id}.items()
            },
            len(rows),
        )
        for run_id, rows in rows_of.items()
    ]


# -- one flush's records --------------------------------------------------------


class Part:
    """One table's rows of one run in a flush, as one Arrow table."""

    __slots__ = ("table", "run_id", "arrow")

    def __init__(self, table: str, run_id: str, arrow: pa.Table) -> None:
        self.table = table
        self.run_id = run_id
        self.arrow = arrow

    @property
    def rows(self) -> int:
        return self.arrow.num_rows

    def __repr__(self) -> str:
        return f"Part({self.table!r}, {self.run_id!r}, {self.rows} rows)"


class Batch:
    """Everything one flush took from the buffer: a :class:`Part` per table and run, in the
    order tables were first appended to. Built once, handed to every sink (read only)."""

    def __init__(self, parts: list[Part], failed_rows: int = 0, periodic: bool = False, values: list | None = None) -> None:
        self.parts = parts
        self.values = values if values is not None else []  # spectrace.values records (the metrics sink reads them)
        self.failed_rows = failed_rows  # rows whose table could not be built (counted as dropped)
        self.periodic = periodic  # the flush thread's, on its interval (not one asked for, nor the last)

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)

    def __iter__(self) -> Iterator[Part]:
        return iter(self.parts)

    def __len__(self) -> int:
        return len(self.parts)

    def by_table(self) -> dict[str, list[pa.Table]]:
        tables: dict[str, list[pa.Table]] = defaultdict(list)
        for part in self.parts:
            tables[part.table].append(part.arrow)
        return dict(tables)


def _build(pending_rows: dict[str, list[dict[str, Any]]], pending_columns: dict[str, list[tuple[dict[str, Any], int]]]) -> Batch:
    parts: list[Part] = []
    failed = 0
    for table in {**pending_rows, **pending_columns}:
        rows = pending_rows.get(table, [])
        run_ids = [row.get("run_id") or "none" for row in rows]
        by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
        if run_ids and run_ids.count(run_ids[0]) == len(run_ids):
            by_run[run_ids[0]] = rows  # the usual case: one run, no regrouping
        else:
            for run_id, row in zip(run_ids, rows):
                by_run[run_id].append(row)
        column_sets: dict[str, list[tuple[dict[str, Any], int]]] = defaultdict(list)
        for columns, n in pending_columns.get(table, ()):
            column_sets[columns.get("run_id") or "none"].append((columns, n))
        for run_id in {**by_run, **column_sets}:
            run_rows, run_columns = by_run.get(run_id, []), column_sets.get(run_id, [])
            try:
                arrow_parts = [to_arrow(table, run_rows)] if run_rows or not run_columns else []
                arrow_parts += [columns_to_arrow(table, c, n) for c, n in run_columns]
                arrow = arrow_parts[0] if len(arrow_parts) == 1 else pa.concat_tables(arrow_parts, memory_pool=POOL)
            except Exception:
                failed += len(run_rows) + sum(n for _, n in run_columns)
                log.exception("spectrace: cannot build the %s batch; dropped and counted", table)
                continue
            if arrow.num_rows:
                parts.append(Part(table, run_id, arrow))
    return Batch(parts, failed)


# -- the pipeline -------------------------------------------------------------------


class Pipeline(RowBuffer):
    """A bounded buffer (``spectrace.buffer.RowBuffer``: the hot side), a flush thread and the ordered flush (module
    docstring)."""

    def __init__(
        self,
        *,
        flush_interval_s: float,
        max_buffer_rows: int,
        maintain_interval_s: float = 0.0,
        sources: Sequence[Callable[[], None]] = (),
        sinks: Sequence[Sink] = (),
        on_error: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        super().__init__(max_buffer_rows=max_buffer_rows)
        self.flush_interval_s = flush_interval_s
        self.maintain_interval_s = maintain_interval_s  # 0: no maintenance
        self.sources: list[Callable[[], None]] = list(sources)
        self.sinks: list[Sink] = list(sinks)
        self.telemetry: list[Telemetry] = []  # exporters the OpenTelemetry SDK schedules (OTLP): no batch for them
        self.flushes = 0
        self.rows_flushed = 0
        self.errors: dict[str, int] = {}  # "source.<name>" / "exporter.<sink>": failures, each counted
        self.on_error = on_error  # where a failure is reported (the runtime's internal_errors); else logged once
        self._flush_lock = threading.RLock()  # one flush or maintenance at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._maintained = time.monotonic()

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        sources: Sequence[Callable[[], None]] = (),
        sinks: Sequence[Sink] = (),
        on_error: Callable[[str, BaseException], None] | None = None,
    ) -> "Pipeline":
        return cls(
            flush_interval_s=settings.flush_interval_s,
            max_buffer_rows=settings.max_buffer_rows,
            maintain_interval_s=settings.compact_interval_s,
            sources=sources,
            sinks=sinks,
            on_error=on_error,
        )

    # -- hot side -------------------------------------------------------------

    def extend_columns(self, table: str, columns: dict[str, Any], n: int) -> None:
        """Append ``n`` rows given as columns (see ``columns_to_arrow``): no dict per row.

        For high-volume producers (the verification drain). Bounded and counted like
        ``extend`` (the rows beyond the bound are the last ones); rows are grouped by
        ``run_id`` (one value, or one per row) as ``extend``'s are.
        """
        if n <= 0:
            return
        with self._lock:
            room = self.max_buffer_rows - self._buffered
            if room < n:
                self._refused(n - max(room, 0))
                n = max(room, 0)
                if not n:
                    return
                columns = {key: value[:n] if isinstance(value, _SEQUENCES) else value for key, value in columns.items()}
            self._rows[table]  # noqa: B018  (keeps the order tables are handed to the sinks in)
            self._columns[table].extend(_split_by_run(columns, n))
            self._buffered += n

    # -- the flush --------------------------------------------------------------

    def add_sink(self, sink: Sink, *, first: bool = False) -> None:
        """Add a sink (``first``: before the others, as the metrics sink goes before the sinks that read them).

        Copy on write, no lock: a flush iterates the list it started with, and the runtime adds the metrics sink
        while it builds its telemetry under its own lock, which a flush's drain may wait for (taking the flush
        lock here deadlocked a worker right after its model loaded, once, under load)."""
        self.sinks = [sink, *self.sinks] if first else [*self.sinks, sink]

    def flush(self, *, periodic: bool = False) -> int:
        """Run the ordered flush now (``periodic``: the flush thread's, on its interval). Returns the number of rows
        handed to the sinks."""
        with self._flush_lock:
            for source in self.sources:  # 1. every capture into the buffer, in order
                try:
                    source()
                except Exception as exc:  # a capture must never stop the others or the sinks
                    self._failed(f"source.{getattr(source, '__name__', 'capture')}", exc)
            with self._lock:  # 2. take the buffer
                pending, self._rows = self._rows, defaultdict(list)
                pending_columns, self._columns = self._columns, defaultdict(list)
                values, self._values = self._values, []
                self._buffered = 0
            batch = _build(pending, pending_columns)
            batch.periodic = periodic
            batch.values = values
            if batch.failed_rows:
                self.count_dropped(batch.failed_rows)
            for sink in self.sinks:  # 3. every sink, in order
                try:
                    sink.export(batch)
                except Exception as exc:  # a sink never stops another sink or the pipeline
                    self._failed(f"exporter.{sink.name}", exc)
            self.flushes += 1
            self.rows_flushed += batch.rows
            return batch.rows

    def maintain(self) -> None:
        """4. The sinks' maintenance (the store's compaction, retention and cap); never raises."""
        with self._flush_lock:
            self._maintained = time.monotonic()
            for sink in self.sinks:
                try:
                    sink.maintain()
                except Exception as exc:
                    self._failed(f"exporter.{sink.name}", exc)

    def _failed(self, where: str, exc: BaseException) -> None:
        first = where not in self.errors
        self.errors[where] = self.errors.get(where, 0) + 1
        if self.on_error is not None:
            try:
                self.on_error(where, exc)
                return
            except Exception:
                pass
        if first:
            log.warning("spectrace: %s failed: %s: %s (counted; vLLM is unaffected)", where, type(exc).__name__, exc, exc_info=exc)

    # -- the thread -----------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="spectrace-flush", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            if self.paused:
                continue
            self.flush(periodic=True)
            if self.maintain_interval_s and time.monotonic() - self._maintained >= self.maintain_interval_s:
                self.maintain()

    def close(self) -> None:
        """Stop the thread, flush what is buffered, close every sink."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        self.flush()
        if self._buffered:  # rows a sink recorded during that flush (the store's evictions)
            self.flush()
        for sink in self.sinks:
            try:
                sink.close()
            except Exception:
                log.exception("spectrace: closing the %s sink failed", sink.name)

    def stats(self) -> dict[str, Any]:
        """The pipeline's counters and each sink's own (``stats()``, where it has one)."""
        out: dict[str, Any] = {
            "dropped": self.dropped,
            "buffer_dropped": self.buffer_dropped,
            "flushes": self.flushes,
            "rows_flushed": self.rows_flushed,
            "errors": dict(self.errors),
        }
        for sink in self.sinks:
            try:
                stats = sink.stats()
            except Exception as exc:
                stats = {"error": f"{type(exc).__name__}: {exc}"}
            if stats is not None:
                out[sink.name] = stats
        return out
