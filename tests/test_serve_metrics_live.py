"""vLLM's own /metrics with spectrace off and on, a server restarted on a killed server's metrics
directory, an engine core killed under an API server that stays up, and faults injected into the API
server's hooks: real `vllm serve` (CPU build), a seeded drafter, the same greedy requests.

Three servers in all (each start is the cost here):
- faulted: ``--api-server-count 2`` (prometheus_client's multiprocess mode) with both api_server hooks
  made to raise (``SPECTRACE_INJECT_FAULT`` takes a list), then SIGKILLed: its exposition files stay in
  the metrics directory, as a crashed server leaves them;
- baseline: one API server, spectrace off;
- traced: one API server, spectrace on, started on the faulted server's metrics directory (a restart),
  ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1`` (the baseline has it too): its engine core is SIGKILLed at the end
  and the API server stays up.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

import spectrace.store
from spectrace.sinks import exposition
from spectrace.testing import wait_until
from spectrace.testing.engine import base_env
from spectrace.testing.prometheus import free_port
from spectrace.testing.serve import Server

pytestmark = pytest.mark.vllm

PROMPTS = ["the quick brown fox", "once upon a time there", "in a hole in the ground", "it was a bright cold day"]
FAULTS = ["api_server.metrics_registry", "api_server.multiprocess_registry"]
# vLLM's counters that the same greedy requests make equal (speculative decoding first)
COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens",
            "vllm:spec_decode_num_accepted_tokens_per_pos", "vllm:prompt_tokens", "vllm:generation_tokens",
            "vllm:request_success")


def _families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def _vllm_shape(families):
    """Every family that is not spectrace's: name -> its label sets (values left out)."""
    return {name: sorted({tuple(sorted(s.labels.items())) for s in f.samples}) for name, f in families.items()
            if not name.startswith("spectrace")}


def _counters(families):
    return {(name, tuple(sorted(s.labels.items()))): s.value for name in COUNTERS if name in families
            for s in families[name].samples if s.name.endswith("_total")}


def _spectrace_pids(families):
    return {s.labels["pid"] for name, f in families.items() if name.startswith("spectrace") for s in f.samples if "pid" in s.labels}


def _file_pids(directory):
    return {p.split(".")[0] for p in os.listdir(directory) if p.endswith(exposition.SUFFIX)}


def _args(zoo, api_servers):
    return ["--api-server-count", str(api_servers), "--dtype", "float32", "--enforce-eager", "--max-model-len", "512",
            "--kv-cache-memory-bytes", str(64 << 20), "--speculative-config",
            json.dumps({"method": "draft_model", "model": zoo["draft_seeded"], "num_speculative_tokens": 3})]


def _requests_and_settled_scrape(server):
    """The prompts one after another (greedy), then /metrics once vLLM's counters stopped moving."""
    texts = [server.complete(p)["choices"][0]["text"] for p in PROMPTS]

    def settled():
        first = _families(server.metrics())
        time.sleep(1.0)
        second = _families(server.metrics())
        done = sum(v for (n, _), v in _counters(second).items() if n == "vllm:request_success") == len(PROMPTS)
        return second if done and _counters(first) == _counters(second) else None

    return texts, wait_until(settled, 60, "vLLM's counters to settle")


@pytest.fixture(scope="module")
def metrics_dir(scratch):
    path = scratch / "serve-metrics-dir"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="module")
def faulted(zoo, scratch, cache_root, metrics_dir):
    store = scratch / "serve-fault-store"
    env = base_env(store, multiprocessing=True, cache_root=cache_root)
    env.update(SPECTRACE_FLUSH_INTERVAL="0.5", SPECTRACE_METRICS_DIR=str(metrics_dir), SPECTRACE_INJECT_FAULT=",".join(FAULTS))
    server = Server(zoo["target"], _args(zoo, 2), env, scratch / "serve-fault.log", free_port())
    try:
        server.start()
        seen = {"texts": [server.complete(p)["choices"][0]["text"] for p in PROMPTS[:2]]}
        seen["scrapes"] = [_families(server.metrics()) for _ in range(3)]  # each scrape builds a MultiProcessCollector
        con = lambda: spectrace.store.open(store)  # noqa: E731  (read-only, while the server writes)

        def counted():
            rows = con().execute("select hook, sum(count), count(distinct pid) from internal_errors group by hook").fetchall()
            return {hook: (int(n), pids) for hook, n, pids in rows}

        # each API server flushes on its own clock: read until both have flushed what they counted by now
        # (both raised metrics_registry at start; the three scrapes built three collectors), or 60 s have
        # passed; the test asserts on what was read last
        deadline = time.time() + 60
        while True:
            seen["errors"] = counted()
            got = seen["errors"]
            if (set(got) >= set(FAULTS) and got["api_server.metrics_registry"][1] >= 2
                    and got["api_server.multiprocess_registry"][0] >= 3) or time.time() > deadline:
                break
            time.sleep(0.5)
        wait_until(lambda: _file_pids(metrics_dir), 30, "exposition files")
        seen["pids"] = {str(p) for p in server.pids()}
        seen["log"] = server.log()
    finally:
        server.kill(pipelines=True)  # SIGKILL, the pipeline processes too: no process removes its file (a crash)
        server.stop()
    seen["left"] = _file_pids(metrics_dir)
    return seen


