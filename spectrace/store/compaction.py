"""Compaction of the segment store: few large files per writer, table and hour.

Every flush writes one raw segment per table and run (``segments.py``):
``<table>/run=<run>/<host>-<pid>-<t>-<seq>.parquet``, ``t`` the writer's clock in ns
(strictly increasing per writer). Compaction merges a writer's raw segments into

- *part* files, ``<host>-<pid>-<lo>-<hi>-<made>.part.parquet``: the writer's raw segments
  with ``lo <= t <= hi`` of one hour, one per compaction cycle;
- *hour* files, ``<host>-<pid>-<lo>-<hi>-<made>.hour.parquet``: everything of the writer
  in that hour (its parts and raw segments), once the hour is over. Never merged again.

``made`` is the time the file was written. The files it merged stay on disk until it
has been *ready* (``made`` older than ``READY_S``) for another ``READY_S``; then the
compactor deletes them.

Why a reader never counts a row twice or misses one (``spectrace.store.read``): a
query keeps a file when it is an hour file that is ready, or a raw or part file that is
ready (raw files always are) and covered by no other ready compacted file of the same
writer in the same folder (``covers``). Rows live in one raw segment and, later, in
compacted files whose ranges nest, so for any ``now`` exactly one kept file holds a
row: the widest ready file covering it, else its raw segment. The rule reads only file
names and ``now`` (the reader lists the files in Python right before each query and hands
DuckDB that list, so DuckDB never opens a file the rule drops), and a file it keeps exists
for ``READY_S`` after ``now``: a file is deleted only ``READY_S`` after a file covering it
became ready, when no rule keeps it any more. The only assumption is that a query opens
its files within ``READY_S`` of listing them. Each step of a compaction is one
``os.replace`` or one ``unlink``, so a process killed anywhere inside one leaves a state
the rule reads correctly; the next cycle (or ``spectrace store compact``) finishes the work.
"""

from __future__ import annotations

import logging
import os
import re
import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from spectrace.identity import pid_alive  # noqa: F401  (compaction.pid_alive: the store's name for it)
from spectrace import files
from spectrace.store import schema

log = logging.getLogger("vllm.spectrace")

READY_S = 10.0  # a compacted file counts READY_S after it was written; its inputs go READY_S later
HOUR_NS = 3600 * 10**9

RAW = re.compile(r"^(?P<writer>.+-\d+)-(?P<t>\d+)-\d+\.parquet$")
COMPACTED = re.compile(r"^(?P<writer>.+-\d+)-(?P<lo>\d+)-(?P<hi>\d+)-(?P<made>\d+)\.(?P<kind>part|hour)\.parquet$")
TMP = re.compile(r"^\.(?P<name>.+)\.tmp$")
_RANK = {"raw": 0, "part": 1, "hour": 2}


@dataclass(frozen=True)
class Segment:
    """One file of the store, as its name describes it."""

    path: Path
    writer: str  # "<host>-<pid>"
    kind: str  # raw | part | hour
    lo: int  # raw: t; compacted: the range of raw t it holds
    hi: int
    made: int  # raw: t; compacted: when it was written

    @property
    def hour(self) -> int:
        return self.lo // HOUR_NS

    def covers(self, other: "Segment") -> bool:
        """Holds every row of ``other``: a wider range, or the same one from a later step
        (an hour file over the part it copies); never two files each other."""
        return (
            self.kind != "raw"
            and self.writer == other.writer
            and self.path.parent == other.path.parent
            and self.lo <= other.lo
            and other.hi <= self.hi
            and (
                (self.lo, self.hi) != (other.lo, other.hi)
                or (_RANK[self.kind], self.made, self.path.name) > (_RANK[other.kind], other.made, other.path.name)
            )
        )


def parse(path: Path) -> Segment | None:
    name = path.name
    match = COMPACTED.match(name)
    if match:
        return Segment(path, match["writer"], match["kind"], int(match["lo"]), int(match["hi"]), int(match["made"]))
    match = RAW.match(name)
    if match:
        t = int(match["t"])
        return Segment(path, match["writer"], "raw", t, t, t)
    return None


def ready(seg: Segment, now_ns: int, ready_s: float = READY_S) -> bool:
    return seg.kind == "raw" or seg.made <= now_ns - int(ready_s * 1e9)


