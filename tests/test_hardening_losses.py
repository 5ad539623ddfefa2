"""Hardening 3, item 1: every record the engine's side could not hand to a pipeline process is counted where a user
sees it, even when the process that writes the store is the one that failed. Real processes, no vLLM: an "engine"
(a Python process running the real runtime with SPECTRACE_PIPELINE=process) and its real pipeline process, stopped
with SIGSTOP and killed for real. (On real vLLM runs: tests/test_pipeline_process_live.py.)"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import spectrace.store
from spectrace.sinks.exposition import FileCollector
from spectrace.recorder import losses, shipper as shipper_module

from spectrace.settings import Settings
from spectrace.recorder import runtime
from spectrace.recorder.verify import VerifyCapture
from tests.test_pipeline_process import RUN, _steps


def _start(tmp_path, exporters=("duckdb",), **settings):
    s = Settings(enabled=True, dir=tmp_path / "store", metrics_dir=tmp_path / "metrics", exporters=exporters,
                 pipeline="process", span_every_steps=0, **settings)
    rt = runtime.start(s, hooks=[], make_capture=VerifyCapture)
    rt.set_run(runtime.Run(run_id=RUN, traceparent=""))
    rt.enter_role("engine_core")
    return rt

ENGINE = r'''
import json, os, signal, sys, time
from pathlib import Path
from types import SimpleNamespace
from spectrace.settings import Settings
from spectrace.recorder import runtime, shipper
from spectrace.recorder.verify import EngineStep, VerifyCapture

shipper.EXIT_WAIT_S = shipper.PIPE_FULL_S = 3.0
store, metrics, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
s = Settings(enabled=True, dir=store, metrics_dir=metrics, exporters=("duckdb", "prometheus"), pipeline="process",
             span_every_steps=0)
rt = runtime.start(s, hooks=[], make_capture=VerifyCapture)
rt.set_run(runtime.Run(run_id="run-lost", traceparent=""))
rt.enter_role("engine_core")

def steps(n, start):
    for i in range(start, start + n):
        rt.verify.engine_steps.append(EngineStep(time.time_ns(), i, "run-lost", {"a": [1, 2, 3], "b": [4, 5, 6]}, [3, 1],
            {"a": 0, "b": 1}, SimpleNamespace(req_ids=["a", "b"], num_computed_tokens=[10 + i, 20 + i]), None, 1))

steps(3, 0)
rt.flush()
pipeline = rt.pipeline.shipper.proc.pid
os.kill(pipeline, signal.SIGSTOP)  # stopped for the engine's last steps
steps(5, 3)
rt.pipeline.shipper.ship()  # in its pipe, never read
steps(4, 8)
runtime.stop()  # the last message, EOF, a bounded wait: killed, the 9 steps counted
print(json.dumps({"engine": os.getpid(), "pipeline": pipeline, "shipper": rt.pipeline.shipper.stats()}))
'''


def _engine(tmp_path: Path) -> tuple[dict, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("SPECTRACE", None)
    done = subprocess.run([sys.executable, "-c", ENGINE, str(tmp_path / "store"), str(tmp_path / "metrics"), "stop"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def _lost_rows(store: Path) -> list[tuple]:
    con = spectrace.store.open(store)
    return con.execute("select pid, run_id, count, error from internal_errors where hook = ? order by ts",
                       [losses.HOOK]).fetchall()


def test_a_pipeline_process_stopped_at_exit_loses_nothing_uncounted_and_the_next_one_writes_the_count(tmp_path):
    out, log = _engine(tmp_path)
    stats = out["shipper"]
    # the 9 steps shipped to the stopped process (5 in its pipe, 4 in the last message): lost, counted, kept
    assert stats["lost_records"] == 9 and stats["lost_unreported"] == 9, stats
    assert "is stopped (SIGSTOP?) at exit; killed" in log or "took no records for 3 s at exit; killed" in log, log
    totals = [line for line in log.splitlines() if "lost 9 records" in line]
    assert len(totals) == 1 and "kept in" in totals[0], log
    ledgers = list((tmp_path / "store" / losses.FOLDER).glob("*.json"))
    assert len(ledgers) == 1 and json.loads(ledgers[0].read_text())["records"] == 9
    con = spectrace.store.open(tmp_path / "store")
    assert con.execute("select count(distinct step) from verify_steps").fetchone()[0] == 3  # what it wrote before
    assert _lost_rows(tmp_path / "store") == []  # nobody has written the count yet
    # the next process on this host (another engine, its own pipeline process) writes it into the store
    rt = _start(tmp_path)
    try:
        _steps(rt, 2)
        rt.flush()
    finally:
        runtime.stop()
    rows = _lost_rows(tmp_path / "store")
    assert [(pid, run, count) for pid, run, count, _ in rows] == [(out["engine"], "run-lost", 9)]
    assert "exited" in rows[0][3]
    assert not list((tmp_path / "store" / losses.FOLDER).glob("*.json"))  # taken once: a third process adds nothing
    rt = _start(tmp_path)
    runtime.stop()
    assert len(_lost_rows(tmp_path / "store")) == 1


def _kill(proc) -> None:
    proc.kill()
    proc.wait()


def test_past_its_restarts_the_shipper_keeps_counting_says_so_once_and_exports_the_count(tmp_path, caplog, monkeypatch):
    rt = _start(tmp_path, exporters=("duckdb", "prometheus"))
    shipper = rt.pipeline.shipper
    caplog.set_level(logging.WARNING, logger="vllm.spectrace")
    try:
        _steps(rt, 2)
        rt.flush()
        step = 2
        for _ in range(shipper_module.MAX_RESTARTS + 1):  # each pipeline process killed with a message unwritten
            _steps(rt, 3, start=step)
            step += 3
            shipper.ship()
            _kill(shipper.proc)
            _steps(rt, 1, start=step)
            step += 1
            rt.flush()  # a new one (3 restarts), then none
        assert shipper.started == shipper_module.MAX_RESTARTS + 1 and shipper.stopped
        lost = shipper.lost_records
        for _ in range(3):  # tracing stopped: the hooks' records are still taken and counted
            _steps(rt, 5, start=step)
            step += 5
            shipper.ship()
        assert shipper.lost_records == lost + 15
        stats = rt.pipeline.stats()["shipper"]
        assert stats["stopped"] and stats["lost_records"] == lost + 15
        stopped = [r for r in caplog.records if "TRACING STOPPED" in r.getMessage()]
        assert len(stopped) == 1 and stopped[0].levelno == logging.ERROR
        assert "past its 3 restarts" in stopped[0].getMessage()
        # the engine side's /metrics: its own exposition file, read as vLLM's /metrics reads every process's
        shipper._publish(force=True)
        collector = FileCollector(shipper.ledger.metrics_path.parent)
        samples = {s.name: s for family in collector.collect() for s in family.samples}
        assert samples["spectrace_shipper_lost_records_total"].value == lost + 15
        assert samples["spectrace_shipper_lost_records_total"].labels["pid"] == str(os.getpid())
        assert samples["spectrace_tracing_stopped"].value == 1
        assert "past its 3 restarts" in samples["spectrace_tracing_stopped"].labels["reason"]
    finally:
        runtime.stop()
    # the 4 messages killed with their processes: 3 counted in the store by the next pipeline process of this engine
    # (its start message), the last one (and everything after) by none: in the ledger, with the totals logged
    totals = [r.getMessage() for r in caplog.records if "lost" in r.getMessage() and "records in" in r.getMessage()]
    assert len(totals) == 1 and f"lost {lost + 15} records" in totals[0] and "tracing stopped" in totals[0]
    ledger = json.loads(shipper.ledger.path.read_text())
    written = sum(count for _, _, count, _ in _lost_rows(tmp_path / "store"))
    assert written == 3 * 3 and ledger["records"] == lost + 15 - written  # each lost record written or kept, once
    con = spectrace.store.open(tmp_path / "store")
    steps = {r[0] for r in con.execute("select distinct step from verify_steps").fetchall()}
    assert steps == {0, 1, 5, 9, 13}  # the steps every new process wrote; the killed ones' steps missing


def test_a_pipe_that_stays_full_is_a_hung_pipeline_process_killed_counted_and_replaced(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(shipper_module, "PIPE_FULL_S", 1.0)
    rt = _start(tmp_path)
    shipper = rt.pipeline.shipper
    caplog.set_level(logging.WARNING, logger="vllm.spectrace")
    try:
        _steps(rt, 2)
        rt.flush()
        first = shipper.proc
        os.kill(first.pid, signal.SIGSTOP)
        sent = 0
        began = time.monotonic()
        while shipper.proc is first and first.poll() is None and time.monotonic() - began < 60:
            _steps(rt, 200, start=100 + sent)  # until the pipe is full and stays full
            sent += 200
            shipper.ship()
        assert first.poll() is not None, "the stopped pipeline process was never given up on"
        assert any("its pipe stayed full" in r.getMessage() for r in caplog.records)
        _steps(rt, 2, start=10)
        rt.flush()  # a second process, which writes the new steps
        stats = rt.pipeline.stats()
        assert stats["shipper"]["started"] == 2 and stats["shipper"]["lost_records"] == sent
        assert stats["dropped"] >= sent
    finally:
        runtime.stop()
    con = spectrace.store.open(tmp_path / "store")
    assert {r[0] for r in con.execute("select distinct step from verify_steps").fetchall()} == {0, 1, 10, 11}
    rows = _lost_rows(tmp_path / "store")
    assert sum(count for _, _, count, _ in rows) == sent and {pid for pid, *_ in rows} == {os.getpid()}


def test_a_flush_thread_process_writes_the_ledgers_of_exited_shippers_at_its_start(tmp_path):
    """SPECTRACE_PIPELINE=thread: the traced process writes the store itself, so it takes the host's ledgers of
    shippers that exited (as a pipeline process does at its start), once."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(gone.stdout)
    settings = Settings(enabled=True, dir=tmp_path / "store", exporters=("duckdb",), pipeline="thread")
    ledger = losses.Ledger(settings, pid, settings.host)
    ledger.write(17, 17, 3, ["pipeline process stopped at exit"], "run-gone")
    assert ledger.path.is_file()
    rt = runtime.start(settings, hooks=[], make_capture=VerifyCapture)
    try:
        rt.flush()
    finally:
        runtime.stop()
    rows = spectrace.store.open(tmp_path / "store").execute(
        "select pid, run_id, count from internal_errors where hook = ?", [losses.HOOK]).fetchall()
    assert rows == [(pid, "run-gone", 17)]
    assert not ledger.path.exists() and list((tmp_path / "store" / losses.FOLDER).iterdir()) == []


