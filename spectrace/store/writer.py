"""Per-process Parquet segments: the DuckDB store's write side, a sink of the pipeline.

Every process writes its own files, never a file another process writes:
``<dir>/<table>/run=<run_id>/<host>-<pid>-<time_ns>-<seq>.parquet``. A segment is written
under a hidden temporary name and moved into place with ``os.replace``, so a
reader globbing ``*.parquet`` never sees half a file.

:class:`SegmentSink` receives each flush's :class:`~spectrace.pipeline.Batch` from the
pipeline (``export``) and writes one segment per table and run. Its ``maintain()``, which the
pipeline runs every ``SPECTRACE_COMPACT_INTERVAL``, merges this process's older segments into
few files per table and hour (``spectrace.store.compaction``) and applies the retention
(``SPECTRACE_RETENTION``) and the size cap (``SPECTRACE_MAX_MB``) to the store. Its settings
come from :class:`~spectrace.settings.Settings` (``from_settings``): it has no defaults of its own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from spectrace import identity
from spectrace.pipeline import Batch, Sink
from spectrace.settings import Settings
from spectrace import files
from spectrace.store import compaction

log = logging.getLogger("vllm.spectrace")


def _scandir(path) -> list:
    try:
        return [e for e in os.scandir(path) if not e.name.startswith(".")]
    except (FileNotFoundError, NotADirectoryError):
        return []


class SegmentSink(Sink):
    """Writes each flush's parts as Parquet segments; compacts, expires and caps the store."""

    name = "duckdb"
    takes_tables = True  # stores the records tables: the runtime turns spans into rows for it
    RECENT_ROWS = 500_000  # rows of written segments kept for the next compaction cycle

    def __init__(
        self,
        root: Path,
        *,
        host: str,
        max_bytes: int,
        retention_s: float,
        compact: bool,
        flush_interval_s: float,
        on_drop: Callable[[int], None] | None = None,
        record: Callable[[str, dict[str, Any]], None] | None = None,
        group: bool = False,
        durable: bool = True,
    ) -> None:
        self.root = Path(root)
        self.host = host
        self.max_bytes = max_bytes  # 0: no cap (SPECTRACE_MAX_MB)
        self.retention_s = retention_s  # 0: keep everything (SPECTRACE_RETENTION)
        self.compact = compact  # False: maintain() applies retention and the cap only (SPECTRACE_COMPACT_INTERVAL=0)
        self.flush_interval_s = flush_interval_s  # spaces the cap's scans between cycles
        self.on_drop = on_drop  # rows this sink could not write (the pipeline counts them)
        self.record = record  # rows this sink records about itself (store_evictions), into the next flush
        self.folder_mode, self.file_mode = files.modes(group)  # SPECTRACE_STORE_GROUP
        self.durable = durable  # fsync each segment before its rename, and its folder after
        self.status = str(self.root)
        self.write_errors = 0
        self.segments_written = 0
        self.dropped = 0
        self._io_lock = threading.Lock()  # the newest segment time, between a flush and maintenance
        self._seq = 0
        self._error_logged = False
        self.active_runs: set[str] = set()  # runs this process still writes: never evicted
        self._cap_checked = 0.0
        self._over_cap = False
        self._cap_logged = False
        self.clock = time.time_ns  # names segments; a benchmark replays a week with its own
        self.start_ns = self.clock()
        self._last_t = 0  # the newest segment time this writer named (strictly increasing)
        self._store_bytes = -1  # at the last scan of the store plus what this process wrote since; -1: not scanned
        self.compactions = 0
        self.compaction_cpu_s = 0.0
        self.compaction_errors = 0
        # the raw segments written since the last cycle, as written: the cycle merges them
        # without reading them back (bounded; beyond it the cycle reads them from disk)
        self._recent: dict[Path, pa.Table] = {}
        self._recent_rows = 0
        self._folders: set[Path] = set()  # run folders known to exist

    @classmethod
    def from_settings(cls, settings: Settings, *, on_drop=None, record=None) -> "SegmentSink":
        return cls(
            settings.dir,
            host=settings.host,
            max_bytes=int(settings.max_mb * 1e6),
            retention_s=settings.retention_s,
            compact=settings.compact_interval_s > 0,
            flush_interval_s=settings.flush_interval_s,
            on_drop=on_drop,
            record=record,
            group=settings.store_group,
        )

    def writing(self, run_id: str) -> None:
        """This process writes ``run_id`` now: the size cap never evicts it (an earlier run may go)."""
        self.active_runs = {run_id}

    def _dropped(self, n: int) -> None:
        self.dropped += n
        if self.on_drop is not None:
            self.on_drop(n)

    def _evicted(self, row: dict[str, Any]) -> None:
        if self.record is not None:
            self.record("store_evictions", row)

    # -- the pipeline's calls ----------------------------------------------------

    def export(self, batch: Batch) -> None:
        """One segment per table and run of the batch (from the pipeline's flush)."""
        if (
            self.max_bytes
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
        with self._io_lock:
            written = {folder for part in batch if (folder := self._write(part.table, part.run_id, part.arrow))}
            if self.durable:
                for folder in written:  # the renames: once per folder and flush
                    try:
                        files.sync_folder(folder)
                    except OSError:
                        pass  # the segment is written; only its durability across a crash is not known

    def maintain(self) -> None:
        """One compaction cycle of this process's own segments, then retention and the cap.

        The pipeline runs it on the flush thread between flushes; never raises (errors are
        logged once and counted). Holds the write lock only to read the newest segment time.
        """
        cpu = time.thread_time()
        try:
            with self._io_lock:  # every segment named so far is on disk; later ones are named after `now`
                newest, now = self._last_t, self.clock()
            key, start = f"{self.host}-{identity.pid()}", self.start_ns
            if self.retention_s:  # before merging: nothing is merged only to be removed
                expired = compaction.expire(self.root, self.clock() - int(self.retention_s * 1e9))
                for record in expired:
                    log.warning(
                        "spectrace: SPECTRACE_RETENTION: removed %d files (%.1f MB) of run %s older than %.0f s",
                        record["segments"], record["bytes"] / 1e6, record["evicted_run_id"], self.retention_s,
                    )
                    self._evicted({"ts": self.clock(), "reason": "retention", **record})
            if self.compact:
                compaction.Compactor(
                    self.root,
                    lambda seg: seg.writer == key and start <= seg.lo and seg.hi <= newest,
                    closed=lambda hour, _: (hour + 1) * compaction.HOUR_NS <= now,
                    clock=self.clock,
                    cache=self._recent,
                ).cycle()
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
        self._recent, self._recent_rows = {}, 0

    def stats(self) -> dict[str, Any]:
        return {
            "segments_written": self.segments_written,
            "write_errors": self.write_errors,
            "dropped": self.dropped,
            "compactions": self.compactions,
            "compaction_errors": self.compaction_errors,
            "compaction_cpu_s": round(self.compaction_cpu_s, 4),
        }

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
        uid = files.owner(self.root)
        for run_dir in compaction.run_folders(self.root):
            for entry in _scandir(run_dir):
                if not compaction.owned_file(entry, uid):
                    continue  # another user's file is neither counted nor removed
                try:
                    stat = entry.stat(follow_symlinks=False)
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
            self._evicted(
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

    def _widened(self, path: Path, mode: int) -> None:
        log.warning("spectrace: %s was mode %04o (writable by other users); made %04o", path, mode, self.folder_mode)

    def _write_file(self, folder: Path, name: str, arrow: pa.Table) -> None:
        # built in memory and written in one piece: pyarrow writing to the file made ~60 small writes and ~35 seeks
        buffer = pa.BufferOutputStream()
        pq.write_table(arrow, buffer)
        content = buffer.getvalue()
        for attempt in (1, 2):
            if folder not in self._folders:
                files.make_folder(folder, self.root, self.folder_mode, self._widened)
                self._folders.add(folder)
            try:
                files.write_durably(folder / f".{name}.tmp", folder / name, self.file_mode,
                                    lambda out: out.write(content), sync=self.durable)
                return
            except FileNotFoundError:  # the folder was removed under us (the store deleted): make it again
                self._folders.discard(folder)
                if attempt == 2:
                    raise

    def _write(self, table: str, run_id: str, arrow: pa.Table) -> Path | None:
        """Write one segment; its folder, or None when the rows were dropped (counted)."""
        count = arrow.num_rows
        if self._over_cap:
            self._dropped(count)
            return None
        folder = self.root / table / f"run={run_id}"
        self._seq += 1
        # the name's time orders this writer's segments for compaction: strictly increasing
        self._last_t = max(self.clock(), self._last_t + 1)
        name = f"{self.host}-{identity.pid()}-{self._last_t}-{self._seq:06d}.parquet"
        try:
            self._write_file(folder, name, arrow)
            if self.compact and self._recent_rows + arrow.num_rows <= self.RECENT_ROWS:
                self._recent[folder / name] = arrow
                self._recent_rows += arrow.num_rows
            if self.max_bytes and self._store_bytes >= 0:
                self._store_bytes += (folder / name).stat().st_size
        except Exception as exc:
            self.write_errors += 1
            self._dropped(count)
            if not self._error_logged:
                self._error_logged = True
                log.error(
                    "spectrace: cannot write to SPECTRACE_DIR=%s (%s); records are "
                    "dropped and counted, vLLM is unaffected",
                    self.root,
                    exc,
                )
            return None
        self.segments_written += 1
        return folder