def _order(seg: Segment) -> tuple:
    return (_RANK[seg.kind], seg.made, seg.path.name)


def visible(segments: list[Segment], now_ns: int, ready_s: float = READY_S) -> list[Segment]:
    """The files a query at ``now_ns`` reads of ``segments`` (one folder's, or several): the
    store's reader keeps these (``spectrace.store.read.files``), plus any file whose name
    is neither a raw nor a compacted segment's.

    A ready file that no ready compacted file ``covers`` (the same answer as asking
    ``covers`` of every pair, in O(n log n): the reader asks before every query, and a week
    is hundreds of hour files of one writer in one folder). Per writer and folder, a ready
    compacted file covers ``s`` when it starts before ``s`` and ends no earlier, starts with
    it and ends later, or has its range and a later (rank, made, name).
    """
    limit = now_ns - int(ready_s * 1e9)
    by_key: dict[tuple, list[Segment]] = defaultdict(list)
    for s in segments:
        if s.kind != "raw" and s.made <= limit:
            by_key[(s.path.parent, s.writer)].append(s)
    index = {}
    for key, covering in by_key.items():
        covering.sort(key=lambda c: c.lo)
        los = [c.lo for c in covering]
        widest = list(accumulate((c.hi for c in covering), max))  # widest[i]: max hi of covering[: i + 1]
        end_of: dict[int, int] = {}  # lo: the latest hi starting there
        newest: dict[tuple[int, int], tuple] = {}  # (lo, hi): the greatest order with that range
        for c in covering:
            end_of[c.lo] = max(end_of.get(c.lo, c.hi), c.hi)
            order = _order(c)
            if newest.get((c.lo, c.hi), order) <= order:
                newest[(c.lo, c.hi)] = order
        index[key] = (los, widest, end_of, newest)
    kept = []
    for s in segments:
        if not ready(s, now_ns, ready_s):
            continue
        entry = index.get((s.path.parent, s.writer))
        if entry is not None:
            los, widest, end_of, newest = entry
            before = bisect_left(los, s.lo)  # covering[:before] start before s
            if before and widest[before - 1] >= s.hi:
                continue
            if end_of.get(s.lo, s.hi) > s.hi:
                continue
            top = newest.get((s.lo, s.hi))
            if top is not None and top > _order(s):
                continue
        kept.append(s)
    return kept


def _entries(folder: Path) -> list[os.DirEntry]:
    try:
        return list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _owned_folder(entry: os.DirEntry, uid: int | None) -> bool:
    """A real folder (not a link to one) of the store's owner, not hidden."""
    try:
        return (
            not entry.name.startswith(".")
            and entry.is_dir(follow_symlinks=False)
            and entry.stat(follow_symlinks=False).st_uid == uid
        )
    except OSError:
        return False


def owned_file(entry: os.DirEntry, uid: int | None) -> bool:
    """A regular file (not a link, FIFO or folder) of the store's owner: one compaction, retention
    and the size cap may merge, count or delete. Another user's file is never touched."""
    try:
        return entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_uid == uid
    except OSError:
        return False


def run_folders(root: Path):
    """Every ``<table>/run=<run>`` folder of the store that is the store owner's (``files.owner``):
    a folder another user made in it, or a link, is never read, merged or cleaned."""
    uid = files.owner(root)
    for table in _entries(root):
        if _owned_folder(table, uid):
            for run in _entries(Path(table.path)):
                if _owned_folder(run, uid):
                    yield Path(run.path)


_warned: set[str] = set()  # paths compaction warned about, once per process


def _read(seg: Segment) -> Iterator[pa.Table]:
    """One file's rows, a row group at a time (on this thread: a third of read_table's CPU for the small raw
    segments). A part file's 768 k rows (a minute at batch 256 x 50 steps/s) read at once cost ~1 s of CPU on this
    project's VM, most of it the kernel giving the process fresh memory; a row group at a time, the same memory serves
    every group."""
    with pa.OSFile(str(seg.path)) as source:
        parquet = pq.ParquetFile(source)
        for group in range(parquet.num_row_groups):
            yield parquet.read_row_group(group, use_threads=False)


# pyarrow's default codec (snappy): lz4 and zstd level 1 cost as much or more per cycle here
ROW_GROUP = 256 * 1024  # rows of a merged file's row groups
# A merge whose inputs are out of time order (small tables: spans, findings) is sorted in memory up to this many rows;
# a larger one is written in the order it came, streamed like every other merge
SORT_ROWS = 1_000_000