def test_a_slow_pipeline_process_that_keeps_taking_bytes_is_not_killed(monkeypatch):
    """PIPE_FULL_S bounds a wait without a byte taken, not a whole message: a pipeline process that reads a large
    message slowly (here 448 KiB, 64 KiB every 0.15 s: about 1 s in all, over a 0.6 s limit) keeps its pipe and gets
    it all."""
    import threading
    from types import SimpleNamespace

    monkeypatch.setattr(shipper_module, "PIPE_FULL_S", 0.6)
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    got = bytearray()
    payload = os.urandom(448 << 10)

    def slow_reader():
        while len(got) < len(payload) + shipper_module.FRAME.size:
            time.sleep(0.15)
            got.extend(os.read(read_end, 64 << 10))

    reader = threading.Thread(target=slow_reader, daemon=True)
    reader.start()
    killed = []
    ship = object.__new__(shipper_module.Shipper)
    ship.proc = SimpleNamespace(stdin=SimpleNamespace(fileno=lambda: write_end), poll=lambda: None, pid=0,
                                kill=lambda: killed.append(1), wait=lambda timeout=None: 0)
    began = time.monotonic()
    try:
        assert ship._write(payload) is True
        reader.join(10)
    finally:
        os.close(write_end)
        os.close(read_end)
    assert time.monotonic() - began > 0.6 and not killed
    assert bytes(got[shipper_module.FRAME.size:]) == payload
