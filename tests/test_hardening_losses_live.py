"""Hardening 3, item 1 on real vLLM runs (SPECTRACE_PIPELINE=process): the pipeline process of a real engine stopped
(SIGSTOP) for its last generate calls, and killed past its restarts. vLLM's tokens never change; every record the
engine's shipper could not hand over is counted in its stats, in its exit's totals line, in its own exposition file,
and, once a later pipeline process on the host runs (a second, short engine on the same store), in the store's
``internal_errors`` (hook ``shipper.lost_records``). Without vLLM: tests/test_hardening_losses.py."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

import spectrace.store
from spectrace.recorder import losses
from tests.test_pipeline_process_live import PROCESS, _drafted, _pipelines_of, _running, _specs

pytestmark = [pytest.mark.vllm]

TOTALS = re.compile(r"this process \(pid (\d+)\) lost (\d+) records in (\d+) messages")
BOUND_S = 240  # every wait for the engine


def _lost_rows(store: Path) -> list[tuple[int, str, int]]:
    con = spectrace.store.open(store)
    return con.execute("select pid, run_id, count from internal_errors where hook = ? order by ts",
                       [losses.HOOK]).fetchall()


def _claim(zoo, store: Path, cache_root: Path, log_file: Path) -> None:
    """A second, short engine on the same store: its pipeline process claims the ledgers of exited processes."""
    from spectrace.testing.engine import run_engines

    result = run_engines(_specs(zoo, "self", prompts=["the quick brown fox"], max_tokens=4), store=store,
                         cache_root=cache_root, log_file=log_file, env=PROCESS)["self"]
    assert result.ok, result.error


def _totals(log: str) -> tuple[int, int]:
    """The one totals line of the engine's exit: (pid, records lost)."""
    found = TOTALS.findall(log)
    assert len(found) == 1, _said(log)
    return int(found[0][0]), int(found[0][1])


def _said(log: str) -> str:
    """spectrace's warnings and errors in an engine's log (an assertion's message)."""
    return "\n".join(line[:600] for line in log.splitlines() if "spectrace" in line and "INFO" not in line)[-6000:]


def _metric(metrics_dir: Path, pid: int, name: str) -> float:
    """A sample of the engine process's own exposition file (``<pid>.<start>.shipper.prom``)."""
    files = list(metrics_dir.glob(f"{pid}.*.shipper.prom"))
    assert len(files) == 1, list(metrics_dir.iterdir())
    for line in files[0].read_text().splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in {files[0]}")


def _run(zoo, store, cache_root, log_file, metrics_dir, watch, enough):
    """The "self" engine, generating until ``enough`` exists, while ``watch(stop)`` acts on its pipeline process."""
    from spectrace.testing.engine import run_engines

    stop = threading.Event()
    failure: list[BaseException] = []

    def watcher():
        try:
            watch(stop)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failure.append(exc)
        finally:
            enough.touch()  # whatever happened: the engine stops repeating

    thread = threading.Thread(target=watcher, daemon=True)
    thread.start()
    try:
        result = run_engines(
            _specs(zoo, "self", repeat=400, repeat_until_file=str(enough)), store=store, cache_root=cache_root,
            log_file=log_file, env={**PROCESS, "SPECTRACE_SHIP_INTERVAL": "0.1", "SPECTRACE_METRICS_DIR": str(metrics_dir)},
        )["self"]
    finally:
        stop.set()
        thread.join(timeout=30)
    if failure:
        raise failure[0]
    return result


def _wait(condition, stop: threading.Event, what: str, timeout: float = BOUND_S):
    deadline = time.monotonic() + timeout
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            got = condition()
        except Exception:  # no rows yet, a process gone while read
            got = None
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"never: {what}")