def _time_ordered(ts: pa.ChunkedArray) -> bool:
    """Whether ``ts`` never decreases: merged in name order, a writer's segments almost always are."""
    if len(ts) < 2:
        return True
    return bool(pc.all(pc.greater_equal(ts.slice(1), ts.slice(0, len(ts) - 1))).as_py())


def _write(folder: Path, name: str, parts, mode: int, *, schema: pa.Schema | None = None,
           rows: int | None = None) -> Path:
    """The merged file ``folder/name`` of ``parts`` (tables in order, or a callable that gives them anew each call),
    in ``schema`` (default: the parts' schemas unified; a part without a column has it null), written durably with
    the inputs' ``mode`` (their inputs are deleted later).

    Streamed: a part is read, written and let go before the next (row groups of ``ROW_GROUP`` rows), so a merge holds
    one part and at most a row group's rows at a time. Reading every part first and writing one table held a whole
    hour of a writer at once: at batch 256 x 50 steps/s ~46 M ``verify_steps`` rows, gigabytes, in the pipeline
    process. In time order (row-group statistics on ts prune well): parts out of order are read again, sorted by ts
    in memory and written, up to ``SORT_ROWS`` rows (``rows``: their total, where known); a larger merge keeps the
    order they came in."""
    load = parts if callable(parts) else (lambda: iter(parts))
    if schema is None:
        schema = pa.unify_schemas([t.schema for t in load()])
    path = folder / name

    def write(write_parts) -> None:
        files.write_durably(folder / f".{name}.tmp", path, mode, write_parts)

    try:
        write(lambda out: _stream(out, load(), schema, ordered=True))
    except _OutOfOrder:
        if rows is not None and rows > SORT_ROWS:
            write(lambda out: _stream(out, load(), schema, ordered=False))
        else:
            table = pa.concat_tables([_shaped(t, schema) for t in load()]).sort_by("ts")
            write(lambda out: pq.write_table(table, out, row_group_size=ROW_GROUP))
    files.sync_folder(folder)
    return path


class _OutOfOrder(Exception):
    """A merge's parts are not in time order (``_write`` sorts them in memory)."""


def _stream(out, parts, schema: pa.Schema, *, ordered: bool) -> None:
    """Write ``parts`` (in ``schema``) to ``out`` as they come; with ``ordered``, raise ``_OutOfOrder`` at the first
    row out of time order (nothing of the file is used then)."""
    check = ordered and "ts" in schema.names
    last = None
    pending: list[pa.Table] = []
    held = 0
    with pq.ParquetWriter(out, schema) as writer:
        for part in parts:
            part = _shaped(part, schema)
            if check and part.num_rows:
                ts = part["ts"]
                bounds = pc.min_max(ts)
                low, high = bounds["min"].value, bounds["max"].value  # None: every ts null
                if not _time_ordered(ts) or (last is not None and low is not None and low < last):
                    raise _OutOfOrder
                last = high if high is not None else last
            pending.append(part)
            held += part.num_rows
            if held >= ROW_GROUP:  # whole row groups out; the rest waits for the next part
                table = pa.concat_tables(pending)
                full = held - held % ROW_GROUP
                writer.write_table(table.slice(0, full), row_group_size=ROW_GROUP)
                pending, held = [table.slice(full)], held - full
        if held:
            writer.write_table(pa.concat_tables(pending), row_group_size=ROW_GROUP)


