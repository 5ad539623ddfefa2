"""A process forked from a traced one records its own rows, even when the parent's flush
thread held the pipeline's and the store's locks at the fork (no vLLM: the runtime and the real segment store)."""

from __future__ import annotations

import os
import threading
import time

import spectrace.store
from spectrace.settings import Settings
from spectrace.recorder import runtime, verify


def _wait(pid: int, timeout_s: float = 60.0) -> int:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child hung (a lock inherited held?)")


def test_forked_child_rebuilds_everything_and_records_its_own_rows(tmp_path):
    # the flush thread's locks held at the fork (the thread shape; a pytest worker that imported vLLM would pick
    # the pipeline process under auto)
    settings = Settings(enabled=True, dir=tmp_path, exporters=("duckdb",), flush_interval_s=0.05, pipeline="thread")
    rt = runtime.start(settings, hooks=[], make_capture=verify.VerifyCapture)
    try:
        rt.record("runs", {"run_id": "parent-run", "started_at": 1}, role="frontend")  # buffered, not yet written
        held, release = threading.Event(), threading.Event()

        def flush_in_progress():  # what the flush thread holds while it writes
            with rt.pipeline._flush_lock, rt.pipeline._lock, rt.pipeline.sink("duckdb")._io_lock, rt.drain._lock:
                held.set()
                release.wait(30)

        holder = threading.Thread(target=flush_in_progress)
        holder.start()
        assert held.wait(5)
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                child = runtime.get()
                fresh = (
                    child is not rt
                    and child.pid == os.getpid()
                    and child.pipeline is not rt.pipeline
                    and child.verify is not rt.verify
                    and child.drain is not rt.drain
                    and child.hooks is rt.hooks
                )
                child.record("runs", {"run_id": "child-run", "started_at": 2}, role="frontend")
                child.count_error("child.hook", RuntimeError("counted in the child"))
                child.flush()
                code = 0 if fresh else 3
            finally:
                os._exit(code)
        release.set()
        holder.join()
        assert _wait(pid) == 0
        rt.flush()
    finally:
        runtime.stop()
    con = spectrace.store.open(tmp_path)
    runs = con.execute("select run_id, pid from runs order by run_id").fetchall()
    assert runs == [("child-run", pid), ("parent-run", os.getpid())]  # the parent's buffered row once, not twice
    assert con.execute("select hook, pid, count from internal_errors").fetchall() == [("child.hook", pid, 1)]


def test_guard_never_raises_and_counts_what_it_catches(tmp_path):
    settings = Settings(enabled=True, dir=tmp_path, exporters=("duckdb",), inject_fault="some.hook", pipeline="thread")
    rt = runtime.start(settings, hooks=[], make_capture=verify.VerifyCapture)
    try:
        given = []
        with runtime.guard("some.hook") as got:  # injected: the hook's work is skipped, as if it had raised
            given.append(got)
        with runtime.guard("other.hook") as got:
            given.append(got)
            raise ValueError("a bug inside spectrace")
        assert given == [None, rt]
        assert rt.errors == {"some.hook": 1, "other.hook": 1}
    finally:
        runtime.stop()


def test_pause_switches_every_hook_off_and_resume_back_on(tmp_path):
    rt = runtime.start(Settings(enabled=True, dir=tmp_path, exporters=("duckdb",), pipeline="thread"), hooks=[],
                       make_capture=verify.VerifyCapture)
    try:
        rt.record("runs", {"run_id": "before", "started_at": 1}, role="frontend")
        runtime.pause()
        with runtime.guard("some.hook") as got:
            assert got is None  # the hooks find no runtime: they return at once
        assert runtime.get() is None and rt.pipeline.paused
        runtime.resume()
        with runtime.guard("some.hook") as got:
            assert got is rt
        assert not rt.pipeline.paused
        rt.flush()
    finally:
        runtime.stop()
    # nothing buffered before the pause was lost
    assert spectrace.store.open(tmp_path).execute("select run_id from runs").fetchall() == [("before",)]