@pytest.fixture(scope="module")
def baseline(zoo, scratch, cache_root):
    env = base_env(None, traced=False, multiprocessing=True, cache_root=cache_root)
    env["VLLM_KEEP_ALIVE_ON_ENGINE_DEATH"] = "1"
    server = Server(zoo["target"], _args(zoo, 1), env, scratch / "serve-off.log", free_port())
    try:
        server.start()
        server.metrics()  # the traced server is scraped once before its requests too
        texts, families = _requests_and_settled_scrape(server)
        statuses = [_status(server, body) for body in HOSTILE_REQUESTS]  # after the scrape the series tests compare
    finally:
        server.stop()
    return texts, families, statuses


def _top_on_the_api_port(server):
    """`spectrace top` on the server's API port: a frame and the one page it was computed from, once
    spectrace's counts there have caught up with vLLM's (the flush lags vLLM's counters by an interval);
    and `spectrace top URL --once` as printed."""
    import contextlib
    import io

    from spectrace import top
    from spectrace.cli import main

    url = f"http://127.0.0.1:{server.port}"

    def caught_up():
        source = top.MetricsSource([url], window_s=60)  # a fresh one: one scrape, lifetime counts
        frame = source.frame()
        page = _families(source.texts[0])
        tokens = sum(s.value for s in page["vllm:spec_decode_num_draft_tokens"].samples if s.name.endswith("_total"))
        # spectrace's own series (a frame falls back to vLLM's counters, whose sum is the same, before they are
        # there: the engine core's pipeline process writes its first file late on a loaded machine)
        mine = not frame.vllm_source and sum(p.drafted for p in frame.positions) == tokens
        return (frame, source.texts[0]) if tokens and mine else None

    frame, text = wait_until(caught_up, 60, "spectrace's counts on the API port to reach vLLM's")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["top", url, "--once"])
    return {"frame": frame, "text": text, "once": out.getvalue(), "code": code}


@pytest.fixture(scope="module")
def traced(zoo, scratch, cache_root, metrics_dir, faulted):
    env = base_env(scratch / "serve-on-store", multiprocessing=True, cache_root=cache_root)
    env.update(SPECTRACE_FLUSH_INTERVAL="0.5", SPECTRACE_METRICS_DIR=str(metrics_dir), VLLM_KEEP_ALIVE_ON_ENGINE_DEATH="1")
    server = Server(zoo["target"], _args(zoo, 1), env, scratch / "serve-on.log", free_port())
    seen = {}
    try:
        server.start()
        # the restart: the first scrape, before any request
        seen["first"] = _families(server.metrics())
        seen["first_files"] = _file_pids(metrics_dir)
        seen["first_live"] = {str(p) for p in server.pids()}
        seen["texts"], seen["families"] = _requests_and_settled_scrape(server)
        seen["top"] = _top_on_the_api_port(server)

        # the engine core SIGKILLed; VLLM_KEEP_ALIVE_ON_ENGINE_DEATH keeps the API server up
        [engine] = [p for p in server.pids() if b"EngineCore" in open(f"/proc/{p}/cmdline", "rb").read()]
        seen["engine"] = str(engine)
        wait_until(lambda: seen["engine"] in _file_pids(metrics_dir), 30, "the engine core's exposition file")
        seen["before_kill"] = _spectrace_pids(_families(server.metrics()))
        os.kill(engine, signal.SIGKILL)
        wait_until(lambda: not exposition._alive(engine, None), 30, "the engine core to die")
        seen["after_kill"] = _families(server.metrics())
        seen["after_kill_files"] = _file_pids(metrics_dir)
        seen["after_kill_live"] = {str(p) for p in server.pids()}
        time.sleep(7.0)  # longer than the API server's 5 s engine watchdog (launcher.watchdog_loop)
        seen["still_up"] = server.process.poll() is None
        seen["later"] = _families(server.metrics()) if seen["still_up"] else {}
    finally:
        server.stop()
    return seen