def _shaped(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns in its order (a column it lacks: null)."""
    if table.schema.equals(schema):
        return table
    return pa.Table.from_arrays([table[f.name] if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
                                 for f in schema], schema=schema)


@dataclass
class CycleResult:
    files_written: int = 0
    files_merged: int = 0
    files_deleted: int = 0
    bytes_deleted: int = 0
    cpu_s: float = 0.0
    evictions: list[dict] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # what could not be read or merged, and why (left as it is)


class Compactor:
    """Merges one writer's (or every dead writer's) segments; deletes what is merged.

    ``owns(segment)`` says which files this compactor may merge and delete: a process's
    own files (the engine's flush thread), or the files of writers that are gone
    (``spectrace store compact``). ``closed(hour, now)`` says whether an hour can get no
    more segments from those writers. ``cache`` maps a raw segment's path to the Arrow table
    its writer wrote there (the engine's writer keeps them until its next cycle), so merging
    one of them reads nothing back from disk.
    """

    def __init__(
        self, root: Path, owns, *, closed=None, ready_s: float = READY_S, clock=time.time_ns, cache=None
    ) -> None:
        self.root = Path(root)
        self.clock = clock  # ns; names the files (``made``) and is "now" for a cycle
        self.owns = owns
        self.closed = closed or (lambda hour, now_ns: (hour + 1) * HOUR_NS <= now_ns)
        self.ready_s = ready_s
        self.cache: dict[Path, pa.Table] = cache if cache is not None else {}

    def cycle(self, now_ns: int | None = None) -> CycleResult:
        result = CycleResult()
        cpu = time.thread_time()
        for folder in run_folders(self.root):
            try:
                self._folder(folder, now_ns or self.clock(), result)
            except OSError as exc:  # an unreadable folder: the others are still compacted
                result.skipped[str(folder)] = exc.strerror or str(exc)
        for path, why in result.skipped.items():
            if path not in _warned:
                _warned.add(path)
                log.warning("spectrace: compaction leaves %s as it is: %s", path, why)
        result.cpu_s = time.thread_time() - cpu
        return result

    def _folder(self, folder: Path, now_ns: int, result: CycleResult) -> None:
        segments = []
        uid = files.owner(self.root)
        for entry in _entries(folder):
            if not owned_file(entry, uid):
                continue  # another user's file, a link or a FIFO: never merged or deleted (readers skip it too)
            tmp = TMP.match(entry.name)
            if tmp:  # a write cut short (kill -9): never visible, removed once it is old
                seg = parse(Path(entry.path).with_name(tmp["name"]))
                if seg is not None and self.owns(seg):
                    try:
                        if entry.stat().st_mtime < now_ns / 1e9 - 3600:
                            os.unlink(entry.path)
                    except OSError:
                        pass
                continue
            seg = parse(Path(entry.path))
            if seg is not None and self.owns(seg):
                segments.append(seg)
        if not segments:
            return
        # 1. delete what a compacted file has held (and been ready) for READY_S
        # (readers decide readiness by their own clock, so the wall clock decides here too)
        settled = [s for s in segments if s.kind != "raw" and s.made <= time.time_ns() - int(2 * self.ready_s * 1e9)]
        live = []
        for seg in segments:
            if any(c.covers(seg) for c in settled):
                try:
                    size = seg.path.stat().st_size
                    seg.path.unlink()
                    result.files_deleted += 1
                    result.bytes_deleted += size
                except FileNotFoundError:
                    pass
            else:
                live.append(seg)
        # 2. merge: per writer and hour, raw segments no compacted file holds into a part;
        #    a closed hour's parts and raw segments into its hour file
        compacted = [s for s in live if s.kind != "raw"]
        groups: dict[tuple[str, int], list[Segment]] = defaultdict(list)
        for seg in live:
            if not any(c.covers(seg) for c in compacted):
                groups[(seg.writer, seg.hour)].append(seg)
        for (writer, hour), members in sorted(groups.items()):
            if any(s.kind == "hour" for s in members):
                continue  # an hour file covers the hour already
            closed = self.closed(hour, now_ns)
            raws = [s for s in members if s.kind == "raw"]
            if closed:
                inputs = members
                kind = "hour"
            elif raws:
                inputs = raws
                kind = "part"
            else:
                continue
            inputs = sorted(inputs, key=lambda s: s.lo)
            table = folder.parent.name
            try:  # each input's schema and rows (its footer; the data is read as it is merged)
                shapes = [self._shape(s) for s in inputs]
            except FileNotFoundError:
                continue  # removed meanwhile (retention, cap): next cycle
            except (OSError, pa.ArrowException) as exc:  # a corrupt or unreadable file: its group stays raw
                result.skipped[str(inputs[0].path.parent)] = f"a file of {writer} cannot be read ({exc})"[:300]
                continue
            # never merge a file of another schema (names or types) into spectrace's: its group stays as it is
            why = next(((s, w) for s, (sch, _) in zip(inputs, shapes) if (w := schema.mismatch(table, sch))), None)
            if why is not None:
                result.skipped[str(why[0].path)] = why[1]
                continue
            try:  # every input in spectrace's own types (older or hand-written segments of other widths)
                merged = pa.unify_schemas([schema.conformed(table, sch) for sch, _ in shapes])
            except pa.ArrowException as exc:
                result.skipped[str(inputs[0].path)] = f"cannot be merged ({str(exc).splitlines()[0][:200]})"
                continue
            lo, hi = min(s.lo for s in inputs), max(s.hi for s in inputs)
            made = self.clock()
            try:  # the merged file keeps the mode its writer gave the inputs (SPECTRACE_STORE_GROUP)
                mode = os.stat(inputs[0].path).st_mode & 0o777
            except FileNotFoundError:
                continue
            try:
                _write(folder, f"{writer}-{lo}-{hi}-{made}.{kind}.parquet", lambda inputs=inputs: self._load(table, inputs),
                       mode, schema=merged, rows=sum(n for _, n in shapes))
            except FileNotFoundError:
                continue
            except _CannotMerge as exc:  # a value that does not fit spectrace's type: the group stays as it is
                result.skipped[str(inputs[0].path)] = f"cannot be merged ({str(exc.__cause__).splitlines()[0][:200]})"
                continue
            except (OSError, pa.ArrowException) as exc:
                result.skipped[str(inputs[0].path.parent)] = f"a file of {writer} cannot be read ({exc})"[:300]
                continue
            result.files_written += 1
            result.files_merged += len(inputs)

    def _shape(self, seg: Segment) -> tuple[pa.Schema, int]:
        cached = self.cache.get(seg.path)
        if cached is not None:
            return cached.schema, cached.num_rows
        meta = pq.read_metadata(seg.path)
        return meta.schema.to_arrow_schema(), meta.num_rows

    def _load(self, table: str, inputs: list[Segment]):
        """The inputs' rows, a cached input or a row group at a time, in spectrace's types."""
        for seg in inputs:
            cached = self.cache.get(seg.path)
            for arrow in (cached,) if cached is not None else _read(seg):
                try:
                    arrow = schema.conform(table, arrow)
                except pa.ArrowException as exc:
                    raise _CannotMerge from exc
                yield arrow


class _CannotMerge(Exception):
    """An input holds a value that does not fit spectrace's type for its column (``schema.conform``)."""


def expire(root: Path, older_than_ns: int, *, keep_runs: set[str] = frozenset()) -> list[dict]:
    """Retention: delete every file whose newest segment time is before ``older_than_ns``.

    Raw and part files go before the hour file covering them, so a reader never sees a
    merged file's inputs come back. One eviction record per run touched.
    """
    evicted: dict[str, dict] = {}
    uid = files.owner(root)
    for folder in run_folders(root):
        run_id = folder.name.removeprefix("run=")
        if run_id in keep_runs:
            continue
        old = [
            s for s in (parse(Path(e.path)) for e in _entries(folder) if owned_file(e, uid))
            if s is not None and s.hi < older_than_ns
        ]
        for seg in sorted(old, key=lambda s: {"raw": 0, "part": 1, "hour": 2}[s.kind]):
            try:
                size = seg.path.stat().st_size
                seg.path.unlink()
            except FileNotFoundError:
                continue
            record = evicted.setdefault(run_id, {"evicted_run_id": run_id, "segments": 0, "bytes": 0})
            record["segments"] += 1
            record["bytes"] += size
    return list(evicted.values())


def writer_pid(writer: str) -> tuple[str, int]:
    host, _, pid = writer.rpartition("-")
    return host, int(pid)


@dataclass
class TableStats:
    table: str
    files: int = 0
    raw: int = 0
    compacted: int = 0
    bytes: int = 0


def file_stats(root: Path) -> dict[str, TableStats]:
    """Files and bytes per table (every file on disk, visible or waiting for deletion)."""
    stats: dict[str, TableStats] = {}
    for folder in run_folders(root):
        table = folder.parent.name
        entry_stats = stats.setdefault(table, TableStats(table))
        for entry in _entries(folder):
            seg = parse(Path(entry.path))
            if seg is None:
                continue
            entry_stats.files += 1
            entry_stats.raw += seg.kind == "raw"
            entry_stats.compacted += seg.kind != "raw"
            try:
                entry_stats.bytes += entry.stat().st_size
            except OSError:
                pass
    return stats
