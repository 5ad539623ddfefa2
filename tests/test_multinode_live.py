"""One engine over two "nodes" on 127.0.0.1: TP=2 over vLLM's MP backend with ``--nnodes 2``, node 0
``vllm serve`` (API server, rank 0), node 1 headless (``--headless``: vLLM's ``run_headless``, rank 1).
Each node has its own environment, ``SPECTRACE_HOST``, store and temporary folder, as two hosts would;
both write one lake on a real PostgreSQL. Real vLLM on CPU (``VLLM_CPU_OMP_THREADS_BIND`` gives each
node one core).

- ``healthy``: both nodes serve the same drafter: both ranks under one run id (rank 0's, agreed through
  the rendezvous store), each rank's rows in its own node's store and in the lake, no
  ``RANK_DISAGREEMENT``; node 1's series on node 1's own endpoint; greedy tokens equal the untraced
  one-host engine's.
- ``split``: a second, short run where the nodes get EAGLE-3 drafters that resolve differently (one
  declares its tapped layers, the other takes vLLM's defaults): ``RANK_DISAGREEMENT`` in the lake.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import spectrace.store
from spectrace import lake as lake_connection
from spectrace.cli import main
from spectrace.lake import read as lake
from spectrace.audit import store_judge
from spectrace.testing import wait_until
from spectrace.testing.engine import DEFAULT_PROMPTS, K, base_env
from spectrace.testing.postgres import PostgresServer
from spectrace.testing.prometheus import free_port
from spectrace.testing.serve import Server

pytestmark = [pytest.mark.vllm, pytest.mark.server]  # PostgreSQL

MAX_TOKENS = 24  # as the untraced engine (spectrace.testing.engine.EngineSpec)


class TwoNodes:
    """Node 0 (API server) and node 1 (headless) of one TP=2 engine, started together."""

    def __init__(self, name, zoo, scratch, cache_root, catalog, speculative: list[dict], target: str | None = None):
        self.name, self.scratch = name, scratch
        self.target = target or zoo["target"]
        self.port, master, self.node1_metrics = free_port(), free_port(), free_port()
        self.stores = [scratch / f"{name}-node{i}-store" for i in (0, 1)]
        self.nodes = []
        for rank in (0, 1):
            tmp = scratch / f"{name}-node{rank}-tmp"
            tmp.mkdir(exist_ok=True)
            env = base_env(self.stores[rank], multiprocessing=True, cache_root=cache_root)
            env.update(
                SPECTRACE_HOST=f"node-{rank}", SPECTRACE_EXPORTER="duckdb,lake,prometheus", SPECTRACE_LAKE=catalog,
                SPECTRACE_LAKE_DATA=str(scratch / "nodes-lake-data"), SPECTRACE_FLUSH_INTERVAL="0.5",
                SPECTRACE_PROMETHEUS_PORT=str(self.node1_metrics), SPECTRACE_PROMETHEUS_HOST="127.0.0.1",
                VLLM_CPU_OMP_THREADS_BIND=str(rank), TMPDIR=str(tmp),
            )
            args = ["--tensor-parallel-size", "2", "--distributed-executor-backend", "mp", "--nnodes", "2",
                    "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(master),
                    "--dtype", "float32", "--enforce-eager", "--max-model-len", "512", "--seed", "0",
                    "--kv-cache-memory-bytes", str(64 << 20), "--generation-config", "vllm",
                    "--speculative-config", json.dumps(speculative[rank])]
            if rank == 1:
                args.append("--headless")
            self.nodes.append(Server(self.target, args, env, scratch / f"{name}-node{rank}.log", self.port))

    def __enter__(self) -> "TwoNodes":
        self.started = time.time()
        self.nodes[1].launch()
        self.nodes[0].start(timeout=600)
        self.up_s = time.time() - self.started
        return self

    def __exit__(self, *exc) -> None:
        import os
        import signal

        import subprocess

        for node in self.nodes:  # both at once: neither waits for the other's collectives
            if node.process is not None and node.process.poll() is None:
                os.killpg(node.process.pid, signal.SIGINT)
        for node in self.nodes:
            try:
                node.process.wait(timeout=60)
            except (subprocess.TimeoutExpired, AttributeError):
                pass
            node.stop()  # SIGKILL for what is left (and the session's orphans)

    def complete(self, prompt: str) -> list[int]:
        body = json.dumps({"model": self.target, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                           "return_token_ids": True}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            return list(json.loads(response.read())["choices"][0]["token_ids"])

    def node1_series(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.node1_metrics}/metrics", timeout=10) as response:
            return {f.name: f for f in text_string_to_metric_families(response.read().decode())}

    def vllm_counter(self, name: str) -> float:
        families = {f.name: f for f in text_string_to_metric_families(self.nodes[0].metrics())}
        return sum(s.value for s in families[name].samples if s.name.endswith("_total"))


def _lake_rows(catalog: str, sql: str, params=()) -> list[tuple]:
    con = lake.open(catalog)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


@pytest.fixture(scope="module")
def catalog(postgres_binaries, scratch):
    with PostgresServer() as server:
        # created once before the nodes' processes write (they would otherwise race to create it)
        lake_connection.connect(server.catalog, data_path=str(scratch / "nodes-lake-data")).close()
        yield server.catalog


@pytest.fixture(scope="module")
def healthy(zoo, scratch, cache_root, catalog):
    draft = {"method": "draft_model", "model": zoo["draft_self"], "num_speculative_tokens": K}
    seen = {}
    with TwoNodes("nodes", zoo, scratch, cache_root, catalog, [draft, draft]) as nodes:
        seen["up_s"] = nodes.up_s
        seen["tokens"] = [nodes.complete(p) for p in DEFAULT_PROMPTS]
        drafted = wait_until(lambda: nodes.vllm_counter("vllm:spec_decode_num_draft_tokens") or None, 30,
                             "vLLM's drafted-token counter")
        seen["vllm"] = (drafted, nodes.vllm_counter("vllm:spec_decode_num_accepted_tokens"))

        def node1_counted():  # node 1's worker has flushed what it verified (its exposition file, its endpoint)
            family = nodes.node1_series().get("spectrace_worker_verified_drafted_tokens")
            samples = [s for s in family.samples if s.name.endswith("_total")] if family else []
            return samples if samples and sum(s.value for s in samples) == drafted else None

        seen["node1_series"] = wait_until(node1_counted, 60, "node 1's series on node 1's endpoint")

        def both_ranks_in_lake():
            rows = _lake_rows(catalog, "select run_id, host, rank, sum(drafted), sum(accepted) from verify_counts "
                                       "where source = 'worker' group by all order by rank")
            return rows if len(rows) == 2 and all(r[3] == drafted for r in rows) else None

        seen["lake_counts"] = wait_until(both_ranks_in_lake, 60, "both ranks' counts in the lake")
    seen["logs"] = [node.log() for node in nodes.nodes]  # after shutdown
    seen["node1_metrics"] = nodes.node1_metrics
    seen["seconds"] = round(time.time() - nodes.started, 1)
    seen["stores"] = nodes.stores
    return seen


def test_both_ranks_one_run_across_nodes(healthy, catalog, untraced_methods, capsys):
    assert healthy["tokens"] == untraced_methods["self"].tokens  # tracing on two nodes changed nothing
    drafted, accepted = healthy["vllm"]
    [(run_id, *_), _] = healthy["lake_counts"]
    assert healthy["lake_counts"] == [(run_id, "node-0", 0, drafted, accepted), (run_id, "node-1", 1, drafted, accepted)]
    # every rank's rows carry host and rank, one run id, in the lake ...
    layout = _lake_rows(catalog, "select distinct run_id, host, rank from attention_layout where host in "
                                 "('node-0', 'node-1') and run_id = ? order by rank", [run_id])
    assert layout == [(run_id, "node-0", 0), (run_id, "node-1", 1)]
    runs_with_node_0 = _lake_rows(catalog, "select distinct run_id from attention_layout where host = 'node-0'")
    assert runs_with_node_0 == [(run_id,)]  # rank 0 wrote under one run, the one rank 1 joined
    # ... and each rank's in its own node's store
    for rank, store in enumerate(healthy["stores"]):
        con = spectrace.store.open(store)
        assert con.execute("select distinct run_id, host, rank from attention_layout").fetchall() == [
            (run_id, f"node-{rank}", rank)]
    assert "joins run " + run_id in healthy["logs"][1]  # node 1's worker adopted rank 0's run (one line)
    # RANK_DISAGREEMENT is judged where the ranks meet: none for the healthy engine
    assert store_judge.rank_verdicts(lake.open(catalog), run_id)[:2] == ([0, 1], [])
    capsys.readouterr()
    assert main(["report", "--lake", catalog, "--run", run_id]) == 0
    assert "Ranks: 2 (0 on node-0, 1 on node-1) agree on layout, taps and verified counts" in capsys.readouterr().out
    print(f"\ntwo nodes: up in {healthy['up_s']:.0f} s, {healthy['seconds']} s in all")


def test_headless_nodes_series_are_scraped_from_that_node(healthy):
    drafted, _ = healthy["vllm"]
    [sample] = healthy["node1_series"]  # only node 1's worker verified there: rank 1, rank 0's run
    run_id = healthy["lake_counts"][0][0]
    assert (sample.labels["rank"], sample.labels.get("run_id"), sample.value) == ("1", run_id, drafted)
    # the node's own log says where its series are (the launcher's line, before vLLM resolves the model)
    where = f"spectrace: Prometheus metrics of this headless node on http://127.0.0.1:{healthy['node1_metrics']}/metrics"
    assert healthy["logs"][1].count(where) == 1 and where not in healthy["logs"][0]
    # no hook error at shutdown (the launcher removes the metrics folder before its workers' last write)
    assert "hook" not in " ".join(line for line in healthy["logs"][1].splitlines() if "raised" in line)


@pytest.fixture(scope="module")
def split(zoo, scratch, cache_root, catalog):
    """A second, short run: node 0's EAGLE-3 drafter declares its tapped layers, node 1's takes vLLM's defaults."""
    drafters = [{"method": "eagle3", "model": zoo[name], "num_speculative_tokens": K} for name in ("eagle3", "eagle3_noids")]
    with TwoNodes("split", zoo, scratch, cache_root, catalog, drafters) as nodes:
        nodes.complete(DEFAULT_PROMPTS[0])

        [(run_id,)] = wait_until(lambda: spectrace.store.open(nodes.stores[0]).execute(
            "select distinct run_id from attention_layout").fetchall(), 30, "node 0's layout rows")

        def both_ranks_tapped():
            rows = _lake_rows(catalog, "select run_id, host, rank, tapped_ids from hidden_state_taps "
                                       "where run_id = ? order by rank", [run_id])
            return rows if len(rows) == 2 else None

        seen = {"taps": wait_until(both_ranks_tapped, 60, "both ranks' taps in the lake")}
    seen["seconds"] = round(time.time() - nodes.started, 1)
    return seen


def test_drafters_that_resolve_differently_across_nodes_disagree_in_the_lake(split, catalog, capsys):
    (run_id, host0, rank0, taps0), (run_id1, host1, rank1, taps1) = split["taps"]
    assert (run_id1, host0, rank0, host1, rank1) == (run_id, "node-0", 0, "node-1", 1) and taps0 != taps1
    seen, findings, _ = store_judge.rank_verdicts(lake.open(catalog), run_id)
    assert seen == [0, 1]
    [finding] = [f for f in findings if f.evidence["aspect"] == "taps"]
    assert finding.code == "RANK_DISAGREEMENT" and finding.evidence["hosts"] == {"0": "node-0", "1": "node-1"}
    assert finding.evidence["values"] == {"0": json.loads(taps0), "1": json.loads(taps1)}
    capsys.readouterr()
    assert main(["report", "--lake", catalog, "--run", run_id]) == 0
    assert "RANK_DISAGREEMENT rank(s) [1] differ from rank 0 in hidden-state taps" in capsys.readouterr().out
    print(f"\nsplit drafters: {split['seconds']} s")
