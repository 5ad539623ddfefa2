"""Data parallelism on one host: ``vllm serve --data-parallel-size 2`` (CPU build, a dense target, so
vLLM runs two independent DP=1 engines that keep their index) records two engines as two runs, each
with its engine core's and worker's counts, equal to each other. Real vLLM on CPU."""

from __future__ import annotations

import json

import pytest

import spectrace.store
from spectrace.testing import wait_until
from spectrace.testing.engine import DEFAULT_PROMPTS, K, base_env
from spectrace.testing.prometheus import free_port
from spectrace.testing.serve import Server

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def dp2(zoo, scratch, cache_root):
    store = scratch / "dp2-store"
    env = base_env(store, multiprocessing=True, cache_root=cache_root)
    env.update(SPECTRACE_FLUSH_INTERVAL="0.5", VLLM_CPU_OMP_THREADS_BIND="0|1")
    args = ["--data-parallel-size", "2", "--dtype", "float32", "--enforce-eager", "--max-model-len", "512",
            "--kv-cache-memory-bytes", str(64 << 20), "--generation-config", "vllm", "--speculative-config",
            json.dumps({"method": "draft_model", "model": zoo["draft_self"], "num_speculative_tokens": K})]
    server = Server(zoo["target"], args, env, scratch / "dp2.log", free_port())
    try:
        server.start(timeout=600)
        for prompt in DEFAULT_PROMPTS:
            server.complete(prompt)

        def both_engines_counted():
            # each process flushes on its own clock: wait until every core's and worker's last steps are in (the
            # first moment all four rows exist can hold a core's flush without its worker's latest one)
            rows = spectrace.store.open(store).execute(
                "select run_id, source, sum(drafted) from verify_counts group by all order by all").fetchall()
            if len({r[0] for r in rows}) != 2 or len(rows) != 4:
                return None
            sums = {}
            for run_id, _, drafted in rows:
                sums.setdefault(run_id, set()).add(drafted)
            return rows if all(len(s) == 1 for s in sums.values()) else None

        counts = wait_until(both_engines_counted, 60, "both engines' counts, core and worker alike")
    finally:
        server.stop()
    return spectrace.store.open(store), counts


def test_two_dp_engines_are_two_runs(dp2):
    con, counts = dp2
    base, dp1 = sorted({r[0] for r in counts})
    assert dp1 == f"{base}.dp1"
    for run_id in (base, dp1):  # each engine's core and worker counted the same verified drafts
        [engine] = [d for r, s, d in counts if r == run_id and s == "engine_core"]
        [worker] = [d for r, s, d in counts if r == run_id and s == "worker"]
        assert engine == worker > 0
    layout = con.execute("select run_id, rank, count(*) from attention_layout group by all order by all").fetchall()
    assert [(r, rank) for r, rank, _ in layout] == [(base, 0), (dp1, 0)]  # one rank 0 per engine, never mixed
    runs = dict(con.execute("select run_id, process_role from runs where run_id in (?, ?)", [base, dp1]).fetchall())
    assert runs == {base: "frontend", dp1: "engine_core"}  # the DP engine's run has its runs row
