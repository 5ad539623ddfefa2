"""Per-process Parquet segments: the DuckDB store's write side.

Every process writes its own files, never a file another process writes:
``<dir>/<table>/run=<run_id>/<host>-<pid>-<time_ns>-<seq>.parquet``. A segment is written
under a hidden temporary name and moved into place with ``os.replace``, so a
reader globbing ``*.parquet`` never sees half a file.

Appends only touch an in-memory list under a lock; a background thread writes
every ``flush_interval_s``. The buffer is bounded: rows beyond
``max_buffer_rows`` are dropped and counted (``dropped``), never block the caller.

Other table sinks (``sinks``: the lake) receive the same Arrow table per table and
run from the flush (``add(table, arrow_table)``, then ``commit()`` once per flush);
``parquet = False`` leaves the segments unwritten when only such a sink is configured.

Every ``compact_interval_s`` the same thread merges this process's older segments into
few files per table and hour (``spectrace.store.compaction``) and applies the
retention (``retention_s``) and the size cap (``max_bytes``) to the store.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from spectrace.store import compaction
from spectrace.records import SCHEMA_VERSION, columns
from spectrace.settings import Settings

log = logging.getLogger("vllm.spectrace")

_ARROW = {
    "VARCHAR": pa.string(),
    "JSON": pa.string(),
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "TIMESTAMP_NS": pa.timestamp("ns"),
}


def _scandir(path) -> list:
    try:
        return [e for e in os.scandir(path) if not e.name.startswith(".")]
    except (FileNotFoundError, NotADirectoryError):
        return []


def arrow_schema(table: str) -> pa.Schema:
    return pa.schema(
        [(name, _ARROW[kind]) for name, kind in columns(table)],
        metadata={b"spectrace.schema_version": str(SCHEMA_VERSION).encode()},
    )


# The tables a flush builds are kept until the next compaction cycle (``SegmentWriter._recent``).
# Kept in Arrow's default pool (mimalloc in the pyarrow wheels), they made every later write up to
# five times slower at batch 256 (bench/hotpath.py's drain table; the system and jemalloc pools show
# no slowdown): they are built in the system allocator's pool instead.
POOL = pa.system_memory_pool()


def to_arrow(table: str, rows: list[dict[str, Any]]) -> pa.Table:
    """Rows (dicts) to an Arrow table of ``table``'s schema; missing keys are NULL."""
    schema = arrow_schema(table)
    # One C++ pass over the dicts (a struct array), not a Python loop per column:
    # same per-field conversion, missing keys NULL, other keys ignored.
    arrays = pa.array(rows, type=pa.struct(schema), memory_pool=POOL).flatten(memory_pool=POOL)
    i = schema.get_field_index("schema_version")
    arrays[i] = pa.array([SCHEMA_VERSION] * len(rows), type=schema.field(i).type, memory_pool=POOL)
    return pa.Table.from_arrays(arrays, schema=schema)


_SEQUENCES = (list, tuple, np.ndarray)


def columns_to_arrow(table: str, columns: dict[str, Any], n: int) -> pa.Table:
    """Columns to an Arrow table of ``table``'s schema: each value is a sequence of ``n``
    values (list, tuple, NumPy array) or one value for every row; missing columns are NULL."""
    schema = arrow_schema(table)
    arrays = []
    for fld in schema:
        value = SCHEMA_VERSION if fld.name == "schema_version" else columns.get(fld.name)
        arrays.append(pa.array(value if isinstance(value, _SEQUENCES) else [value] * n, type=fld.type, memory_pool=POOL))
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


