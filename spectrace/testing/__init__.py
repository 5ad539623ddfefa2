"""Helpers for spectrace's own tests: tiny models, real engines and servers, real Prometheus,
PostgreSQL and OTLP receivers on 127.0.0.1."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.5):
    """``predicate()``'s first truthy value, asked every ``interval_s``; AssertionError naming
    ``what`` after ``timeout_s``."""
    deadline = time.time() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.time() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


@contextmanager
def fresh_run_env():
    """No run inherited from the environment inside (``SPECTRACE_ACTIVE_RUN`` unset), and the environment as it was
    afterwards: the frontend's hook starts a run and hands it to child processes there, and a later test's runtime
    would join that run."""
    from spectrace.settings import ACTIVE_RUN_ENV

    inherited = os.environ.pop(ACTIVE_RUN_ENV, None)
    try:
        yield
    finally:
        os.environ.pop(ACTIVE_RUN_ENV, None)
        if inherited is not None:
            os.environ[ACTIVE_RUN_ENV] = inherited


def store_pipeline(root, *, host: str = "testhost", clock=None, **settings):
    """A pipeline with the store sink only, built as a traced process builds it (the sink registry,
    from a ``Settings``), writing to ``root``. ``settings``: any other ``Settings`` field, stated by the
    test (retention, compaction, cap, buffer); ``clock``: the store's clock (a replayed week)."""
    from pathlib import Path

    from spectrace.sinks import build
    from spectrace.settings import Settings

    pipeline, _ = build(Settings(dir=Path(root), host=host, exporters=("duckdb",), **settings))
    if clock is not None:
        store = pipeline.sink("duckdb")
        store.clock, store.start_ns = clock, clock()
    return pipeline


def memory_runtime(root, run_id: str, **settings):
    """A started runtime with the verification capture, hooks not installed, exporters off and one memory sink,
    with run ``run_id`` set: the drain and the detectors on records a test appends (``(runtime, sink)``; stop it
    with ``runtime.stop()``). ``settings``: any other ``Settings`` field. The flush runs on a thread of this process
    (``pipeline="thread"``, whether or not vLLM is loaded here): the memory sink is this process's."""
    from pathlib import Path

    from spectrace.settings import Settings
    from spectrace.sinks.memory import MemorySink
    from spectrace.recorder import runtime, verify

    rt = runtime.start(Settings(**{"enabled": True, "dir": Path(root), "exporters": (), "span_every_steps": 0,
                                   "pipeline": "thread", **settings}), hooks=[], make_capture=verify.VerifyCapture)
    sink = MemorySink()
    rt.pipeline.add_sink(sink)
    rt.set_run(runtime.Run(run_id=run_id, traceparent=""))
    return rt, sink