def test_a_pipeline_process_stopped_for_the_last_calls_loses_nothing_uncounted(zoo, scratch, cache_root, untraced_methods):
    store, log_file, enough = scratch / "lost-stopped-store", scratch / "lost-stopped.log", scratch / "lost-stopped-enough"
    metrics_dir = scratch / "lost-stopped-metrics"
    stopped: list[int] = []

    def watch(stop):
        _wait(lambda: _drafted(store).get("engine_core"), stop, "the first calls written")  # rows in the store
        (pipeline,) = _wait(lambda: (lambda found: found if len(found) == 1 else None)(_pipelines_of(store)), stop,
                            "a pipeline process")
        os.kill(pipeline, signal.SIGSTOP)  # for the last calls: it reads and writes nothing more
        stopped.append(pipeline)  # the call running now is the last: what it drafts from here waits in the pipe

    try:
        result = _run(zoo, store, cache_root, log_file, metrics_dir, watch, enough)
    finally:
        for pid in stopped:
            if _running(pid):  # the shipper should have killed it; never leave one stopped
                os.kill(pid, signal.SIGKILL)
    assert result.ok, result.error
    assert result.tokens == untraced_methods["self"].tokens  # vLLM never noticed
    assert stopped and not _running(stopped[0])  # killed at the engine's exit
    log = log_file.read_text()
    said = _said(log)
    assert "its pipe stayed full" not in log, said  # it stayed stopped, its pipe never full, until the exit
    assert "is stopped (SIGSTOP?) at exit; killed" in log, said
    assert "is stopped (SIGSTOP?); not waiting for its flush" in log  # the harness's flush: bounded, not a minute
    pid, lost = _totals(log)
    # what vLLM drafted and the store lacks: steps after the stop, each counted as a lost record
    vllm_drafted = result.metrics["vllm:spec_decode_num_draft_tokens"]
    stored = _drafted(store)["engine_core"]
    missing = vllm_drafted - stored
    k, prompts = result_k(result), len(untraced_methods["self"].tokens)
    assert 0 < stored < vllm_drafted, (stored, vllm_drafted)
    assert lost * k * prompts >= missing > 0, (lost, missing)  # a step drafts at most k tokens per request
    # the harness read the shipper's stats before the exit: the stopped process's messages were shipped, unconfirmed
    shipper = result.exporter["shipper"]
    assert shipper["started"] == 1 and shipper["stopped"] is None
    assert shipper["unconfirmed_records"] > 0 and shipper["lost_records"] + shipper["unconfirmed_records"] <= lost
    assert _metric(metrics_dir, pid, "spectrace_shipper_lost_records_total") == lost
    assert _metric(metrics_dir, pid, "spectrace_tracing_stopped") == 0
    ledgers = list((store / losses.FOLDER).glob("*.json"))
    assert len(ledgers) == 1 and ledgers[0].name.split(".")[-3] == str(pid)
    assert _lost_rows(store) == []  # nobody has written the count yet
    _claim(zoo, store, cache_root, scratch / "lost-stopped-claim.log")
    assert _lost_rows(store) == [(pid, result.run_id, lost)]
    assert not list((store / losses.FOLDER).glob("*.json"))  # taken once


def result_k(result) -> int:
    """Draft tokens per step: vLLM's per-position counters have one entry a position."""
    return len(result.metrics["vllm:spec_decode_num_accepted_tokens_per_pos"])


def test_a_pipeline_process_killed_past_its_restarts_stops_tracing_once_and_every_loss_reaches_the_store(
        zoo, scratch, cache_root, untraced_methods):
    store, log_file, enough = scratch / "lost-killed-store", scratch / "lost-killed.log", scratch / "lost-killed-enough"
    metrics_dir = scratch / "lost-killed-metrics"
    killed: list[int] = []

    def watch(stop):
        _wait(lambda: _drafted(store).get("engine_core"), stop, "the first calls written")
        for _ in range(4):  # the first and its 3 restarts
            # exactly one: a restart's launcher (spectrace.recorder.detached) shares the pipeline's environment for
            # the moment between its fork and its exit, and was once listed beside it
            (pipeline,) = _wait(lambda: (lambda found: found if len(found) == 1 else None)(
                [p for p in _pipelines_of(store) if p not in killed]), stop,
                                f"pipeline process {len(killed) + 1}")
            os.kill(pipeline, signal.SIGKILL)
            killed.append(pipeline)
            _wait(lambda: not _running(pipeline), stop, "the killed process gone", timeout=30)
        time.sleep(1.5)  # no fifth: the calls go on untraced, counted

    result = _run(zoo, store, cache_root, log_file, metrics_dir, watch, enough)
    assert result.ok, result.error
    assert result.tokens == untraced_methods["self"].tokens
    assert len(killed) == 4 and not _pipelines_of(store)
    log = log_file.read_text()
    loud = [line for line in log.splitlines() if "TRACING STOPPED" in line]
    assert len(loud) == 1 and "past its 3 restarts" in loud[0], _said(log)
    assert "(3 of 3)" in log
    pid, lost = _totals(log)
    shipper = result.exporter["shipper"]
    assert shipper["started"] == 4 and "past its 3 restarts" in shipper["stopped"]
    assert 0 < shipper["lost_records"] <= lost  # the counting went on after the stop (and at the exit)
    assert _metric(metrics_dir, pid, "spectrace_shipper_lost_records_total") == lost
    assert _metric(metrics_dir, pid, "spectrace_tracing_stopped") == 1
    # the store lacks what vLLM drafted after the first kill
    stored, vllm_drafted = _drafted(store)["engine_core"], result.metrics["vllm:spec_decode_num_draft_tokens"]
    assert 0 < stored < vllm_drafted
    assert lost * result_k(result) * len(result.tokens) >= vllm_drafted - stored
    # the restarted processes wrote what their predecessors lost; the ledger holds the rest until a later process
    before = sum(count for p, _, count in _lost_rows(store) if p == pid)
    assert before < lost
    _claim(zoo, store, cache_root, scratch / "lost-killed-claim.log")
    rows = _lost_rows(store)
    assert {p for p, _, _ in rows} == {pid}
    assert sum(count for _, _, count in rows) == lost  # every lost record in the store, once
    assert not list((store / losses.FOLDER).glob("*.json"))
