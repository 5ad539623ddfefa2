"""The bounded buffer the hooks append to: rows of ``spectrace.records`` tables and value records, never blocking.

A leaf (no numpy, pyarrow or sink): an engine process that ships its records (``SPECTRACE_PIPELINE=process``) holds
only this (``spectrace.recorder.shipper.ShippingPipeline``); the flush (``spectrace.pipeline.Pipeline``) builds on it.

Any thread: ``append`` / ``extend`` put rows into the buffer under one lock, ``note`` a value record
(``spectrace.values``: not a table's row; only the metrics sink reads them). Rows beyond ``max_buffer_rows`` are
dropped and counted (``dropped``, and of it ``buffer_dropped``); nothing ever blocks the caller.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any, Iterable


class RowBuffer:
    """The hot side of a pipeline: a bounded buffer of rows and value records, and its drop counters."""

    def __init__(self, *, max_buffer_rows: int) -> None:
        self.max_buffer_rows = max_buffer_rows
        self.sinks: list = []  # where the buffer goes (none where it is shipped)
        self.dropped = 0  # rows lost anywhere: buffer full, a batch that could not be built, a sink's own drops
        self.buffer_dropped = 0  # of ``dropped``, the rows a full buffer refused (here or in the shipping engine process)
        self.paused = False  # tracing switched off at run time (spectrace.recorder.runtime.pause)
        self._rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._columns: dict[str, list[tuple[dict[str, Any], int]]] = defaultdict(list)
        self._values: list = []  # spectrace.values records since the last take (few: a handful a flush)
        self._buffered = 0
        self._lock = threading.Lock()  # the buffer (hot side)

    def append(self, table: str, row: dict[str, Any]) -> None:
        with self._lock:
            if self._buffered >= self.max_buffer_rows:
                self._refused(1)
                return
            self._rows[table].append(row)
            self._buffered += 1

    def extend(self, table: str, rows: Iterable[dict[str, Any]]) -> None:
        rows = list(rows)
        with self._lock:
            room = self.max_buffer_rows - self._buffered
            if room < len(rows):
                self._refused(len(rows) - max(room, 0))
                rows = rows[: max(room, 0)]
            self._rows[table].extend(rows)
            self._buffered += len(rows)

    def note(self, value: Any) -> None:
        """A value record (``spectrace.values``: not a table's row) for the next batch's ``values``: the metrics sink
        turns it into its instrument's series. Bounded like rows (a full buffer refuses it, counted)."""
        with self._lock:
            if len(self._values) >= self.max_buffer_rows:
                self._refused(1)
                return
            self._values.append(value)

    def count_dropped(self, n: int, *, buffer: bool = False) -> None:
        """Rows a sink or a capture could not keep (any thread); ``buffer``: a full buffer refused them (an engine
        process's, shipped)."""
        if n > 0:
            with self._lock:
                if buffer:
                    self._refused(n)
                else:
                    self.dropped += n

    def _refused(self, n: int) -> None:
        """``n`` rows a full buffer refused: counted in ``dropped`` and ``buffer_dropped`` (the lock held)."""
        self.dropped += n
        self.buffer_dropped += n

    def sink(self, name: str):
        return next((s for s in self.sinks if s.name == name), None)