def test_faults_in_the_api_server_hooks_leave_vllm_serving_and_are_counted(faulted):
    assert all(faulted["texts"])  # the server answered
    for families in faulted["scrapes"]:
        assert "vllm:spec_decode_num_drafts" in families and "vllm:request_success" in families
        assert not [n for n in families if n.startswith("spectrace")]  # the hooks' work (the collector) skipped
    # each hook's faults counted in the API server processes only (two of them), nothing else raised
    assert set(faulted["errors"]) == set(FAULTS), faulted["errors"]
    assert faulted["errors"]["api_server.metrics_registry"][1] == 2
    assert faulted["errors"]["api_server.multiprocess_registry"][0] >= 3
    for hook in FAULTS:
        assert f"hook {hook} raised InjectedFault" in faulted["log"]


def test_a_server_restarted_on_a_killed_servers_directory_never_shows_the_dead_pids(faulted, traced):
    dead = faulted["left"] & faulted["pids"]
    assert len(dead) >= 4, faulted  # main process, two API servers, engine core (and worker): files left by SIGKILL
    dead -= traced["first_live"]  # (a pid reused by the new server is the new server's)
    assert not dead & _spectrace_pids(traced["first"])  # the very first scrape after the restart
    assert not dead & traced["first_files"]  # ... removed their files
    assert not dead & _spectrace_pids(traced["families"])
    assert _spectrace_pids(traced["families"]) <= traced["first_live"] | {traced["engine"]}


def test_vllm_series_are_the_same_with_spectrace_on(baseline, traced):
    texts, families, _ = baseline
    assert traced["texts"] == texts  # same tokens
    assert _vllm_shape(traced["families"]) == _vllm_shape(families)  # same names, same label sets
    counters = _counters(families)
    assert sum(v for (name, _), v in counters.items() if name == "vllm:spec_decode_num_draft_tokens") > 0
    assert _counters(traced["families"]) == counters  # same values
    assert [n for n in traced["families"] if n.startswith("spectrace")]  # and spectrace's series are there too


def test_top_on_the_api_port_shows_vllms_own_counts(traced):
    """`spectrace top`'s numbers on a real `vllm serve` scrape: per position, the accepted tokens are
    vLLM's own per-position counter on the same page, vLLM's rate is that counter over vLLM's drafts, the
    drafted tokens sum to vLLM's draft tokens; the mean length is vLLM's (1 + accepted / drafts)."""
    frame, page = traced["top"]["frame"], _families(traced["top"]["text"])

    def vllm(name):
        return {s.labels.get("position"): s.value for s in page[name].samples if s.name.endswith("_total")}

    per_pos, drafts = vllm("vllm:spec_decode_num_accepted_tokens_per_pos"), vllm("vllm:spec_decode_num_drafts")[None]
    assert drafts > 0 and len(per_pos) == 3
    assert [(p.position, p.accepted) for p in frame.positions] == [(int(k), v) for k, v in sorted(per_pos.items())]
    assert [p.vllm_rate for p in frame.positions] == [v / drafts for _, v in sorted(per_pos.items())]
    assert sum(p.drafted for p in frame.positions) == vllm("vllm:spec_decode_num_draft_tokens")[None]
    assert frame.mean_length == pytest.approx(1 + vllm("vllm:spec_decode_num_accepted_tokens")[None] / drafts)
    assert sum(frame.lengths.values()) == drafts  # one request-step per draft
    assert not frame.vllm_source and frame.scope == "lifetime (one scrape)"
    once = traced["top"]["once"]
    assert traced["top"]["code"] == 0 and once.startswith("spectrace top  http://127.0.0.1:")
    row0 = [line.split() for line in once.splitlines() if line.strip().startswith("0 ")][0]
    assert row0[2] == f"{per_pos['0']:,.0f}" and f"{per_pos['0'] / drafts:.1%}" in row0[3:]


