"""SPECTRACE_PIPELINE=process on real vLLM runs: the engine keeps its hooks and a shipper; a pipeline process
counts, judges and writes every sink under the engine's identity. Same tokens, same counts, same findings as
the in-process flush; a pipeline process killed mid-run is started again and vLLM never notices; an engine process
killed mid-run leaves its pipeline process to write what it was sent, and exit."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import struct
import termios
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import spectrace.store
from spectrace.testing.engine import method_specs, run_engines

pytestmark = [pytest.mark.vllm]

PROCESS = {"SPECTRACE_PIPELINE": "process"}


def _specs(zoo, *names, **changes):
    specs = [spec for spec in method_specs(zoo) if spec.name in names]
    for spec in specs:
        for key, value in changes.items():
            setattr(spec, key, value)
    return specs


def _by_position(con, run_id):
    return con.execute("select position, drafted, accepted from acceptance_by_position where run_id = ? order by position",
                       [run_id]).fetchall()


def _codes(con, run_id):
    return sorted({r[0] for r in con.execute("select code from findings where run_id = ?", [run_id]).fetchall()})


@pytest.fixture(scope="module")
def process_runs(zoo, scratch, cache_root):
    store = scratch / "pipeline-process-store"
    results = run_engines(_specs(zoo, "self", "seeded"), store=store, cache_root=cache_root,
                          log_file=scratch / "pipeline-process.log", env=PROCESS)
    return store, results


@pytest.mark.parametrize("name", ["self", "seeded"])
def test_same_tokens_counts_and_findings_as_the_flush_thread(process_runs, traced_methods, untraced_methods, name):
    store, results = process_runs
    result = results[name]
    assert result.ok, result.error
    assert result.tokens == untraced_methods[name].tokens
    con = spectrace.store.open(store)
    rows = _by_position(con, result.run_id)
    # vLLM's own counters, position by position
    assert [a for _, _, a in rows] == result.metrics["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert sum(d for _, d, _ in rows) == result.metrics["vllm:spec_decode_num_draft_tokens"]
    # and what the in-process flush wrote for the same engine
    thread_store, thread_results = traced_methods
    thread_con = spectrace.store.open(thread_store)
    assert rows == _by_position(thread_con, thread_results[name].run_id)
    assert _codes(con, result.run_id) == _codes(thread_con, thread_results[name].run_id)
    if name == "seeded":
        assert "ACCEPTANCE_COLLAPSE" in _codes(con, result.run_id)


def test_rows_are_the_engines_and_the_pipeline_is_another_process(process_runs):
    store, results = process_runs
    con = spectrace.store.open(store)
    engine_pids = {r[0] for r in con.execute(
        "select distinct pid from verify_counts union select distinct pid from spans union select distinct pid from hooks"
    ).fetchall()}
    assert len(engine_pids) == 1  # one engine child ran both engines; every row is keyed by it
    shipper = results["seeded"].exporter["shipper"]
    assert shipper["pid"] not in engine_pids and shipper["started"] == 1
    assert shipper["messages"] > 10 and shipper["lost_records"] == 0 and shipper["lost_messages"] == 0
    # the pipeline process's own stats came back with its acknowledgements: its store sink wrote the segments
    assert results["seeded"].exporter["duckdb"]["segments_written"] > 0
    assert results["seeded"].exporter["dropped"] == 0
    starts = [json.loads(a) for (a,) in con.execute(
        "select attributes from spans where name = 'spectrace.process.start'").fetchall()]
    exporters = {json.loads(a["spectrace.exporters"])["duckdb"] for a in starts}
    assert exporters == {f"pipeline process (pid {shipper['pid']})"}


# What the vLLM process must not load in the process shape: the judging (the audit, the collector's judges and
# drain), the flush (pipeline, sinks' batches, store, lake) and the array libraries spectrace's own flush uses
JUDGING_AND_FLUSH = ("spectrace.audit", "spectrace.collector", "spectrace.pipeline", "spectrace.store",
                     "spectrace.lake", "spectrace.sinks.metrics", "spectrace.sinks.spans", "spectrace.arrow_types")


def test_the_vllm_process_records_and_its_pipeline_process_judges(process_runs):
    """One process held vLLM's frontend, engine core and worker (VLLM_ENABLE_V1_MULTIPROCESSING=0): after two
    engines, no judge and no flush of spectrace's was ever loaded in it. The load-time judges' rows and findings
    are in the store all the same, written by the pipeline process under the roles that read them."""
    store, results = process_runs
    loaded = results["seeded"].spectrace_modules
    assert "spectrace.recorder.runtime" in loaded and "spectrace.recorder.shipper" in loaded, loaded
    assert [m for m in loaded if m.startswith(JUDGING_AND_FLUSH)] == [], " ".join(loaded)
    con = spectrace.store.open(store)
    for name in ("self", "seeded"):
        run_id = results[name].run_id
        written = dict(con.execute(
            "select 'layout', count(*) from attention_layout where run_id = ? and process_role = 'worker' union all "
            "select 'weights', count(*) from model_weights where run_id = ? and process_role = 'worker' union all "
            "select 'fields', count(*) from config_fields where run_id = ? and process_role = 'frontend'",
            [run_id] * 3).fetchall())
        assert written["layout"] > 0 and written["weights"] == 2 and written["fields"] > 0, (name, written)


def test_a_killed_pipeline_process_is_started_again(zoo, scratch, cache_root, untraced_methods):
    """SPECTRACE_INJECT_FAULT=pipeline_process: the first pipeline process SIGKILLs itself on a message with engine
    steps (its third or later)."""
    store, log_file, enough = scratch / "pipeline-killed-store", scratch / "pipeline-killed.log", scratch / "killed-enough"
    # generate until the second pipeline process wrote steps, not a fixed number of calls: beside test_lake_live three
    # calls' steps came in too few messages in three runs of three (no kill from the third message on, or no step after)
    stop = threading.Event()

    def watch():
        first, before = None, None
        while not stop.wait(0.2):
            try:
                pids = _pipelines_of(store)
                if first is None and pids:
                    first = min(pids)
                elif first is not None and before is None and any(pid != first for pid in pids):
                    before = sum(_drafted(store).values())  # the first is dead: what it wrote
                elif before is not None and sum(_drafted(store).values()) > before:
                    enough.touch()
                    return
            except Exception:  # no rows yet, a process gone while read
                pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = run_engines(
            _specs(zoo, "self", repeat=400, repeat_until_file=str(enough)), store=store, cache_root=cache_root,
            log_file=log_file,
            env={**PROCESS, "SPECTRACE_INJECT_FAULT": "pipeline_process", "SPECTRACE_SHIP_INTERVAL": "0.05"},
        )["self"]
    finally:
        stop.set()
        watcher.join(timeout=30)
    assert result.ok, result.error
    assert result.tokens == untraced_methods["self"].tokens  # vLLM never noticed
    shipper = result.exporter["shipper"]
    assert shipper["started"] == 2
    assert shipper["lost_records"] > 0  # the first process's unwritten messages, counted ...
    assert result.exporter["dropped"] >= shipper["lost_records"]  # ... as dropped by the second
    con = spectrace.store.open(store)
    rows = _by_position(con, result.run_id)
    drafted = sum(d for _, d, _ in rows)
    assert 0 < drafted <= result.metrics["vllm:spec_decode_num_draft_tokens"]  # the steps after the restart
    assert all(a == d for _, d, a in rows)  # the self-drafter still accepts everything it drafted
    assert "the pipeline process ended" in log_file.read_text()


def _pipeline_processes(keep) -> list[int]:
    """The running pipeline processes (``python -m spectrace.collector.process``, from /proc) for which
    ``keep(entry)`` holds (``entry``: the process's /proc folder; one that ends while read is left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (entry.name.isdigit() and b"spectrace.collector.process" in (entry / "cmdline").read_bytes()
                    and keep(entry)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _pipelines_of(store: Path) -> list[int]:
    """The pipeline processes writing to ``store`` (its ``SPECTRACE_DIR``)."""
    setting = f"SPECTRACE_DIR={store}".encode()
    return _pipeline_processes(lambda entry: setting in (entry / "environ").read_bytes().split(b"\0"))


def _pipeline_children(parent: int) -> list[int]:
    """The pipeline processes ``parent`` started: each names it in its environment (it is not its child: it was
    started outside the engine's process tree, spectrace.recorder.detached)."""
    mark = f"SPECTRACE_PIPELINE_OF={parent}".encode()
    return _pipeline_processes(lambda entry: mark in (entry / "environ").read_bytes().split(b"\0"))


def _running(pid: int) -> bool:
    """Alive and not a zombie (a dead engine's pipeline process is reparented; nothing may reap it here)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _unread(pid: int) -> tuple[int, int]:
    """Bytes waiting unread in the pipe a pipeline process reads its frames from (its stdin), and the pipe's size."""
    fd = os.open(f"/proc/{pid}/fd/0", os.O_RDONLY | os.O_NONBLOCK)
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0], fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    finally:
        os.close(fd)


