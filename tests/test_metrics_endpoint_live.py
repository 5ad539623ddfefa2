"""spectrace's series on vLLM's own /metrics: a real `vllm serve --api-server-count 2` (multiprocess
prometheus_client mode), a seeded drafter, a real Prometheus scraping only the API server's port."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict

import pytest
from prometheus_client.parser import text_string_to_metric_families

from spectrace.dashboards import alerts, build, panel_queries
from spectrace.dashboards.export import to_yaml
from spectrace.testing import wait_until
from spectrace.testing.engine import base_env
from spectrace.testing.prometheus import PrometheusServer, free_port

pytestmark = [pytest.mark.vllm, pytest.mark.server]

COLLAPSE = "SpectraceAcceptanceCollapse"


def _scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return {f.name: f for f in text_string_to_metric_families(response.read().decode())}


def _complete(port, model, max_tokens=24):
    body = json.dumps({"model": model, "prompt": "the quick brown fox", "max_tokens": max_tokens, "temperature": 0}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def test_serve_exposes_every_process_on_the_api_port(zoo, scratch, cache_root):
    port = free_port()
    env = base_env(scratch / "metrics-store", multiprocessing=True, cache_root=cache_root)
    env["SPECTRACE_FLUSH_INTERVAL"] = "0.5"
    log = open(scratch / "metrics-serve.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "spectrace.testing.serve", zoo["target"], "--api-server-count", "2",
         "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
         "--max-model-len", "512", "--kv-cache-memory-bytes", str(64 << 20),
         "--speculative-config", json.dumps({"method": "draft_model", "model": zoo["draft_seeded"], "num_speculative_tokens": 3})],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    rules = scratch / "metrics-rules.yaml"
    rules.write_text(to_yaml(alerts.prometheus_rules("test")))
    stop = threading.Event()
    try:
        def up():
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                return True
            except OSError:
                assert server.poll() is None, (scratch / "metrics-serve.log").read_text()[-3000:]
                return False

        wait_until(up, 400, "vllm serve")
        with PrometheusServer(scratch / "prom-metrics", targets=[f"127.0.0.1:{port}"], rule_files=[rules]) as prom:
            dropped = []  # requests the loaded server answered with no response (the traffic goes on past them)

            def load():
                while not stop.is_set():
                    try:
                        _complete(port, zoo["target"])
                    except (OSError, http.client.HTTPException) as exc:
                        # seen once in a loaded full suite: "Remote end closed connection without response"; the
                        # thread died with it, the worker's counters stopped, and the speed-up panel (the estimate
                        # while the worker verifies: its rate over 16 s) stayed empty for the whole wait
                        dropped.append(f"{type(exc).__name__}: {exc}")
                        time.sleep(0.5)

            traffic = threading.Thread(target=load, daemon=True)
            traffic.start()

            def firing():
                return [a for g in prom.api("rules")["groups"] for r in g["rules"] if r.get("name") == COLLAPSE
                        for a in r.get("alerts", []) if a["state"] == "firing"]

            wait_until(firing, 240, "the collapse alert")

            def empty_panels():
                return [(d, t, q) for d, t, q in panel_queries(step="15s", scrape_interval="1s", time_range="10m")
                        if t not in build.MAY_BE_EMPTY and not prom.api("query", query=q)["result"]]

            # the alert reads the engine core's series; another process's (the worker's speed-up estimate) may reach
            # the page later on a loaded machine: its pipeline process's first flush with records can spend 10 s and
            # more in the store's fsync (the exposition file is now rewritten before the store writes: sinks.SINKS)
            deadline = time.time() + 240
            while (empty := empty_panels()) and time.time() < deadline:
                time.sleep(1.0)
            assert not empty and traffic.is_alive(), (empty, dropped, _what_the_page_had(scratch, server.pid, prom))
            print(f"metrics endpoint live: {len(dropped)} requests dropped by the server under load: {dropped[:3]}")
            stop.set()
            traffic.join(timeout=120)

        time.sleep(2.0)  # > 2 flush intervals: every process has written its last counts
        families = _scrape(port)
        vllm_per_pos = {s.labels["position"]: s.value for s in families["vllm:spec_decode_num_accepted_tokens_per_pos"].samples
                        if s.name.endswith("_total")}
        vllm_labels = {(s.labels["model_name"], s.labels["engine"]) for s in families["vllm:spec_decode_num_accepted_tokens_per_pos"].samples}
        accepted, drafted, pids, joins = defaultdict(float), 0.0, set(), set()
        for s in families["spectrace_verify_accepted_tokens"].samples:
            accepted[s.labels["position"]] += s.value
            joins.add((s.labels["model_name"], s.labels["engine"]))
        for s in families["spectrace_verify_drafted_tokens"].samples:
            drafted += s.value
        for family in families.values():
            if family.name.startswith("spectrace"):
                pids |= {s.labels["pid"] for s in family.samples if "pid" in s.labels}
        assert drafted > 0 and vllm_per_pos and dict(accepted) == vllm_per_pos
        assert joins == vllm_labels  # same model_name and engine as vLLM's own series
        # main process, two API servers, engine core, worker: all on the one port
        assert len(pids) >= 4, pids
        # vLLM's own series are vLLM's: nothing of spectrace's under a vllm: name
        assert not [n for n in families if n.startswith("vllm:") and any("pid" in s.labels for s in families[n].samples)]

        # the engine core killed: vLLM takes the server down; nothing of it may stay on a /metrics of this host
        engine = subprocess.run(["pgrep", "-f", "-s", str(server.pid), "VLLM::EngineCore"], capture_output=True, text=True).stdout.split()
        assert engine
        metrics_dir = {p.split(".")[0] for p in os.listdir(_metrics_dir(server.pid))}
        assert engine[0] in metrics_dir
        os.kill(int(engine[0]), signal.SIGKILL)
        server.wait(timeout=120)
    finally:
        stop.set()
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
        log.close()
    assert not [p for p in os.listdir("/tmp") if p.startswith(f"spectrace-metrics-{server.pid}-")]


def _what_the_page_had(scratch, server_pid, prom):
    """On a failure: each process's exposition file (its process, age, spectrace families), Prometheus's last scrapes
    of the port, and spectrace's warnings from the server's log: a file missing or stale (its pipeline process stuck
    or gone), a file without the series, or scrapes that failed (an instant query of a gauge is empty after one)."""
    files = []
    try:
        directory = _metrics_dir(server_pid)
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            try:
                with open(f"/proc/{name.split('.')[0]}/comm") as comm:
                    process = comm.read().strip()
            except OSError:
                process = "gone"
            with open(path) as text:
                families = sorted({line.split()[2] for line in text if line.startswith("# TYPE spectrace")})
            files.append((name, process, f"{time.time() - os.stat(path).st_mtime:.1f} s old", families))
    except (OSError, ValueError) as exc:
        files.append(repr(exc))
    scrapes = {q: [r["value"][1] for r in prom.api("query", query=q)["result"]]
               for q in ("up", "scrape_duration_seconds", "count_over_time(up[1m]) - sum_over_time(up[1m])")}
    log = (scratch / "metrics-serve.log").read_text(errors="replace").splitlines()
    warnings = [line for line in log if "spectrace" in line and ("WARNING" in line or "ERROR" in line)][-20:]
    return {"files": files, "scrapes": scrapes, "spectrace warnings": warnings}


def _metrics_dir(pid):
    import tempfile

    [name] = [p for p in os.listdir(tempfile.gettempdir()) if p.startswith(f"spectrace-metrics-{pid}-")]
    return os.path.join(tempfile.gettempdir(), name)
