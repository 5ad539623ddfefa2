"""The lake sink (``SPECTRACE_EXPORTER=lake``): every flush's rows into one DuckLake.

The pipeline's flush builds one Arrow table per table and run and hands the batch to
``LakeSink.export``, which inserts them all in one transaction. The engine's threads
only append to the pipeline's buffer: they never wait on the catalog.

Catalog down or slow: the rows stay pending, up to ``max_rows``; beyond that new
rows are dropped and counted (``on_drop``: the pipeline's ``dropped``, hence
``spectrace.export.dropped``). One log line when the catalog goes away, one when
it is back; retries back off up to ``RETRY_MAX_S``. Never raises.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any, Callable

import pyarrow as pa

from spectrace import lake
from spectrace.redact import remember
from spectrace.pipeline import Batch, Sink
from spectrace.settings import Settings

log = logging.getLogger("vllm.spectrace")

RETRY_MAX_S = 10.0


class LakeSink(Sink):
    name = "lake"
    status = "lake"
    takes_tables = True  # stores the records tables: the runtime turns spans into rows for it

    def __init__(
        self,
        catalog: str,
        *,
        data_path: str | None = None,
        max_rows: int = 200_000,
        on_drop: Callable[[int], None] | None = None,
    ) -> None:
        remember(catalog)  # its password never reaches a log line or a record (spectrace.redact)
        self.catalog = catalog
        self.data_path = data_path
        self.max_rows = max_rows
        self.on_drop = on_drop
        self.con = None
        self._pending: list[tuple[str, pa.Table]] = []
        self.pending_rows = 0
        self.rows_written = 0
        self.commits = 0
        self.failures = 0
        self.dropped = 0
        self.commit_seconds: list[float] = []  # the last 1000 commits (write latency)
        self.connect_seconds: list[float] = []  # each (re)connection: extensions, ATTACH, tables
        self.down_since: float | None = None
        self._retry_at = 0.0
        self._backoff = 0.0
        self.last_error: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings, *, on_drop: Callable[[int], None] | None = None) -> "LakeSink":
        """The lake sink of these settings; raises ``LakeError`` when it cannot run at all."""
        if not settings.lake:
            raise lake.LakeError("SPECTRACE_EXPORTER has lake but SPECTRACE_LAKE is not set")
        for name in lake.EXTENSIONS:
            lake.extension_file(name)
        return cls(settings.lake, data_path=settings.lake_data, max_rows=settings.max_buffer_rows, on_drop=on_drop)

    # -- called from the flush thread ------------------------------------------

    def export(self, batch: Batch) -> None:
        """Queue the batch's parts and insert everything pending in one transaction."""
        for part in batch:
            self.add(part.table, part.arrow)
        self.commit()

    def add(self, table: str, rows: pa.Table) -> None:
        n = rows.num_rows
        if not n:
            return
        if self.pending_rows + n > self.max_rows:
            self.dropped += n
            if self.on_drop is not None:
                self.on_drop(n)
            return
        self._pending.append((table, rows))
        self.pending_rows += n

    def commit(self) -> int:
        """Insert everything pending in one transaction. Returns the rows written (0 on failure)."""
        if not self._pending or time.monotonic() < self._retry_at:
            return 0
        try:
            if self.con is None:
                started = time.perf_counter()
                self.con = lake.connect(self.catalog, data_path=self.data_path)
                lake.ensure_tables(self.con)
                self.connect_seconds.append(round(time.perf_counter() - started, 4))
            started = time.perf_counter()
            self._insert(self.con)
        except Exception as exc:  # the catalog, the network, the data path: never the engine's problem
            self._failed(exc)
            return 0
        elapsed = time.perf_counter() - started
        written, self._pending, self.pending_rows = self.pending_rows, [], 0
        self.rows_written += written
        self.commits += 1
        self.commit_seconds = [*self.commit_seconds[-999:], elapsed]
        if self.down_since is not None:
            log.warning(
                "spectrace: lake catalog back after %.0f s; writing again (%d rows dropped so far)",
                time.monotonic() - self.down_since, self.dropped,
            )
            self.down_since = None
        self._backoff = 0.0
        return written

    def _insert(self, con) -> None:
        by_table: dict[str, list[pa.Table]] = defaultdict(list)
        for table, rows in self._pending:
            by_table[table].append(rows)
        con.execute("BEGIN")
        try:
            for table, parts in by_table.items():
                batch = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
                con.register("spectrace_batch", batch)
                try:
                    con.execute(f"INSERT INTO {lake.ALIAS}.{table} BY NAME SELECT * FROM spectrace_batch")
                finally:
                    con.unregister("spectrace_batch")
            con.execute("COMMIT")
        except BaseException:
            try:
                con.execute("ROLLBACK")
            except Exception:
                pass
            raise

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        self.last_error = lake.first_line(exc)
        self._close_connection()
        self._backoff = min(max(self._backoff * 2, 1.0), RETRY_MAX_S)
        self._retry_at = time.monotonic() + self._backoff
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.error(
                "spectrace: cannot write to the lake (SPECTRACE_LAKE): %s; keeping up to %d rows, then "
                "dropping and counting them until the catalog is back; vLLM is unaffected",
                self.last_error, self.max_rows,
            )

    def _close_connection(self) -> None:
        con, self.con = self.con, None
        if con is not None:
            try:
                con.close()
            except Exception:
                pass

    def close(self) -> None:
        """Last try for what is pending (shutdown), then release the connection."""
        self._retry_at = 0.0
        self.commit()
        if self._pending:
            n = self.pending_rows
            self.dropped += n
            if self.on_drop is not None:
                self.on_drop(n)
            self._pending, self.pending_rows = [], 0
        self._close_connection()

    def stats(self) -> dict[str, Any]:
        latencies = sorted(self.commit_seconds)

        def pct(q: float) -> float | None:
            return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 4) if latencies else None

        return {
            "rows_written": self.rows_written,
            "commits": self.commits,
            "failures": self.failures,
            "dropped": self.dropped,
            "pending_rows": self.pending_rows,
            "commit_p50_s": pct(0.5),
            "commit_p99_s": pct(0.99),
            "commit_max_s": round(latencies[-1], 4) if latencies else None,
            "connect_s": self.connect_seconds[-10:],
            "last_error": self.last_error,
        }