def _drafted(store, before_ns: int | None = None) -> dict[str, int]:
    """Drafted tokens by source; with ``before_ns``, in rows counted before that time (ns since the epoch)."""
    con = spectrace.store.open(store)
    where = "where epoch_ns(ts) < ?" if before_ns is not None else ""
    return dict(con.execute(f"select source, sum(drafted) from verify_counts {where} group by source",
                            [before_ns] if before_ns is not None else []).fetchall())


def test_a_killed_vllm_process_leaves_its_pipeline_process_to_write_what_it_was_sent(zoo, scratch, cache_root):
    """``kill -9`` of a traced vLLM process (the worker, under vLLM's V1 multiprocessing): its pipeline process,
    held stopped meanwhile so that shipped messages wait in the pipe unwritten, reads them after the kill, writes
    them at EOF and exits; nothing flushed before is lost, every segment is whole, and the engine core, left
    without its worker, ends with its own pipeline process (``run_engines`` returns only once every process that
    holds the engine's output has exited)."""
    store, log = scratch / "engine-killed-store", scratch / "engine-killed.log"
    spec = _specs(zoo, "seeded", repeat=400)
    results = {}
    runner = threading.Thread(target=lambda: results.update(run_engines(
        spec, store=store, cache_root=cache_root, log_file=log, multiprocessing=True,
        env={**PROCESS, "SPECTRACE_FLUSH_INTERVAL": "0.5", "SPECTRACE_SHIP_INTERVAL": "0.1"})), daemon=True)
    runner.start()
    worker = None  # its pid: its rows carry it
    deadline = time.time() + 240
    while time.time() < deadline and worker is None:
        if list(store.glob("verify_counts/*/*.parquet")):
            row = spectrace.store.open(store).execute(
                "select pid from spans where process_role = 'worker' limit 1").fetchone()
            worker = row[0] if row else None
        time.sleep(0.2)
    assert worker is not None, "the engine never got going"
    children = _pipeline_children(worker)
    assert len(children) == 1, children
    pipeline = children[0]
    stopped_ns = time.time_ns()
    os.kill(pipeline, signal.SIGSTOP)  # it reads and writes nothing more; the worker's shipper goes on sending
    try:
        time.sleep(1.0)  # ten ship intervals
        waiting, size = _unread(pipeline)
        os.kill(worker, signal.SIGKILL)
    finally:
        os.kill(pipeline, signal.SIGCONT)
    # messages were waiting, unread, and the pipe never filled (a full pipe blocks the shipper: records would die
    # with the worker, not with its pipeline process)
    assert 0 < waiting < size, (waiting, size)
    deadline = time.time() + 120
    while _running(pipeline) and time.time() < deadline:
        time.sleep(0.2)
    assert not _running(pipeline), "the pipeline process outlived its worker"
    runner.join(timeout=600)
    assert not runner.is_alive()
    assert not results["seeded"].ok  # vLLM fails without its worker, as it should
    for path in store.rglob("*.parquet"):
        pq.read_table(path)  # every segment on disk is whole
    # the worker's pipeline process wrote what it was sent: the worker's counts are the engine core's (its own
    # pipeline process, never stopped) but for the steps in flight or not yet shipped at the kill (one ship interval,
    # 0.1 s here, and however long a loaded machine kept the shipper's thread waiting). Had the messages that waited
    # in the pipe been lost, the worker would lack every step of the second it was stopped. The engine core's rows
    # written after the stop (its pipeline process stamps them when it counts, every 0.5 s here) hold those steps
    # and at most 0.6 s more: the worker may lack less than half of them.
    drafted = _drafted(store)
    assert drafted["engine_core"] > 0
    during = drafted["engine_core"] - _drafted(store, before_ns=stopped_ns).get("engine_core", 0)
    assert during > 0, drafted
    assert abs(drafted["worker"] - drafted["engine_core"]) < 0.5 * during, (drafted, during)
