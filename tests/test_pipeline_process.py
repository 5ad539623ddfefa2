"""SPECTRACE_PIPELINE=process without vLLM: rows, spans and per-step records the engine side buffers reach a real
store written by a real pipeline process under the engine's pid; flushes are acknowledged with the pipeline's
stats; a killed pipeline process's unwritten messages are counted as dropped by the next one; an idle process sends
nothing; the shipper packs each draft dict once, and hands the GIL to a waiting engine thread while it packs, while it
pickles and while it reads new requests; the engine/worker agreement of the last run is judged after an orderly end,
not after EOF alone (a killed engine's step in flight). (The same shape on real vLLM runs:
tests/test_pipeline_process_live.py.)"""

from __future__ import annotations

import json
import os
import struct
import time
from types import SimpleNamespace

import spectrace.store
from spectrace.settings import Settings
from spectrace.recorder import runtime
from spectrace.recorder.verify import EngineStep, VerifyCapture
from spectrace.recorder.verify.capture import ReadRequest, RequestNote, WorkerStep

RUN = "run-shipped"


def _start(tmp_path, **settings):
    s = Settings(enabled=True, dir=tmp_path / "store", metrics_dir=tmp_path / "metrics", exporters=("duckdb",),
                 pipeline="process", span_every_steps=0, **settings)
    rt = runtime.start(s, hooks=[], make_capture=VerifyCapture)
    rt.set_run(runtime.Run(run_id=RUN, traceparent=""))
    rt.enter_role("engine_core")
    return rt


