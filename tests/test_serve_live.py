"""`vllm serve` (the OpenAI API server, AsyncLLM, multi-process) with SPECTRACE=1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

import spectrace.store
from spectrace.testing.engine import base_env
from spectrace.testing.otlp import OtlpReceiver
from spectrace.testing.prometheus import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.server]

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


def _post(port, body, headers):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def test_api_server_run_with_links_to_request_traces(zoo, scratch, cache_root):
    store = scratch / "serve-store"
    port = free_port()
    env = base_env(store, multiprocessing=True, cache_root=cache_root)
    env["SPECTRACE_SPAN_EVERY"] = "1"
    log = open(scratch / "serve.log", "w")
    with OtlpReceiver() as receiver:
        server = subprocess.Popen(
            [
                sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                "--model", zoo["target"], "--host", "127.0.0.1", "--port", str(port),
                "--dtype", "float32", "--enforce-eager", "--max-model-len", "512",
                "--kv-cache-memory-bytes", str(64 << 20),
                "--speculative-config", json.dumps(
                    {"method": "draft_model", "model": zoo["draft_self"], "num_speculative_tokens": 3}
                ),
                # vLLM's own request tracing on: its trace headers reach the engine core
                "--otlp-traces-endpoint", f"127.0.0.1:{receiver.grpc_port}",
            ],
            env={**env, "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.time() + 300
            while time.time() < deadline:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                    break
                except OSError:
                    assert server.poll() is None, (scratch / "serve.log").read_text()[-3000:]
                    time.sleep(1)
            reply = _post(
                port,
                {"model": zoo["target"], "prompt": "the quick brown fox", "max_tokens": 12, "temperature": 0},
                {"traceparent": f"00-{TRACE_ID}-b7ad6b7169203331-01"},
            )
            assert reply["choices"][0]["finish_reason"] == "length"
            _wait_for_both_sides(store)
        finally:
            os.killpg(server.pid, signal.SIGINT)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
            log.close()
    con = spectrace.store.open(store)
    [(run_id, method)] = con.execute("select run_id, method from runs").fetchall()
    assert method == "draft_model"
    roles = dict(con.execute("select process_role, count(distinct pid) from spans where run_id = ? group by 1", [run_id]).fetchall())
    assert set(roles) >= {"frontend", "engine_core", "worker"}
    links = [
        json.loads(r[0])
        for r in con.execute(
            "select links from spans where run_id = ? and name = 'spectrace.verify.step'", [run_id]
        ).fetchall()
    ]
    assert links and all(any(link["trace_id"] == TRACE_ID for link in step) for step in links)
    # verification counted in the engine core, and each step's drafts agree with the worker
    by_source = dict(con.execute(
        "select source, sum(drafted) from verify_counts where run_id = ? group by 1", [run_id]
    ).fetchall())
    assert by_source["engine_core"] == by_source["worker"] > 0


def _wait_for_both_sides(store, timeout_s: float = 60.0) -> None:
    """Until the engine core's and the worker's flushes of the request's steps are both in the store (each process
    flushes on its own clock: under load one flush interval was not always enough for the worker's last step)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            sides = dict(spectrace.store.open(store).execute(
                "select source, sum(drafted) from verify_counts group by 1").fetchall())
        except spectrace.store.StoreError:
            sides = {}
        if sides.get("engine_core") and sides.get("engine_core") == sides.get("worker"):
            return
        time.sleep(0.5)