def test_engine_core_killed_under_a_live_api_server_leaves_no_series_of_it(traced):
    engine = traced["engine"]
    assert engine in traced["before_kill"]
    after = traced["after_kill"]
    assert "vllm:request_success" in after  # the API server still serves vLLM's /metrics
    assert engine not in _spectrace_pids(after)  # the first scrape after the kill
    assert _spectrace_pids(after) <= traced["after_kill_live"]  # only live processes contribute
    assert engine not in traced["after_kill_files"]
    assert traced["still_up"]  # VLLM_KEEP_ALIVE_ON_ENGINE_DEATH: the API server outlives its engine
    assert engine not in _spectrace_pids(traced["later"]) and "vllm:request_success" in traced["later"]


# -- a careless operator and a hostile local user (issue #23) ------------------------------

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
# every setting at once, each out of its range: each is refused with one line and its default used
INVALID = {
    "SPECTRACE_RETENTION": "-5d", "SPECTRACE_MAX_MB": "-1", "SPECTRACE_FLUSH_INTERVAL": "nan",
    "SPECTRACE_STEP_SAMPLE": "2", "SPECTRACE_COLLAPSE_THRESHOLD": "2", "SPECTRACE_MAX_BUFFER_ROWS": "0",
    "SPECTRACE_SPAN_EVERY": "-5", "SPECTRACE_COMPACT_INTERVAL": "-60", "SPECTRACE_PROMETHEUS_PORT": "99999",
    "SPECTRACE_RUN_ID": "../escape", "SPECTRACE_HOST": "a/b", "SPECTRACE_COLLAPSE_WINDOW": "0",
    "SPECTRACE_EXPORTER": "duckdb,prometheus,lake,otlp,bogus",
}
PASSWORD = "hunter2-live;Kx&9,z"  # the separators that once ended the redaction (;, & and ,)
TOKEN = "otlp-bearer-live-7f3e9a"  # in OTEL_EXPORTER_OTLP_HEADERS, as a collector's credential
# sampling numbers at and past their ranges: each answered as vLLM answers it (200 or 400), never a 500 or a hook error
HOSTILE_REQUESTS = [
    {"temperature": 1e308}, {"temperature": -1}, {"top_p": 1e-308}, {"top_k": 2**62}, {"max_tokens": 2**63},
    {"max_tokens": 0}, {"seed": 2**64}, {"seed": -(2**63)}, {"repetition_penalty": 1e308}, {"presence_penalty": -1e308},
    {"logprobs": 10**9}, {"n": 10**6}, {"min_tokens": 10**9}, {"logit_bias": {"1": 1e308}},
    {"stop": ["x"] * 10_000}, {"prompt": [0] * 100_000},
]


def _cli(*argv):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "spectrace.cli", *argv], capture_output=True, text=True, timeout=120)


def _dead_pid() -> int:
    import subprocess

    return int(subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True).stdout)


