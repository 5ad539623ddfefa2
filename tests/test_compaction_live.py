"""Compaction under a real vLLM engine (CPU build): readers count every flushed row once while
the engine compacts every second, and after a `kill -9` inside a compaction plus a new engine
on the same store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import spectrace.store
from spectrace.store import compaction
from spectrace.testing.engine import method_specs, run_engines

pytestmark = pytest.mark.vllm

FAST = {"SPECTRACE_FLUSH_INTERVAL": "0.2", "SPECTRACE_COMPACT_INTERVAL": "1"}
SQL = (
    "select coalesce(sum(drafted), 0) as drafted, coalesce(sum(accepted), 0) as accepted, "
    "coalesce(max(epoch_ns(ts)), 0) as newest, (select count(distinct ts) from verify_counts) as flushes "
    "from verify_counts where source = 'engine_core'"
)
FLUSHES = 60  # the engine generates until a query counts this many flushes' verification rows (distinct ts)


def _spec(zoo, name, **changes):
    spec = method_specs(zoo)[0]  # the target drafting for itself: every draft accepted
    spec.name = name
    for key, value in changes.items():
        setattr(spec, key, value)
    return spec


def _query(store: Path) -> dict:
    """`spectrace query` as a user runs it: a fresh process, the store opened read-only."""
    out = subprocess.run(
        [sys.executable, "-m", "spectrace.cli", "query", "--dir", str(store), "--format", "json", SQL],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)[0]


def _poll_queries(store: Path, stop: threading.Event, seen: list[dict], errors: list[Exception],
                  enough: Path | None = None) -> None:
    """`spectrace query` again and again until ``stop``; what goes wrong lands in ``errors``
    (an exception in a thread would only be a warning), and the polling stops there. Once an answer
    counts ``FLUSHES`` flushes, ``enough`` is created (the engine stops generating)."""
    try:
        while not stop.is_set():
            if any(store.glob("verify_counts/*/*.parquet")):
                seen.append(_query(store))
                if enough is not None and seen[-1]["flushes"] >= FLUSHES:
                    enough.touch()
            time.sleep(0.1)
    except Exception as exc:  # handed to the test, which fails on it
        errors.append(exc)


def _prefix_sums_hold(store: Path, seen: list[dict]) -> None:
    """Each answer equals the final store's rows up to the newest row that answer saw: flushes
    arrive in time order, so a row counted twice or missed shows as a mismatch."""
    con = spectrace.store.open(store)
    for answer in seen:
        expected = con.execute(
            "select coalesce(sum(drafted), 0), coalesce(sum(accepted), 0) from verify_counts "
            "where source = 'engine_core' and epoch_ns(ts) <= ?", [answer["newest"]],
        ).fetchone()
        assert (answer["drafted"], answer["accepted"]) == expected, answer


def _no_duplicate_rows(store: Path) -> None:
    con = spectrace.store.open(store)
    dup = con.execute(
        "select pid, ts, source, position, context_bucket, count(*) from verify_counts "
        "group by all having count(*) > 1 limit 3"
    ).fetchall()
    assert dup == []


def _matches_vllm(store: Path, result) -> None:
    con = spectrace.store.open(store)
    rows = con.execute(
        "select position, drafted, accepted from acceptance_by_position where run_id = ? order by position",
        [result.run_id],
    ).fetchall()
    assert [a for _, _, a in rows] == result.metrics["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert sum(d for _, d, _ in rows) == result.metrics["vllm:spec_decode_num_draft_tokens"]


def test_queries_while_the_engine_compacts_count_each_row_once(zoo, scratch, cache_root):
    store = scratch / "compacting-store"
    seen: list[dict] = []
    errors: list[Exception] = []
    stop = threading.Event()
    enough = scratch / "compacting-enough"
    poller = threading.Thread(target=_poll_queries, args=(store, stop, seen, errors, enough), daemon=True)
    poller.start()
    try:
        # generation until the store holds FLUSHES flushes (not a fixed number of calls: a quiet box flushed 110
        # times in 60 calls, CI's loaded one 30), then 25 s more alive: parts become ready, their inputs are deleted
        results = run_engines(
            [_spec(zoo, "compacting", repeat=2000, repeat_until_file=str(enough), linger_s=25)], store=store,
            cache_root=cache_root,
            env=FAST, log_file=scratch / "compacting.log",
        )
    finally:
        stop.set()
        poller.join(timeout=120)
    assert not poller.is_alive()
    assert errors == [], errors  # e.g. a query that failed ("Cannot open file ... No such file")
    result = results["compacting"]
    assert result.ok, result.error
    _matches_vllm(store, result)
    _no_duplicate_rows(store)
    assert len(seen) >= 10
    # the polls counted rows while the engine wrote and compacted, not only an empty store
    assert sum(answer["drafted"] > 0 for answer in seen) >= 5, seen
    _prefix_sums_hold(store, seen)
    assert seen[-1]["drafted"] == result.metrics["vllm:spec_decode_num_draft_tokens"]
    names = [p.name for p in store.glob("verify_counts/*/*.parquet")]
    # parts; or, where the run outlived its hour (CI's began at xx:59:48), that hour's file, merged from its parts
    compacted = [n for n in names if n.endswith((".part.parquet", ".hour.parquet"))]
    assert compacted, names
    # the engine compacted: far fewer files than flushes (each flush's verify_counts rows share one ts), the
    # merged inputs gone; counted, not assumed from the run's length (a loaded box runs longer, flushes more).
    # A part a compaction cycle (1 s: ~5 flushes), raw inputs deleted 2 x READY_S after their part: 17 files for
    # 110 flushes on a quiet box, 27 for 80 on a loaded one (its cycles late); without compaction, one a flush
    flushes = spectrace.store.open(store).execute("select count(distinct ts) from verify_counts").fetchone()[0]
    assert flushes >= FLUSHES and len(names) < flushes / 2, (len(names), flushes)
    assert "compacting the store" not in (scratch / "compacting.log").read_text()


def _tmp_part_of(store: Path, pid: int) -> bool:
    for folder in (store / "verify_counts").glob("run=*"):
        for entry in os.scandir(folder):
            if entry.name.startswith(".") and f"-{pid}-" in entry.name and ".part.parquet" in entry.name:
                return True
    return False


def test_kill_9_inside_a_compaction_then_a_new_engine_loses_and_doubles_nothing(zoo, scratch, cache_root):
    store = scratch / "killed-store"
    results: dict = {}

    def run():
        try:
            results.update(run_engines(
                [_spec(zoo, "killed", repeat=400)], store=store, cache_root=cache_root,
                env={**FAST, "SPECTRACE_FLUSH_INTERVAL": "0.05"}, log_file=scratch / "killed.log",
            ))
        except Exception as exc:  # killed: no results, as expected
            results["error"] = exc

    runner = threading.Thread(target=run)
    runner.start()
    pid, caught, before = None, False, []
    deadline = time.time() + 240
    while time.time() < deadline and not caught:
        if pid is None or not before or before[-1]["drafted"] == 0:
            time.sleep(0.5)
            if any(store.glob("verify_counts/*/*.parquet")):
                before.append(_query(store))
                row = spectrace.store.open(store).execute("select pid from runs limit 1").fetchone()
                pid = row[0] if row else None
        else:
            caught = _tmp_part_of(store, pid)  # a verify_counts part being written: a compaction under way
            if caught:
                os.kill(pid, signal.SIGKILL)
    if not caught and pid is not None:
        os.kill(pid, signal.SIGKILL)
    runner.join(timeout=120)
    assert pid is not None, "the engine never got going"
    assert caught, "no compaction was seen under way"
    after_kill = _query(store)
    killed_run = spectrace.store.open(store).execute("select run_id from runs where pid = ?", [pid]).fetchone()[0]

    # a new engine on the same store, then `spectrace store compact` for the killed one's files
    fresh = run_engines([_spec(zoo, "fresh", repeat=5)], store=store, cache_root=cache_root, env=FAST)["fresh"]
    assert fresh.ok, fresh.error
    out = subprocess.run([sys.executable, "-m", "spectrace.cli", "store", "compact", "--dir", str(store)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    con = spectrace.store.open(store)
    killed = con.execute(
        "select sum(drafted), sum(accepted) from verify_counts where source = 'engine_core' and run_id = ?",
        [killed_run],
    ).fetchone()
    assert killed == (after_kill["drafted"], after_kill["accepted"])
    _prefix_sums_hold(store, [*before, after_kill])
    _no_duplicate_rows(store)
    _matches_vllm(store, fresh)
    # the killed engine's files are merged: hour files only
    kinds = {compaction.parse(p).kind for p in store.glob("verify_counts/*/*.parquet") if f"-{pid}-" in p.name}
    assert kinds == {"hour"}, kinds
