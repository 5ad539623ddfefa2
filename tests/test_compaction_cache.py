"""The engine's writer merges the segments it wrote since its last cycle from memory (the
tables it wrote), not by reading them back: same part files, no reads, the cache emptied
by every cycle and bounded."""

from __future__ import annotations

import shutil

import pyarrow.parquet as pq

import spectrace.store
from spectrace.store import compaction
from spectrace.store.writer import SegmentSink
from spectrace.testing import store_pipeline

HOUR, SEC = compaction.HOUR_NS, 10**9


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _write(root, clock, n, *, compacting=True):
    """n flushes through a store pipeline; returns its store sink."""
    writer = store_pipeline(root, host="h", clock=clock, retention_s=0, compact_interval_s=60.0 if compacting else 0.0)
    for i in range(n):
        writer.extend_columns(
            "verify_counts",
            {"ts": clock.now, "run_id": "r", "source": "engine_core", "position": [0, 1],
             "context_bucket": "0-512", "drafted": [10 + i, 9], "accepted": [i % 7, 3]},
            2,
        )
        writer.append("spans", {"run_id": "r", "name": f"s{i}", "start_time": clock.now, "attributes": '{"a": 1}'})
        writer.flush()
        clock.now += SEC
    return writer.sink("duckdb")


def _parts(root):
    return sorted((root / "verify_counts").glob("run=r/*.part.parquet")) + sorted((root / "spans").glob("run=r/*.part.parquet"))


def test_the_cycle_merges_what_the_writer_wrote_without_reading_it_back(tmp_path, monkeypatch):
    start = 5000 * HOUR + 30 * SEC
    reads = []
    real_read = compaction._read
    monkeypatch.setattr(compaction, "_read", lambda seg: reads.append(seg.path) or real_read(seg))

    cached = _write(tmp_path / "cached", Clock(start), 25)
    assert len(cached._recent) == 50 and cached._recent_rows == 75
    cached.maintain()
    assert reads == [] and cached._recent == {} and cached.compaction_errors == 0

    # the same segments, compacted by a writer that keeps nothing: read from disk
    shutil.copytree(tmp_path / "cached", tmp_path / "disk")
    for part in _parts(tmp_path / "disk"):
        part.unlink()
    disk = store_pipeline(tmp_path / "disk", host="h", clock=Clock(cached.clock.now), retention_s=0, compact_interval_s=60).sink("duckdb")
    disk.start_ns = start
    disk._last_t = cached._last_t
    disk.maintain()
    assert len(reads) == 50

    cached_parts, disk_parts = _parts(tmp_path / "cached"), _parts(tmp_path / "disk")
    assert len(cached_parts) == len(disk_parts) == 2
    for a, b in zip(cached_parts, disk_parts):
        ta, tb = pq.read_table(a), pq.read_table(b)
        assert ta.schema == tb.schema and ta.equals(tb)
    con = spectrace.store.open(tmp_path / "cached")
    assert con.execute("select sum(drafted), sum(accepted) from verify_counts").fetchone() == (
        sum(10 + i for i in range(25)) + 9 * 25, sum(i % 7 for i in range(25)) + 3 * 25)
    con.close()


def test_the_cache_is_bounded_and_off_without_compaction(tmp_path, monkeypatch):
    monkeypatch.setattr(SegmentSink, "RECENT_ROWS", 10)
    writer = _write(tmp_path / "a", Clock(6000 * HOUR), 8)
    assert writer._recent_rows <= 10 and len(writer._recent) < 16
    writer.maintain()  # the rest is read from disk: the same rows either way
    con = spectrace.store.open(tmp_path / "a")
    assert con.execute("select count(*) from verify_counts").fetchone()[0] == 16
    con.close()
    assert _write(tmp_path / "b", Clock(6000 * HOUR), 3, compacting=False)._recent == {}
