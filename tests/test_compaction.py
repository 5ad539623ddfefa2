"""Compaction of the segment store, without vLLM (pure I/O and SQL): readers count every
flushed row exactly once before, during and after a compaction, and after a compaction
cut short at any step; retention and the cap; `spectrace store`; the current release's
layout reads unchanged."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import spectrace.store
from spectrace.cli import main
from spectrace.store import compaction
from spectrace.testing import store_pipeline

HOUR = compaction.HOUR_NS
SEC = 10**9


class Clock:
    def __init__(self, start_ns: int) -> None:
        self.now = start_ns

    def __call__(self) -> int:
        return self.now


def _writer(root, clock, host="testhost"):
    """A pipeline with the store sink (compaction on, no retention or cap unless a test sets them)."""
    return store_pipeline(root, host=host, clock=clock, retention_s=0, compact_interval_s=60)


def store(pipeline):
    return pipeline.sink("duckdb")


def _flush(writer, clock, run_id, n_flushes, *, step_s=1.0, drafted=1):
    """n flushes of one verify_counts row and one spans row each; returns rows written."""
    for _ in range(n_flushes):
        writer.extend_columns(
            "verify_counts",
            {"ts": clock.now, "run_id": run_id, "source": "engine_core", "position": 0,
             "context_bucket": "0-512", "drafted": drafted, "accepted": 1},
            1,
        )
        writer.append("spans", {"run_id": run_id, "name": "x", "start_time": clock.now})
        writer.flush()
        clock.now += int(step_s * SEC)
    return n_flushes


def _count(root) -> tuple[int, int]:
    con = spectrace.store.open(root)
    drafted = con.execute("select coalesce(sum(drafted), 0) from verify_counts").fetchone()[0]
    spans = con.execute("select count(*) from spans").fetchone()[0]
    con.close()
    return drafted, spans


def _files(root, table="verify_counts"):
    return sorted(p.name for p in (Path(root) / table).glob("*/*.parquet"))


def test_raw_segments_merge_into_parts_then_one_hour_file(tmp_path):
    clock = Clock(1000 * HOUR + 10 * SEC)
    writer = _writer(tmp_path, clock)
    _flush(writer, clock, "r1", 120)
    assert len(_files(tmp_path)) == 120
    owns = lambda seg: True  # noqa: E731
    # made 30 s in the past: ready at once, the merged segments deletable at the next cycle
    made = lambda: time.time_ns() - 30 * SEC  # noqa: E731
    result = compaction.Compactor(tmp_path, owns, closed=lambda h, now: False, clock=made).cycle()
    assert result.files_written == 2 and result.files_merged == 240  # verify_counts and spans
    assert _count(tmp_path) == (120, 120)
    compaction.Compactor(tmp_path, owns, closed=lambda h, now: False, clock=made).cycle()
    assert [n.split(".")[-2] for n in _files(tmp_path)] == ["part"]
    _flush(writer, clock, "r1", 30)
    compaction.Compactor(tmp_path, owns, closed=lambda h, now: False, clock=made).cycle()
    assert _count(tmp_path) == (150, 150)
    # the hour ends: its parts and raw segments become one hour file
    compaction.Compactor(tmp_path, owns, closed=lambda h, now: True, clock=made).cycle()
    compaction.Compactor(tmp_path, owns, closed=lambda h, now: True, clock=made).cycle()
    assert [n.split(".")[-2] for n in _files(tmp_path)] == ["hour"]
    assert _count(tmp_path) == (150, 150)
    table = pq.read_table(tmp_path / "verify_counts" / "run=r1" / _files(tmp_path)[0])
    assert table.column("ts").to_pylist() == sorted(table.column("ts").to_pylist())


@pytest.mark.slow  # every cut point of three compactions: 25-30 s of the fast lane's minute
@pytest.mark.parametrize("age_s", [0, 15, 30], ids=["not-ready", "ready", "inputs-deletable"])
def test_every_intermediate_state_of_a_compaction_counts_each_row_once(tmp_path_factory, monkeypatch, age_s):
    """A reader between any two file operations of a compaction, and after one cut short at
    any of them (kill -9), then finished by the next cycle, sees each flushed row once."""
    tmp_path = tmp_path_factory.mktemp("store")
    clock = Clock(2000 * HOUR + 3000 * SEC)
    writer = _writer(tmp_path, clock)
    _flush(writer, clock, "r1", 8, step_s=150)  # crosses an hour boundary: parts of two hours
    _flush(writer, clock, "r2", 3, drafted=10)
    expected = (8 + 30, 11)
    made = lambda: time.time_ns() - age_s * SEC  # noqa: E731
    seen: list[tuple[int, int]] = []
    real_replace, real_unlink = os.replace, Path.unlink

    def checked_replace(src, dst):
        real_replace(src, dst)
        seen.append(_count(tmp_path))

    def checked_unlink(self, *args, **kwargs):
        real_unlink(self, *args, **kwargs)
        if self.suffix == ".parquet":
            seen.append(_count(tmp_path))

    monkeypatch.setattr(compaction.os, "replace", checked_replace)
    monkeypatch.setattr(Path, "unlink", checked_unlink)
    for cycle in range(4):
        compaction.Compactor(tmp_path, lambda s: True, closed=lambda h, now: cycle >= 2, clock=made).cycle()
    assert len(seen) > 8 and set(seen) == {expected}
    monkeypatch.setattr(compaction.os, "replace", real_replace)
    monkeypatch.setattr(Path, "unlink", real_unlink)

    # cut short after the k-th file operation (kill -9), read, then let later cycles finish
    stop_after, finished = 0, False
    while not finished:
        stop_after += 1
        root = tmp_path_factory.mktemp(f"cut{stop_after}")
        clock = Clock(2000 * HOUR + 3000 * SEC)
        writer = _writer(root, clock)
        _flush(writer, clock, "r1", 8, step_s=150)
        ops = {"n": 0}

        def dying(real):
            def op(*args, **kwargs):
                ops["n"] += 1
                if ops["n"] > stop_after:
                    raise KeyboardInterrupt  # as good as a kill: nothing after this step runs
                return real(*args, **kwargs)
            return op

        monkeypatch.setattr(compaction.os, "replace", dying(real_replace))
        monkeypatch.setattr(Path, "unlink", dying(real_unlink))
        try:
            for cycle in range(4):
                compaction.Compactor(root, lambda s: True, closed=lambda h, now: cycle >= 2, clock=made).cycle()
            finished = True
        except KeyboardInterrupt:
            pass
        monkeypatch.setattr(compaction.os, "replace", real_replace)
        monkeypatch.setattr(Path, "unlink", real_unlink)
        assert _count(root) == (8, 8), stop_after
        for _ in range(3):
            compaction.Compactor(root, lambda s: True, closed=lambda h, now: True, clock=made).cycle()
        assert _count(root) == (8, 8), stop_after
    assert stop_after > 4


def test_writer_compacts_its_own_segments_only(tmp_path):
    clock = Clock(3000 * HOUR)
    mine, other = _writer(tmp_path, clock, "a"), _writer(tmp_path, clock, "b")
    _flush(mine, clock, "r1", 20)
    _flush(other, clock, "r1", 20)
    mine.maintain()
    names = _files(tmp_path)
    assert sum(n.startswith("b-") and n.endswith(".part.parquet") for n in names) == 0
    assert sum(n.startswith("a-") and n.endswith(".part.parquet") for n in names) == 1
    assert sum(n.startswith("b-") for n in names) == 20
    assert store(mine).compaction_errors == 0 and store(mine).compactions == 1


def test_retention_removes_old_hours_and_records_them(tmp_path, caplog):
    clock = Clock(4000 * HOUR)
    writer = _writer(tmp_path, clock)
    _flush(writer, clock, "old", 10)
    clock.now += 10 * HOUR
    _flush(writer, clock, "new", 10)
    store(writer).retention_s = 5 * 3600
    writer.maintain()
    writer.flush()
    assert _count(tmp_path) == (10, 10)
    con = spectrace.store.open(tmp_path)
    rows = con.execute("select evicted_run_id, reason, segments, epoch_ns(ts) from store_evictions where reason = 'retention'").fetchall()
    # at the writer's clock, as every row of the segment it is in (the segment's name never predates a row)
    assert ("old", "retention", 20, clock.now) in rows
    assert "SPECTRACE_RETENTION" in caplog.text


def test_cap_is_checked_at_the_cycle_and_when_own_writes_may_cross_it(tmp_path):
    clock = Clock(5000 * HOUR)
    writer = _writer(tmp_path, clock)
    store(writer).max_bytes = 10**9
    calls = []
    original = store(writer).enforce_cap
    store(writer).enforce_cap = lambda **kw: (calls.append(1), original(**kw))
    _flush(writer, clock, "r1", 3)
    assert len(calls) == 1  # the first flush scans once; under the cap, the next flushes do not list the store
    past_spacing = 6 * store(writer).flush_interval_s  # past the 5-flush spacing, not the once-a-minute rescan
    store(writer)._cap_checked = time.time() - past_spacing
    _flush(writer, clock, "r1", 3)
    assert len(calls) == 1
    store(writer)._store_bytes = 2 * 10**9  # own writes crossed the cap: scan
    store(writer)._cap_checked = time.time() - past_spacing
    _flush(writer, clock, "r1", 1)
    assert len(calls) == 2


def test_store_written_by_the_current_release_reads_unchanged(tmp_path):
    """Segments named and shaped as the release before compaction wrote them."""
    folder = tmp_path / "verify_counts" / "run=rel"
    folder.mkdir(parents=True)
    for i in range(3):
        pq.write_table(
            pa.table({"ts": pa.array([i], pa.timestamp("ns")), "run_id": ["rel"], "source": ["engine_core"],
                      "position": pa.array([0], pa.int32()), "context_bucket": ["0-512"],
                      "drafted": [5], "accepted": [2], "schema_version": pa.array([1], pa.int32())}),
            folder / f"myhost-4242-{1_700_000_000_000_000_000 + i}-{i + 1:06d}.parquet",
        )
    con = spectrace.store.open(tmp_path)
    assert con.execute("select drafted, accepted from acceptance_by_position").fetchall() == [(15, 6)]
    assert main(["store", "compact", "--dir", str(tmp_path), "--no-wait"]) == 0
    con = spectrace.store.open(tmp_path)
    assert con.execute("select drafted, accepted from acceptance_by_position").fetchall() == [(15, 6)]
    assert [n.split(".")[-2] for n in _files(tmp_path)].count("hour") == 1


def test_store_stats_and_compact_cli(tmp_path, capsys):
    clock = Clock(6000 * HOUR)
    writer = _writer(tmp_path, clock, host="gone")
    _flush(writer, clock, "r1", 30)
    assert main(["store", "stats", "--dir", str(tmp_path), "--format", "json"]) == 0
    stats = {row["table"]: row for row in json.loads(capsys.readouterr().out)}
    assert stats["verify_counts"]["files"] == 30 and stats["verify_counts"]["rows"] == 30
    assert stats["spans"]["rows"] == 30
    assert stats["verify_counts"]["oldest"] < stats["verify_counts"]["newest"]
    # the writer's pid is this test's, alive: compact leaves it alone unless its host differs (gone)
    assert main(["store", "compact", "--dir", str(tmp_path), "--no-wait"]) == 0
    capsys.readouterr()
    assert main(["store", "stats", "--dir", str(tmp_path), "--format", "json"]) == 0
    stats = {row["table"]: row for row in json.loads(capsys.readouterr().out)}
    assert stats["verify_counts"]["rows"] == 30
    assert stats["verify_counts"]["compacted"] == 1
    assert _count(tmp_path) == (30, 30)


def test_a_query_never_opens_files_a_ready_compacted_file_covers(tmp_path):
    """The race a concurrent `spectrace query` lost ("Cannot open file ... No such file"): DuckDB
    opens every file it is handed before it can filter on names, so raw files covered by a
    ready part, which the compactor deletes meanwhile, must never be handed to it. A covered
    file left unreadable stands for one deleted between DuckDB's listing and its open (the
    window cannot be hit on purpose from outside DuckDB); then the compactor deletes them."""
    clock = Clock(7000 * HOUR)
    writer = _writer(tmp_path, clock)
    _flush(writer, clock, "r1", 20)
    con = spectrace.store.open(tmp_path)  # long-lived: opened before the compaction
    assert con.execute("select sum(drafted) from verify_counts").fetchone()[0] == 20
    # a part made 25 s ago: ready (its inputs are not read any more) and its inputs deletable
    made = lambda: time.time_ns() - 25 * SEC  # noqa: E731
    assert compaction.Compactor(tmp_path, lambda s: True, closed=lambda h, now: False, clock=made).cycle().files_written == 2
    covered = [p for p in tmp_path.glob("*/*/*.parquet") if compaction.parse(p).kind == "raw"]
    assert len(covered) == 40
    for path in covered:
        path.write_bytes(b"deleted")
    assert con.execute("select sum(drafted), count(*) from verify_counts").fetchone() == (20, 20)
    assert con.sql("select count(*) from spans").fetchone() == (20,)
    assert compaction.Compactor(tmp_path, lambda s: True, closed=lambda h, now: False).cycle().files_deleted == 40
    assert con.execute("select sum(drafted), count(*) from verify_counts").fetchone() == (20, 20)
    _flush(writer, clock, "r1", 3)  # new raw segments: the same connection sees them
    assert con.execute("select sum(drafted) from verify_counts").fetchone()[0] == 23
    con.close()


def test_since_reads_only_the_files_of_the_time_asked(tmp_path, capsys):
    now = time.time_ns()
    clock = Clock(now - 3 * 3600 * SEC)
    writer = _writer(tmp_path, clock)
    _flush(writer, clock, "old", 5, drafted=100)  # three hours ago
    clock.now = now - 65 * 60 * SEC
    _flush(writer, clock, "new", 5, drafted=10)  # 65 minutes ago
    clock.now = now - 10 * 60 * SEC
    _flush(writer, clock, "new", 5)  # ten minutes ago
    made = lambda: time.time_ns() - 25 * SEC  # noqa: E731
    # one ready part per run: run=new's straddles the hour asked (rows before it are not counted)
    compaction.Compactor(tmp_path, lambda s: True, closed=lambda h, n: False, clock=made).cycle()
    for path in (tmp_path / "verify_counts" / "run=old").glob("*.parquet"):
        path.write_bytes(b"older than --since: never opened")
    since = now - 3600 * SEC
    with spectrace.store.open(tmp_path, since=since) as con:
        assert con.execute("select sum(drafted), count(*) from verify_counts").fetchone() == (5, 5)
        assert con.execute("select drafted from acceptance_by_position where run_id = 'old'").fetchall() == []
        assert con.execute("select count(*) from spans").fetchone() == (15,)  # no ts column: every row
    with spectrace.store.open(tmp_path, since=now - 2 * 3600 * SEC) as con:
        assert con.execute("select sum(drafted) from verify_counts").fetchone() == (55,)

    assert main(["query", "--dir", str(tmp_path), "--since", "1h", "--format", "json",
                 "select sum(drafted) as d, count(*) as n from verify_counts"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"d": 5, "n": 5}]
    assert main(["query", "--dir", str(tmp_path), "--since", "90m", "--format", "json",
                 "select sum(drafted) as d from verify_counts"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"d": 55}]
    for bad in ("yesterday", "-1h", "1y"):
        assert main(["query", "--dir", str(tmp_path), f"--since={bad}", "select 1"]) == 2
        err = capsys.readouterr().err
        assert "--since" in err and "e.g. 30m, 1h, 7d" in err and "Traceback" not in err, err
    # 0 is no limit (as SPECTRACE_RETENTION=0), a bare number is seconds, a negative one (its own argument) one line
    for since, drafted in (("0", 55), ("5400", 55), ("3600", 5)):
        assert main(["query", "--dir", str(tmp_path), "--since", since, "--format", "json",
                     "select sum(drafted) as d from verify_counts"]) == 0, since
        assert json.loads(capsys.readouterr().out) == [{"d": drafted}], since
    for argv in (["query", "--since", "-5m", "select 1"], ["report", "--since", "-5m"], ["query", "--since", "-30", "select 1"]):
        assert main([*argv, "--dir", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is negative" in err and "expected one argument" not in err, err


def test_visible_is_covers_asked_of_every_pair():
    """The reader's fast rule equals its definition: ready, and covered by no ready compacted file."""
    import random

    rng = random.Random(7)
    now = 10**12
    for trial in range(300):
        segments = []
        for i in range(rng.randint(1, 30)):
            kind = rng.choice(["raw", "raw", "part", "hour"])
            lo = rng.randint(0, 12)
            hi = lo if kind == "raw" else lo + rng.randint(0, 6)
            made = hi if kind == "raw" else now - rng.choice([0, 5, 10, 15, 25]) * SEC
            folder = Path(rng.choice(["/s/t/run=a", "/s/t/run=b"]))
            writer = rng.choice(["h-1", "h-2"])
            name = f"{writer}-{lo}-{i}.parquet" if kind == "raw" else f"{writer}-{lo}-{hi}-{made + i}.{kind}.parquet"
            segments.append(compaction.Segment(folder / name, writer, kind, lo, hi, made))
        expected = [
            s for s in segments
            if compaction.ready(s, now) and not any(c.covers(s) for c in segments if compaction.ready(c, now))
        ]
        assert compaction.visible(segments, now) == expected, trial


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 0, 1]])
def test_merged_file_is_in_time_order(tmp_path, order):
    """A merge sorts by ts only when its parts are out of order; either way the file is in time order."""
    parts = [pa.table({"ts": pa.array([10 * i + j for j in range(3)], pa.timestamp("ns")), "v": [i] * 3}) for i in order]
    path = compaction._write(tmp_path, "m.parquet", parts, 0o640)
    assert path.stat().st_mode & 0o777 == 0o640  # the mode given (the inputs'), whatever the umask
    merged = pq.read_table(path)
    ts = merged["ts"].cast(pa.int64()).to_pylist()
    assert ts == sorted(ts) == [0, 1, 2, 10, 11, 12, 20, 21, 22]
    assert merged.num_rows == 9
    assert duckdb.sql(f"select count(*), min(ts) < max(ts) from read_parquet('{path}')").fetchone() == (9, True)
    assert compaction._time_ordered(pa.chunked_array([[1, 1, 2], [2, 5]])) is True
    assert compaction._time_ordered(pa.chunked_array([[1, 3], [2]])) is False
    assert compaction._time_ordered(pa.chunked_array([[7]])) is True


