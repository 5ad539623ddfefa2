"""No fault in the telemetry path may slow, crash or change the engine (real vLLM runs)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import pyarrow.parquet as pq
import pytest

import spectrace.store
from spectrace.testing.engine import method_specs, run_engines
from spectrace.testing.otlp import OtlpReceiver
from spectrace.testing.prometheus import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.server]

ENV_OTLP = {"SPECTRACE_EXPORTER": "duckdb,otlp", "OTEL_METRIC_EXPORT_INTERVAL": "500", "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}


def _seeded(zoo, **changes):
    spec = method_specs(zoo)[1]
    assert spec.name == "seeded"
    for key, value in changes.items():
        setattr(spec, key, value)
    return spec


def _counts_match_vllm(store, result):
    con = spectrace.store.open(store)
    accepted = [r[0] for r in con.execute(
        "select accepted from acceptance_by_position where run_id = ? order by position", [result.run_id]
    ).fetchall()]
    drafted = con.execute("select sum(drafted) from acceptance_by_position where run_id = ?", [result.run_id]).fetchone()[0]
    return accepted == result.metrics["vllm:spec_decode_num_accepted_tokens_per_pos"] and drafted == result.metrics[
        "vllm:spec_decode_num_draft_tokens"
    ]


def _log_lines(log_file, needle):
    return [line for line in log_file.read_text().splitlines() if needle in line]


def test_otlp_endpoint_down(zoo, scratch, cache_root, untraced_methods):
    store, log = scratch / "down-store", scratch / "down.log"
    closed = free_port()  # nothing listens there
    result = run_engines(
        [_seeded(zoo)], store=store, cache_root=cache_root, log_file=log,
        env={**ENV_OTLP, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed}"},
    )["seeded"]
    assert result.ok, result.error
    assert result.tokens == untraced_methods["seeded"].tokens
    assert _counts_match_vllm(store, result)
    failing = _log_lines(log, "export to http://127.0.0.1")
    assert 1 <= len(failing) <= 2  # one line per export path (spans, metrics), not one per attempt
    assert {("span" in line, "metric" in line) for line in failing} <= {(True, False), (False, True)}


def test_otlp_black_hole_then_recovery(zoo, scratch, cache_root, untraced_methods):
    """An endpoint that accepts and never answers, then a real receiver on the same port."""
    store, log = scratch / "hole-store", scratch / "hole.log"
    port = free_port()
    hole = socket.socket()
    hole.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    hole.bind(("127.0.0.1", port))
    hole.listen(64)  # accepts connections (kernel backlog), never reads or replies
    results = {}
    spec = _seeded(zoo, linger_s=14.0)  # 6 s in the hole, then time to recover
    worker = threading.Thread(
        target=lambda: results.update(run_engines(
            [spec], store=store, cache_root=cache_root, log_file=log,
            env={**ENV_OTLP, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"},
        ))
    )
    worker.start()
    deadline = time.time() + 240
    while time.time() < deadline and not list(store.glob("verify_counts/*/*.parquet")):
        time.sleep(0.2)
    # keep the hole for a few export timeouts (2 s each, one export every 0.5 s): under load the
    # first export can come well after the first segment; closed too early, nothing fails and so
    # nothing recovers (the log is only written when the engine exits)
    time.sleep(6)
    hole.close()
    with OtlpReceiver(http_port=port) as receiver:
        worker.join(timeout=300)
        received = receiver.metric_points("spectrace.verify.drafted_tokens")
    result = results["seeded"]
    assert result.ok, result.error
    assert result.tokens == untraced_methods["seeded"].tokens
    assert _counts_match_vllm(store, result)
    assert received, "no metrics reached the receiver after the endpoint came back"
    assert _log_lines(log, "is failing"), "no export hung in the black hole"
    assert _log_lines(log, "export recovered")


def test_hook_that_raises_is_counted_logged_once_and_harmless(zoo, scratch, cache_root, untraced_methods):
    store, log = scratch / "fault-store", scratch / "fault.log"
    result = run_engines(
        [_seeded(zoo)], store=store, cache_root=cache_root, log_file=log,
        env={"SPECTRACE_INJECT_FAULT": "engine_core.verify"},
    )["seeded"]
    assert result.ok, result.error
    assert result.tokens == untraced_methods["seeded"].tokens
    con = spectrace.store.open(store)
    errors = con.execute("select sum(count) from internal_errors where hook = 'engine_core.verify'").fetchone()[0]
    assert errors > 0  # every engine step with drafts raised inside the hook ...
    assert con.execute("select count(*) from verify_counts where source = 'engine_core'").fetchone()[0] == 0
    # ... while the worker-side capture, a different hook, still counted what vLLM reports
    worker = con.execute("select sum(drafted) from verify_counts where source = 'worker'").fetchone()[0]
    assert worker == result.metrics["vllm:spec_decode_num_draft_tokens"]
    assert len(_log_lines(log, "hook engine_core.verify raised")) == 1
    # the rest of spectrace kept working
    assert con.execute("select count(*) from attention_layout where run_id = ?", [result.run_id]).fetchone()[0] > 0


def test_unwritable_store_is_one_error_and_engine_unaffected(zoo, scratch, cache_root, untraced_methods):
    blocker = scratch / "not-a-dir"
    blocker.write_text("a file where the store should be")
    log = scratch / "unwritable.log"
    result = run_engines(
        [_seeded(zoo)], store=blocker / "store", cache_root=cache_root, log_file=log, scratch=scratch
    )["seeded"]
    assert result.ok, result.error
    assert result.tokens == untraced_methods["seeded"].tokens
    assert len(_log_lines(log, "cannot write to SPECTRACE_DIR")) == 1


def test_store_cap_removes_finished_runs_and_records_it(zoo, scratch, cache_root, traced_methods):
    import shutil

    old_store, _ = traced_methods
    store = scratch / "capped-store"
    shutil.copytree(old_store, store)
    old_runs = {p.name for p in store.glob("*/run=*")}
    # the cap: well under what the finished runs alone hold (0.6-0.9 MB, depending on the flushes they
    # got), well over the live run's own files (~0.15 MB quiet, more under load: more, smaller flushes),
    # so finished runs must be evicted and nothing of the live run may be dropped
    cap = 0.6 * sum(p.stat().st_size for p in store.rglob("*.parquet"))
    assert cap > 0.3e6
    past = time.time() - 3600
    for path in store.rglob("*.parquet"):
        os.utime(path, (past, past))
    log = scratch / "capped.log"
    result = run_engines(
        [_seeded(zoo, linger_s=6.0)], store=store, cache_root=cache_root, log_file=log,
        env={"SPECTRACE_MAX_MB": f"{cap / 1e6:.3f}", "SPECTRACE_RECORD_TOKENS": "1", "SPECTRACE_FLUSH_INTERVAL": "0.2"},
    )["seeded"]
    assert result.ok, result.error
    con = spectrace.store.open(store)
    evicted = {r[0] for r in con.execute("select evicted_run_id from store_evictions").fetchall()}
    assert evicted and result.run_id not in evicted
    assert evicted <= {name.removeprefix("run=") for name in old_runs}
    size = sum(p.stat().st_size for p in store.rglob("*.parquet"))
    assert size <= cap * 1.5  # the cap, plus what the last flushes wrote before the next check
    assert _log_lines(log, "over SPECTRACE_MAX_MB")
    # the live run is complete, with token ids because SPECTRACE_RECORD_TOKENS=1
    assert _counts_match_vllm(store, result)
    ids = con.execute("select draft_token_ids from verify_steps where run_id = ? limit 1", [result.run_id]).fetchone()[0]
    assert ids is not None and len(json.loads(ids)) == 3


def test_nothing_sensitive_is_recorded_by_default(traced_methods):
    from spectrace.testing.engine import DEFAULT_PROMPTS

    store, _ = traced_methods
    con = spectrace.store.open(store)
    assert con.execute("select count(*) from verify_steps where draft_token_ids is not null").fetchone()[0] == 0
    needles = [p for p in DEFAULT_PROMPTS if len(p) > 10]
    import pyarrow as pa

    for path in store.rglob("*.parquet"):
        table = pq.read_table(path)
        strings = [name for name, kind in zip(table.column_names, table.schema.types) if kind == pa.string()]
        text = str(table.select(strings).to_pylist())
        for needle in needles:
            assert needle not in text, (path, needle)


def test_worker_killed_mid_run_leaves_a_readable_store(zoo, scratch, cache_root):
    store, log = scratch / "kill-store", scratch / "kill.log"
    spec = _seeded(zoo, repeat=400)
    results = {}
    runner = threading.Thread(
        target=lambda: results.update(run_engines(
            [spec], store=store, cache_root=cache_root, log_file=log, multiprocessing=True,
            env={"SPECTRACE_FLUSH_INTERVAL": "0.5"},
        ))
    )
    runner.start()
    pid = None
    deadline = time.time() + 240
    while time.time() < deadline:
        if len(list(store.glob("verify_counts/*/*.parquet"))) >= 3:
            con = spectrace.store.open(store)
            row = con.execute("select pid from spans where process_role = 'worker' limit 1").fetchone()
            if row:
                pid = row[0]
                break
        time.sleep(0.2)
    assert pid is not None, "the engine never got going"
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    runner.join(timeout=300)
    assert not results["seeded"].ok  # the engine died, as it should without its worker
    for path in store.rglob("*.parquet"):
        pq.read_table(path)  # every segment on disk is whole
    con = spectrace.store.open(store)
    last = con.execute(
        "select max(epoch_ns(ts)) / 1e9 from verify_counts where pid = ?", [pid]
    ).fetchone()[0]
    # at most about one flush interval lost (allowing for a loaded 2-core machine)
    assert killed_at - last < 0.5 * 6