class SegmentWriter:
    """Buffers rows per table and writes them as Parquet segments in the background."""

    RECENT_ROWS = 500_000  # rows of written segments kept for the next compaction cycle

    def __init__(
        self,
        root: Path,
        *,
        host: str,
        flush_interval_s: float = Settings.flush_interval_s,
        max_buffer_rows: int = Settings.max_buffer_rows,
    ) -> None:
        self.root = Path(root)
        self.host = host
        self.enabled = True  # False: rows are aggregated and exported elsewhere, never written
        self.parquet = True  # False: rows go to ``sinks`` only, no segment is written
        self.sinks: list = []  # add(table, arrow_table) per table x run, commit() per flush
        self.flush_interval_s = flush_interval_s
        self.max_buffer_rows = max_buffer_rows
        self.dropped = 0
        self.write_errors = 0
        self.segments_written = 0
        self._rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._columns: dict[str, list[tuple[dict[str, Any], int]]] = defaultdict(list)  # extend_columns
        self._buffered = 0
        self._lock = threading.Lock()
        self._io_lock = threading.Lock()
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error_logged = False
        self._before_flush: list = []
        self.paused = False
        self.max_bytes = 0  # 0: no cap (SPECTRACE_MAX_MB)
        self.active_runs: set[str] = set()  # runs this process still writes: never evicted
        self.evictions: list[dict[str, Any]] = []
        self._cap_checked = 0.0
        self._over_cap = False
        self._cap_logged = False
        self.compact_interval_s = 0.0  # 0: this process never compacts (SPECTRACE_COMPACT_INTERVAL)
        self.retention_s = 0.0  # 0: keep everything (SPECTRACE_RETENTION)
        self.clock = time.time_ns  # names segments; a benchmark replays a week with its own
        self.start_ns = self.clock()
        self._last_t = 0  # the newest segment time this writer named (strictly increasing)
        self._maintained = time.monotonic()
        self._store_bytes = -1  # at the last scan of the store plus what this process wrote since; -1: not scanned
        self.compactions = 0
        self.compaction_cpu_s = 0.0
        self.compaction_errors = 0
        # the raw segments written since the last cycle, as written: the cycle merges them
        # without reading them back (bounded; beyond it the cycle reads them from disk)
        self._recent: dict[Path, pa.Table] = {}
        self._recent_rows = 0
        self._folders: set[Path] = set()  # run folders known to exist

    # -- hot side -------------------------------------------------------------

    def append(self, table: str, row: dict[str, Any]) -> None:
        with self._lock:
            if self._buffered >= self.max_buffer_rows:
                self.dropped += 1
                return
            self._rows[table].append(row)
            self._buffered += 1

    def extend(self, table: str, rows: Iterable[dict[str, Any]]) -> None:
        rows = list(rows)
        with self._lock:
            room = self.max_buffer_rows - self._buffered
            if room < len(rows):
                self.dropped += len(rows) - max(room, 0)
                rows = rows[: max(room, 0)]
            self._rows[table].extend(rows)
            self._buffered += len(rows)

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
                self.dropped += n - max(room, 0)
                n = max(room, 0)
                if not n:
                    return
                columns = {key: value[:n] if isinstance(value, _SEQUENCES) else value for key, value in columns.items()}
            self._rows[table]  # noqa: B018  (keeps the order tables are written in at flush)
            self._columns[table].extend(_split_by_run(columns, n))
            self._buffered += n

    def on_flush(self, callback) -> None:
        """Call ``callback()`` at the start of every flush (to drain aggregators)."""
        self._before_flush.append(callback)

    # -- background side ------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="spectrace-flush", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            if self.paused:  # tracing switched off at run time (spectrace.tracer.runtime.pause)
                continue
            self.flush()
            if self.compact_interval_s and time.monotonic() - self._maintained >= self.compact_interval_s:
                self.maintain()

    def maintain(self) -> None:
        """One compaction cycle of this process's own segments, then retention and the cap.

        Runs on the flush thread between flushes; never raises (errors are logged once
        and counted). Holds the write lock only to read the newest segment time.
        """
        self._maintained = time.monotonic()
        if not (self.enabled and self.parquet):
            return
        cpu = time.thread_time()
        try:
            with self._io_lock:  # every segment named so far is on disk; later ones are named after `now`
                newest, now = self._last_t, self.clock()
            key, start = f"{self.host}-{os.getpid()}", self.start_ns
            compactor = compaction.Compactor(
                self.root,
                lambda seg: seg.writer == key and start <= seg.lo and seg.hi <= newest,
                closed=lambda hour, _: (hour + 1) * compaction.HOUR_NS <= now,
                clock=self.clock,
                cache=self._recent,
            )
            if self.retention_s:  # before merging: nothing is merged only to be removed
                expired = compaction.expire(self.root, self.clock() - int(self.retention_s * 1e9))
                for record in expired:
                    log.warning(
                        "spectrace: SPECTRACE_RETENTION: removed %d files (%.1f MB) of run %s older than %.0f s",
                        record["segments"], record["bytes"] / 1e6, record["evicted_run_id"], self.retention_s,
                    )
                    self.evictions.append({"ts": self.clock(), "reason": "retention", **record})
            compactor.cycle()
            self.compactions += 1
            if self.max_bytes:
                self._cap_checked = time.time()
                self.enforce_cap()
        except Exception:
            self.compaction_errors += 1
            if self.compaction_errors == 1:
                log.exception("spectrace: compacting the store at %s failed (vLLM is unaffected)", self.root)
        finally:
            self._recent, self._recent_rows = {}, 0  # merged now, or read from disk next time
            self.compaction_cpu_s += time.thread_time() - cpu

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        self.flush()
        for sink in self.sinks:
            try:
                sink.close()
            except Exception:
                log.exception("spectrace: closing %s failed", type(sink).__name__)

    def flush(self) -> int:
        """Write every buffered row now. Returns the number of rows written."""
        for callback in list(self._before_flush):
            try:
                callback()
            except Exception:  # an aggregator must never stop the store
                log.exception("spectrace: flush callback failed")
        with self._io_lock:
            with self._lock:
                pending, self._rows = self._rows, defaultdict(list)
                pending_columns, self._columns = self._columns, defaultdict(list)
                self._buffered = 0
            written = 0
            if not self.enabled:
                return 0
            if (
                self.max_bytes
                and self.parquet
                and time.time() - self._cap_checked >= 5 * self.flush_interval_s
                # the store is scanned at each compaction cycle; in between only when this process's own
                # writes may have crossed the cap (or once a minute, for what other processes wrote)
                and (
                    not 0 <= self._store_bytes <= self.max_bytes
                    or time.time() - self._cap_checked >= 60 * self.flush_interval_s
                )
            ):
                self._cap_checked = time.time()
                try:
                    self.enforce_cap()
                except Exception:
                    log.exception("spectrace: enforcing SPECTRACE_MAX_MB failed")
            if self.evictions:  # from the cap, and from the compaction cycle's retention
                evicted, self.evictions = self.evictions, []
                pending["store_evictions"].extend(evicted)
            for table in {**pending, **pending_columns}:
                rows = pending.get(table, [])
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
                    if self._write(table, run_id, run_rows, run_columns):
                        written += len(run_rows) + sum(n for _, n in run_columns)
            for sink in self.sinks:
                try:
                    sink.commit()
                except Exception:  # a sink never stops the store
                    log.exception("spectrace: %s commit failed", type(sink).__name__)
            return written

    # -- size cap ---------------------------------------------------------------

    def enforce_cap(self, *, finished_after_s: float = 30.0) -> None:
        """Keep the store under ``max_bytes``: remove the oldest finished runs' segments.

        A run is finished for this purpose when no process has written a segment of
        it for ``finished_after_s`` seconds and this process is not writing it. When
        only active runs remain and the store is still over the cap, new rows are
        dropped (and counted) until there is room again.
        """
        if not self.max_bytes:
            return
        runs: dict[str, list[tuple[Path, int, float]]] = defaultdict(list)
        total = 0
        for table_dir in _scandir(self.root):
            for run_dir in _scandir(table_dir):
                for entry in _scandir(run_dir):
                    try:
                        stat = entry.stat()
                    except OSError:
                        continue
                    total += stat.st_size
                    runs[run_dir.name.removeprefix("run=")].append((Path(entry.path), stat.st_size, stat.st_mtime))
        self._store_bytes = total
        if total <= self.max_bytes:
            self._over_cap = False
            return
        now = time.time()
        candidates = sorted(
            (max(m for _, _, m in files), run_id)
            for run_id, files in runs.items()
            if run_id not in self.active_runs and now - max(m for _, _, m in files) >= finished_after_s
        )
        for _, run_id in candidates:
            if total <= self.max_bytes:
                break
            removed = freed = 0
            for path, size, _ in runs[run_id]:
                try:
                    path.unlink()
                except FileNotFoundError:
                    continue
                removed += 1
                freed += size
            total -= freed
            log.warning(
                "spectrace: store over SPECTRACE_MAX_MB (%.1f MB): removed %d segments (%.1f MB) of finished run %s",
                self.max_bytes / 1e6, removed, freed / 1e6, run_id,
            )
            self.evictions.append(
                {"ts": self.clock(), "evicted_run_id": run_id, "segments": removed, "bytes": freed, "reason": "max_mb"}
            )
        self._store_bytes = total
        self._over_cap = total > self.max_bytes
        if self._over_cap and not self._cap_logged:
            self._cap_logged = True
            log.error(
                "spectrace: store at %s is over SPECTRACE_MAX_MB with only active runs left; new records are "
                "dropped and counted until there is room",
                self.root,
            )

    @staticmethod
    def _arrow(table: str, rows: list[dict[str, Any]], column_sets) -> pa.Table:
        parts = [to_arrow(table, rows)] if rows or not column_sets else []
        parts += [columns_to_arrow(table, columns, n) for columns, n in column_sets]
        return parts[0] if len(parts) == 1 else pa.concat_tables(parts, memory_pool=POOL)

    def _write_file(self, folder: Path, tmp: Path, arrow: pa.Table) -> None:
        for attempt in (1, 2):
            if folder not in self._folders:
                folder.mkdir(parents=True, exist_ok=True)
                self._folders.add(folder)
            try:
                with pa.OSFile(str(tmp), "wb") as sink:  # a third less CPU than a path (no filesystem lookup)
                    pq.write_table(arrow, sink)
                return
            except FileNotFoundError:  # the folder was removed under us (the store deleted): make it again
                self._folders.discard(folder)
                if attempt == 2:
                    raise

    def _write(
        self, table: str, run_id: str, rows: list[dict[str, Any]], column_sets: list[tuple[dict[str, Any], int]] = ()
    ) -> bool:
        count = len(rows) + sum(n for _, n in column_sets)
        if self.sinks:
            try:
                arrow = self._arrow(table, rows, column_sets)
            except Exception:
                self.write_errors += 1
                self.dropped += count
                log.exception("spectrace: cannot build the %s batch; dropped and counted", table)
                return False
            for sink in self.sinks:
                sink.add(table, arrow)
            if not self.parquet:
                return True
        if self._over_cap:
            self.dropped += count
            return False
        folder = self.root / table / f"run={run_id}"
        self._seq += 1
        # the name's time orders this writer's segments for compaction: strictly increasing
        self._last_t = max(self.clock(), self._last_t + 1)
        name = f"{self.host}-{os.getpid()}-{self._last_t}-{self._seq:06d}.parquet"
        tmp = folder / f".{name}.tmp"
        try:
            arrow = arrow if self.sinks else self._arrow(table, rows, column_sets)
            self._write_file(folder, tmp, arrow)
            os.replace(tmp, folder / name)
            if self.compact_interval_s and self._recent_rows + arrow.num_rows <= self.RECENT_ROWS:
                self._recent[folder / name] = arrow
                self._recent_rows += arrow.num_rows
            if self.max_bytes and self._store_bytes >= 0:
                self._store_bytes += (folder / name).stat().st_size
        except Exception as exc:
            self.write_errors += 1
            self.dropped += count
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            if not self._error_logged:
                self._error_logged = True
                log.error(
                    "spectrace: cannot write to SPECTRACE_DIR=%s (%s); records are "
                    "dropped and counted, vLLM is unaffected",
                    self.root,
                    exc,
                )
            return False
        self.segments_written += 1
        return True