def test_a_merge_streams_its_parts_in_row_groups(tmp_path, monkeypatch):
    """A merge holds one part and at most a row group's rows at a time (an hour file of a GPU engine's writer is
    tens of millions of rows), writes whole row groups, and fills a column a part lacks with nulls."""
    rows, parts_made, held = 100_000, [], []

    def parts():
        for i in range(20):
            # in Arrow's memory pool (pa.total_allocated_bytes), not NumPy's
            ts = pc.add(pa.array(np.arange(i * rows, (i + 1) * rows)), 0).cast(pa.timestamp("ns"))
            columns = {"ts": ts, "v": pc.add(pa.array(np.full(rows, i)), 0)} if i != 3 else {"ts": ts}  # 3: no "v"
            parts_made.append(i)
            held.append(pa.total_allocated_bytes())
            yield pa.table(columns)

    schema = pa.schema([("ts", pa.timestamp("ns")), ("v", pa.int64())])
    path = compaction._write(tmp_path, "m.parquet", parts, 0o600, schema=schema, rows=20 * rows)
    meta = pq.read_metadata(path)
    groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    assert groups == [compaction.ROW_GROUP] * 7 + [20 * rows - 7 * compaction.ROW_GROUP]
    merged = pq.read_table(path)
    assert merged["ts"].cast(pa.int64()).to_pylist() == list(range(20 * rows))
    assert merged["v"].null_count == rows and merged["v"][3 * rows + 5].as_py() is None and merged["v"][-1].as_py() == 19
    # 32 MB of parts went through; never more than a part and a row group (and the writer's page buffers) were held
    assert parts_made == list(range(20)) and max(held) - held[0] < 12 * 2**20


def test_a_large_merge_out_of_time_order_is_written_as_it_came(tmp_path, monkeypatch):
    monkeypatch.setattr(compaction, "SORT_ROWS", 5)
    parts = [pa.table({"ts": pa.array([10 * i + j for j in range(3)], pa.timestamp("ns"))}) for i in (2, 0, 1)]
    path = compaction._write(tmp_path, "m.parquet", parts, 0o600, rows=9)
    assert pq.read_table(path)["ts"].cast(pa.int64()).to_pylist() == [20, 21, 22, 0, 1, 2, 10, 11, 12]
    path = compaction._write(tmp_path, "s.parquet", parts, 0o600, rows=4)  # at most SORT_ROWS: sorted
    assert pq.read_table(path)["ts"].cast(pa.int64()).to_pylist() == [0, 1, 2, 10, 11, 12, 20, 21, 22]