def _status(server, body) -> int:
    import urllib.error
    import urllib.request

    data = json.dumps({"model": server.model, "prompt": "the quick brown fox", "max_tokens": 4, **body}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/completions", data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _nobody(*argv):
    import subprocess

    return subprocess.run([*NOBODY, *argv], capture_output=True, text=True, timeout=30)


@pytest.fixture(scope="module")
def hostile(zoo, scratch, cache_root):
    """One `vllm serve` with every setting invalid, a lake whose catalog holds a password and is unreachable,
    a store holding an earlier run, and a metrics directory that the user `nobody` made and planted files in."""
    import shutil
    import stat
    import tempfile
    from pathlib import Path

    from spectrace.testing import store_pipeline

    # a folder every user can pass through (pytest's own are 0700): what keeps nobody out is the store's own modes
    base = Path(tempfile.mkdtemp(prefix="spectrace-hostile-", dir="/tmp"))
    os.chmod(base, 0o711)
    store = base / "store"
    earlier = store_pipeline(store, retention_s=0, compact_interval_s=0)
    day_ago = time.time_ns() - 86400 * 10**9
    earlier.append("runs", {"run_id": "earlier", "method": "mtp", "started_at": day_ago})
    earlier.extend("verify_counts", [{"run_id": "earlier", "source": "engine_core", "position": p, "drafted": 10,
                                      "accepted": 5, "ts": day_ago} for p in range(3)])
    earlier.flush()
    old = time.time() - 86400
    before = {}
    for path in store.rglob("*.parquet"):
        os.utime(path, (old, old))  # finished a day ago: a negative retention or cap would remove it
        before[path] = path.read_bytes()
    secret = base / "secret.prom"
    secret.write_text(f"spectrace_secret_total {PASSWORD}\n")
    os.chmod(secret, 0o600)
    metrics = base / "metrics"  # the operator set SPECTRACE_METRICS_DIR to a folder nobody made, world-writable
    metrics.mkdir()
    os.chown(metrics, 65534, 65534)
    os.chmod(metrics, 0o777)
    start_of_1 = exposition._start_time(1)
    plants = {"1.prom": "vllm:planted_total 1\n", f"1.{start_of_1}.prom": "spectrace_planted_total 1\n"}
    for name, text in plants.items():
        assert _nobody("sh", "-c", f"printf '{text}' > {metrics / name}").returncode == 0, name
    assert _nobody("ln", "-s", str(secret), str(metrics / f"1.{start_of_1}9.prom")).returncode == 0
    assert _nobody("mkfifo", str(metrics / "1.1.prom")).returncode == 0

    env = base_env(store, multiprocessing=True, cache_root=cache_root)
    env.update(INVALID, SPECTRACE_METRICS_DIR=str(metrics),
               SPECTRACE_LAKE=f"postgresql://u:{PASSWORD}@127.0.0.1:1/spectrace",  # the URI form, as PostgreSQL users write it
               OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{free_port()}", OTEL_EXPORTER_OTLP_TIMEOUT="2",
               OTEL_EXPORTER_OTLP_HEADERS=f"authorization=Bearer {TOKEN},x-api-key={TOKEN}")
    server = Server(zoo["target"], _args(zoo, 1), env, scratch / "serve-hostile.log", free_port())
    seen = {}
    try:
        server.start()
        server.metrics()
        seen["texts"], seen["families"] = _requests_and_settled_scrape(server)
        # vLLM's counters can settle before the engine core's first flush (default interval: the setting is invalid)
        def with_spectrace():
            scrape = server.metrics()
            return scrape if "spectrace_verify_" in scrape else None

        seen["scrape"] = wait_until(with_spectrace, 30, "spectrace's series on the API port")
        con = spectrace.store.open(store)
        wait_until(lambda: con.execute("select count(*) from runs where run_id <> 'earlier'").fetchone()[0], 60,
                   "the traced run's rows")
        seen["runs"] = con.execute("select run_id, host from runs order by run_id").fetchall()
        seen["in_store"] = {str(p.relative_to(store)) for p in store.rglob("*")}
        # the user nobody, on the live store: cannot list it, read a segment or plant a file
        segment = next(store.glob("verify_counts/run=earlier/*.parquet"))
        seen["nobody"] = [_nobody("ls", str(store / "verify_counts")).returncode,
                          _nobody("cat", str(segment)).returncode,
                          _nobody("touch", str(store / "verify_counts" / "run=earlier" / "x.parquet")).returncode]
        seen["hostile_requests"] = [_status(server, body) for body in HOSTILE_REQUESTS]
        # a foreign-typed segment planted in the live run's folder, named as a dead writer of this host's
        [(run_id, host)] = [row for row in seen["runs"] if row[0] != "earlier"]
        seen["planted"] = store / "verify_counts" / f"run={run_id}" / f"{host}-{_dead_pid()}-{time.time_ns()}-000001.parquet"
        pq.write_table(pa.table({"run_id": [run_id], "source": ["engine_core"], "position": [0], "drafted": ["ten"],
                                 "accepted": ["five"]}), seen["planted"])
        os.chmod(seen["planted"], 0o600)
        seen["planted_bytes"] = seen["planted"].read_bytes()
        seen["after_plant"] = server.complete(PROMPTS[0])["choices"][0]["text"]  # the engine writes on beside it
        forged = store / "verify_counts" / f"run={run_id}" / f"{host}-1-1-000009.parquet"
        seen["locked"] = [  # as a dashboard would, on the live store: reads answer, a write into the run is one line
            _cli("query", "--locked", "--dir", str(store), "select sum(drafted) > 0 as counted from verify_counts"),
            _cli("query", "--locked", "--dir", str(store),
                 f"explain analyze copy (select '{run_id}' as run_id, 10**9 as drafted) to '{forged}'"),
        ]
        seen["forged"] = forged.exists()
        seen["alive"] = server.process.poll() is None and server.metrics() != ""
    finally:
        server.stop()
    seen["report"] = _cli("report", "--dir", str(store), "--run", run_id)
    seen["compact"] = _cli("store", "compact", "--dir", str(store))
    seen["planted_kept"] = seen["planted"].read_bytes() == seen["planted_bytes"]
    seen["log"] = server.log()
    seen["kept"] = {path: path.exists() and path.read_bytes() == data for path, data in before.items()}
    seen["modes"] = {stat.S_IMODE(p.stat().st_mode) for p in store.rglob("*") if p.is_file()}
    seen["dir_modes"] = {stat.S_IMODE(p.stat().st_mode) for p in store.rglob("*") if p.is_dir()}
    seen["secret"] = secret.read_text()
    seen["plants"] = {name: (metrics / name).read_text() for name in plants}
    shutil.rmtree(base, ignore_errors=True)
    return seen


def test_invalid_settings_and_hostile_files_leave_tokens_and_earlier_runs_alone(baseline, hostile):
    texts, _, statuses = baseline
    assert hostile["texts"] == texts  # the untraced tokens
    assert all(hostile["kept"].values()) and len(hostile["kept"]) >= 2  # the earlier run's files, byte for byte
    log = hostile["log"]
    for name, value in INVALID.items():  # each refused with its own line, in every process that read it
        assert f"spectrace: {name}={value!r}" in log, name
    assert "names unknown sink(s) bogus" in log
    # the run id and the host were refused: the run has a generated id and the hostname, and no path escaped
    [(run_id, host)] = [row for row in hostile["runs"] if row[0] != "earlier"]
    assert "/" not in run_id and ".." not in run_id and host != "a/b"
    assert not any(".." in p or "escape" in p for p in hostile["in_store"])
    # the store is private, and the user nobody can do nothing with it
    assert hostile["modes"] == {0o600} and hostile["dir_modes"] == {0o700}
    assert all(rc != 0 for rc in hostile["nobody"]), hostile["nobody"]
    # no secret anywhere: the unreachable lake's password (no tail past a separator either), the OTLP headers'
    # token, the 0600 file a planted link points to
    for secret in (PASSWORD, "Kx&9", "9,z", TOKEN):
        assert secret not in log and secret not in hostile["scrape"], secret
    assert "lake" in log.lower() and "***" in log  # the lake's errors were logged, redacted
    assert hostile["secret"] == f"spectrace_secret_total {PASSWORD}\n"


def test_hostile_numbers_a_planted_segment_and_locked_sql_on_a_live_server(baseline, hostile):
    texts, _, statuses = baseline
    assert hostile["hostile_requests"] == statuses, (statuses, hostile["hostile_requests"])  # as the untraced server
    assert 200 in statuses and 400 in statuses  # some taken, some refused by vLLM
    assert hostile["alive"] and hostile["after_plant"] == texts[0]
    assert "spectrace: hook" not in hostile["log"]  # no hook error, in any process
    # the planted segment: the engine wrote on, a locked read answered past it, the write was refused in one line
    read, write = hostile["locked"]
    assert read.returncode == 0 and "True" in read.stdout, read
    assert f"skipping {hostile['planted']}" in read.stderr
    assert write.returncode == 2 and write.stderr.count("\n") == 1 and "EXPLAIN COPY" in write.stderr, write
    assert not hostile["forged"]
    # after the server: the report answers and names it, compaction leaves it as it was
    report = hostile["report"]
    assert report.returncode == 0 and "Traceback" not in report.stderr, report
    assert report.stderr.count(f"skipping {hostile['planted']}: not a verify_counts segment") == 1
    assert hostile["compact"].returncode == 0 and "Traceback" not in hostile["compact"].stderr, hostile["compact"]
    assert hostile["planted_kept"]


def test_a_metrics_directory_of_another_user_is_refused_and_its_files_never_served(hostile):
    log = hostile["log"]
    assert "SPECTRACE_METRICS_DIR=" in log and "is owned by uid 65534, not this user (uid 0)" in log
    assert "group/world-writable: refused, using a private temporary directory" in log
    scrape = hostile["scrape"]
    assert "planted" not in scrape and "spectrace_secret" not in scrape
    assert "spectrace_verify_drafted_tokens_total" in scrape  # spectrace's own series, from its private directory
    assert "vllm:spec_decode_num_drafts" in scrape
    assert hostile["plants"] == {"1.prom": "vllm:planted_total 1\n", f"1.{exposition._start_time(1)}.prom": "spectrace_planted_total 1\n"}