def _steps(rt, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        drafts = {"a": [1, 2, 3], "b": [4, 5, 6]}
        rt.verify.engine_steps.append(EngineStep(
            time.time_ns(), i, RUN, drafts, [3, 1], {"a": 0, "b": 1},
            SimpleNamespace(req_ids=["a", "b"], num_computed_tokens=[10 + i, 20 + i]), None, 1))


def test_records_reach_the_store_under_the_engines_pid(tmp_path):
    rt = _start(tmp_path)
    try:
        _steps(rt, 5)
        rt.flush()
        stats = rt.pipeline.stats()
        assert stats["duckdb"]["segments_written"] > 0 and stats["dropped"] == 0
        assert stats["shipper"]["pid"] != os.getpid() and stats["shipper"]["lost_records"] == 0
    finally:
        runtime.stop()
    con = spectrace.store.open(tmp_path / "store")
    rows = con.execute("select position, drafted, accepted from acceptance_by_position where run_id = ? order by 1",
                       [RUN]).fetchall()
    assert rows == [(0, 10, 5), (1, 10, 5), (2, 10, 0)]  # "a" accepts 2 of its 3 drafts each step, "b" none
    pids = {r[0] for r in con.execute("select distinct pid from verify_steps union select distinct pid from spans").fetchall()}
    assert pids == {os.getpid()}
    assert con.execute("select count(*) from verify_steps where run_id = ?", [RUN]).fetchone()[0] == 10


def test_rows_a_full_engine_buffer_refused_are_counted_once_before_and_after_they_are_shipped(tmp_path):
    rt = _start(tmp_path, max_buffer_rows=20)
    try:
        for i in range(25):
            rt.pipeline.append("hooks", {"hook": f"h{i}"})
        stats = rt.pipeline.stats()  # nothing shipped, nothing acknowledged yet
        assert (stats["dropped"], stats["buffer_dropped"]) == (5, 5)
        rt.flush()
        stats = rt.pipeline.stats()  # shipped: the pipeline process counts them, and what its own full buffer refused
    finally:
        runtime.stop()
    assert stats["dropped"] == stats["buffer_dropped"] >= 5
    con = spectrace.store.open(tmp_path / "store")
    written = con.execute("select count(*) from hooks where hook like 'h%'").fetchone()[0]
    assert written + stats["buffer_dropped"] == 25, (written, stats)  # each row written or counted, once


def test_a_killed_pipeline_process_is_counted_and_replaced(tmp_path):
    rt = _start(tmp_path)
    try:
        _steps(rt, 3)
        rt.flush()
        first = rt.pipeline.shipper.proc
        _steps(rt, 4, start=3)
        rt.pipeline.shipper.ship()  # shipped, not yet written when the process dies
        first.kill()
        first.wait()
        _steps(rt, 2, start=7)
        rt.flush()
        stats = rt.pipeline.stats()
        assert stats["shipper"]["started"] == 2 and rt.pipeline.shipper.proc.pid != first.pid
        assert stats["shipper"]["lost_records"] == 4 and stats["dropped"] == 4
    finally:
        runtime.stop()
    con = spectrace.store.open(tmp_path / "store")
    steps = {r[0] for r in con.execute("select distinct step from verify_steps").fetchall()}
    assert steps == {0, 1, 2, 7, 8}  # the four lost steps, and only those, are missing


def test_an_idle_process_sends_nothing_and_its_next_records_still_arrive(tmp_path):
    rt = _start(tmp_path, ship_interval_s=0.1)
    shipper = rt.pipeline.shipper
    try:
        rt.flush()  # the state and the start span are shipped
        sent, skipped = shipper.messages, shipper.idle_skips
        time.sleep(2.0)
        # the shipper woke, found nothing new and sent nothing; its wait doubled each time, up to a second (twenty
        # wakes at a 0.1 s interval, at most six backing off from it)
        assert shipper.messages == sent and 1 <= shipper.idle_skips - skipped <= 6
        _steps(rt, 3)
        rt.flush()
        assert shipper.messages > sent and shipper.lost_records == 0
    finally:
        runtime.stop()
    con = spectrace.store.open(tmp_path / "store")
    assert con.execute("select count(*) from verify_steps where run_id = ?", [RUN]).fetchone()[0] == 6


def test_a_shipment_is_pickled_in_groups_with_pauses_for_the_gil(monkeypatch):
    from spectrace.recorder import wire
    from spectrace.recorder.verify.capture import HostStep, StepTiming
    from spectrace.values import RunInfo

    drafts = {"a": [1, 2], "b": [3]}
    engine = [EngineStep(1, i, RUN, drafts, [2, 1], {"a": 0, "b": 1}, None, None, 1) for i in range(4)]
    worker = [WorkerStep(1, RUN, 0, drafts, [2, 1], {"a": 0, "b": 1})]
    requests = [wire.ShippedRequest(ReadRequest(RUN, "a", {"temperature": 0.0}), (True, False), None)]
    timing = StepTiming(RUN, 0, True, 900, True, 12, 2)
    timing.sample_ns, timing.draft_ns = 300, 100
    state = wire.ProcessState(RUN, [wire.RunState(RUN, "", 5, {"method": "eagle"})], ["engine_core"], {}, {})
    shipment = wire.Shipment(seq=7, state=state, engine=engine, worker=worker, requests=requests, timings=[timing],
                             host=[HostStep(RUN, "engine_core", 40, 3)], values=[RunInfo(RUN, {"k": 1}, "0.32", "x")])
    pauses = []
    monkeypatch.setattr(wire, "YIELD_AFTER_NS", 0)  # a pause after every grouped record
    payload = wire.dumps_shipment(shipment, pause=pauses.append)
    assert pauses == [wire.YIELD_S] * 6
    back = wire.loads_shipment(payload)
    assert back == shipment and back is not shipment and shipment.engine == engine  # the caller's shipment as it was
    # the same record types on the far side, and one memo across the records: the dict every record shares
    # arrives once, shared again
    assert type(back.engine[0]) is EngineStep and type(back.timings[0]) is StepTiming and type(back.state) is wire.ProcessState
    assert (back.timings[0].sample_ns, back.timings[0].draft_ns, back.timings[0].done) == (300, 100, True)
    assert back.engine[0].drafts is back.engine[3].drafts is back.worker[0].drafts
    assert back.records() == 4 + 1 + 1 + 1 and not back.carries_only_state()
    assert wire.Shipment(seq=3, state=state).carries_only_state()
    monkeypatch.setattr(wire, "YIELD_AFTER_NS", 10**12)  # groups grow (1, 4, ...) and no pause comes
    assert wire.loads_shipment(wire.dumps_shipment(shipment, pause=pauses.append)) == shipment and len(pauses) == 6
    monkeypatch.setattr(wire, "YIELD_S", 0)  # --ship-pauses off: none even after every record
    monkeypatch.setattr(wire, "YIELD_AFTER_NS", 0)
    assert wire.loads_shipment(wire.dumps_shipment(shipment, pause=pauses.append)) == shipment and len(pauses) == 6


def test_a_payload_of_another_version_or_not_a_shipment_is_refused():
    import pickle

    import pytest

    from spectrace.recorder import wire

    with pytest.raises(ValueError, match="shipment version 0, this collector reads 1"):
        wire.loads_shipment(wire.dumps_shipment(wire.Shipment(seq=1, version=0)))
    with pytest.raises(ValueError, match="not a shipment: dict"):
        wire.loads_shipment(pickle.dumps({"seq": 1, "engine": []}))


def test_reading_new_requests_pauses_for_the_gil(tmp_path, monkeypatch):
    from spectrace.recorder import shipper as shipper_module
    from spectrace.recorder import wire

    rt = _start(tmp_path)
    try:
        params = SimpleNamespace(temperature=0.7, logit_bias=None, allowed_token_ids=None, bad_words=None)
        for i in range(3):
            rt.verify.new_requests.append(RequestNote(RUN, f"r{i}", params, None, None))
        slept = []
        shipper = rt.pipeline.shipper
        with shipper._ship_lock:  # the shipper's thread waits: every sleep below is this call's
            monkeypatch.setattr(wire, "YIELD_AFTER_NS", 0)  # a pause after every request read
            monkeypatch.setattr(shipper_module.time, "sleep", slept.append)
            read = shipper._requests(rt.verify)
            monkeypatch.undo()
        assert [note.request_id for note, _, _ in read] == ["r0", "r1", "r2"]
        assert read[0][0].params["temperature"] == 0.7
        assert slept == [wire.YIELD_S] * 3
    finally:
        runtime.stop()


def test_draft_dicts_travel_packed_once_with_pauses_for_the_gil(tmp_path, monkeypatch):
    from spectrace.recorder import shipper as shipper_module
    from spectrace.recorder import wire

    rt = _start(tmp_path, record_tokens=True)
    try:
        drafts = {"a": [1, 2, 3], "b": [4, 4, 4]}
        long_row = {"a": [7] * 300}  # a row of 256 drafts or more does not pack: it travels as it is
        engine = [EngineStep(1, 0, RUN, drafts, [3, 1], {"a": 0, "b": 1}, None, None, 1),
                  EngineStep(2, 1, RUN, long_row, [3], {"a": 0}, None, None, 1)]
        worker = [WorkerStep(1, RUN, None, drafts, [3, 1], {"a": 0, "b": 1}), WorkerStep(2, RUN, None, [3], [3], None)]
        shipper = rt.pipeline.shipper
        slept = []
        with shipper._ship_lock:  # the shipper's thread waits: every sleep below is this call's
            monkeypatch.setattr(wire, "YIELD_AFTER_NS", 0)  # a pause after every step
            monkeypatch.setattr(shipper_module.time, "sleep", slept.append)
            engine_out, worker_out = shipper._steps(engine, worker)
            monkeypatch.undo()
        assert slept == [wire.YIELD_S] * 4
        assert engine_out[0].drafts == wire.PackedDrafts(["a", "b"], bytes([3, 3]), struct.pack("=6i", 1, 2, 3, 4, 4, 4))
        assert worker_out[0].drafts is engine_out[0].drafts  # the dict both steps hold, packed once
        assert engine_out[1].drafts is long_row and worker_out[1] is worker[1]
        rt.verify.engine_steps.extend(engine)  # through the shipper and the pipeline process: counted as dicts are
        rt.flush()
    finally:
        runtime.stop()
    con = spectrace.store.open(tmp_path / "store")
    rows = con.execute("select step, request_id, num_drafted, num_accepted, draft_token_ids from verify_steps "
                       "where run_id = ? order by step, request_id", [RUN]).fetchall()
    assert rows == [(0, "a", 3, 2, "[1, 2, 3]"), (0, "b", 3, 0, "[4, 4, 4]"), (1, "a", 300, 2, json.dumps([7] * 300))]
    shapes = con.execute("select sum(rows), sum(repeated_rows), sum(repeated_drafted) from draft_shapes "
                         "where run_id = ?", [RUN]).fetchone()
    assert shapes == (3, 2, 303)  # "b" and the long row are one id repeated


def _worker_steps(rt, n: int) -> None:
    for _ in range(n):  # the worker's side of _steps: "a" 3 tokens sampled (2 accepted), "b" 1
        rt.verify.add_worker_step(RUN, None, {"a": [1, 2, 3], "b": [4, 5, 6]}, [[7, 8, 9], [7]], {"a": 0, "b": 1})


def _disagreements(store) -> int:
    con = spectrace.store.open(store)
    return con.execute("select count(*) from findings where run_id = ? and code = 'VERIFY_DISAGREEMENT'",
                       [RUN]).fetchone()[0]


def test_an_engine_that_ends_in_order_has_its_last_run_judged(tmp_path):
    rt = _start(tmp_path)
    try:
        _steps(rt, 3)
        _worker_steps(rt, 4)  # the worker verified a step the engine core never counted
    finally:
        runtime.stop()  # the last message, then EOF: the pipeline process judges the run
    assert _disagreements(tmp_path / "store") == 1


def test_an_engine_killed_with_a_step_in_flight_is_not_judged_a_disagreement(tmp_path, capfd):
    rt = _start(tmp_path)
    shipper = rt.pipeline.shipper
    try:
        _steps(rt, 3)
        _worker_steps(rt, 4)  # the fourth step's engine-core side was never recorded: the engine died in it
        rt.flush()  # shipped and written
        proc = shipper.proc
        shipper._stop.set()  # as after a kill: no last message, only EOF
        shipper._thread.join(timeout=10)
        shipper._closed = True
        proc.stdin.close()
        assert proc.wait(timeout=60) == "unknown"  # it exited; its status is its adopter's (recorder.detached)
    finally:
        runtime.stop()
    assert _disagreements(tmp_path / "store") == 0
    con = spectrace.store.open(tmp_path / "store")
    assert con.execute("select count(*) from verify_steps where run_id = ? and process_role = 'engine_core'",
                       [RUN]).fetchone()[0] == 6  # what it shipped is written
    assert "ended without its last message" in capfd.readouterr().err


# a stand-in for the pipeline process: what it read until EOF, written to a file once its stdin closes (renamed into
# place: a file created and then written was once read empty in between, under load)
ECHO = """
import os, sys
data = sys.stdin.buffer.read()
open(OUT + ".tmp", "wb").write(data)
os.replace(OUT + ".tmp", OUT)  # whole or not there: the test reads it as soon as it exists
"""
PARENT = """
import sys, time
from spectrace.recorder import detached
child = detached.launch(sys.executable, "echo_until_eof", dict(__import__("os").environ))
child.stdin.write(b"records taken, not written yet")
child.stdin.flush()
print(child.pid, flush=True)
time.sleep(120)
"""


def test_the_pipeline_process_outlives_a_kill_of_the_engines_whole_tree(tmp_path):
    """vLLM's shutdown SIGKILLs the engine core and every process psutil finds under it (kill_process_tree); the
    pipeline process is not among them, reads EOF once the engine is gone and writes what it had taken."""
    import signal
    import subprocess
    import sys

    import psutil

    from spectrace.recorder.detached import Detached

    out = tmp_path / "out.bin"
    (tmp_path / "echo_until_eof.py").write_text(ECHO.replace("OUT", repr(str(out))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, env=env, text=True)
    try:
        pid = int(parent.stdout.readline())
        tree = [p.pid for p in psutil.Process(parent.pid).children(recursive=True)]
        assert pid not in tree and psutil.pid_exists(pid)  # not the engine's child, nor its child's
        for victim in tree + [parent.pid]:  # as vllm.utils.system_utils.kill_process_tree does
            os.kill(victim, signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert out.read_bytes() == b"records taken, not written yet"
    finally:
        if parent.poll() is None:
            parent.kill()
    # the shipper's handle on a process it did not fork: exited, its status not ours to read
    handle = Detached(SimpleNamespace(stdin=None, stdout=None), pid)
    assert handle.wait(timeout=30) == "unknown" and handle.poll() == "unknown"
