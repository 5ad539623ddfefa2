"""One run per engine across hosts: rank 0 publishes its run in the rendezvous store, the other ranks
adopt it (``spectrace.recorder.run_agreement``); a store that fails or stays silent leaves a rank on its
node's run, with one log line, and never raises. Pure logic: a dict store with torch's ``set`` /
``wait`` / ``get`` shape (the live two-node test, tests/test_multinode_live.py, uses torch's)."""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from types import SimpleNamespace

import pytest

from spectrace.settings import ACTIVE_RUN_ENV
from spectrace.recorder import run_agreement
from spectrace.recorder.runtime import Run


class DictStore:
    def __init__(self):
        self.values: dict[str, bytes] = {}
        self.waited: list[float] = []

    def set(self, key, value):
        self.values[key] = value.encode() if isinstance(value, str) else value

    def wait(self, keys, timeout: timedelta):
        self.waited.append(timeout.total_seconds())
        missing = [k for k in keys if k not in self.values]
        if missing:
            raise RuntimeError(f"Wait timeout for keys {missing}")  # what torch's TCPStore raises, in shape

    def get(self, key):
        return self.values[key]


class Node:
    """The part of a Runtime the agreement touches: the run, and set_run."""

    def __init__(self, run: Run | None):
        self.run = run

    def set_run(self, run):
        self.run = run


def config(dp: int = 0):
    return SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_index=dp, data_parallel_rank=dp))


@pytest.fixture(autouse=True)
def _restore_active_run():
    before = os.environ.get(ACTIVE_RUN_ENV)
    yield
    if before is None:
        os.environ.pop(ACTIVE_RUN_ENV, None)
    else:
        os.environ[ACTIVE_RUN_ENV] = before


def test_rank_1_on_another_node_joins_rank_0s_run_and_trace():
    store = DictStore()
    head = Node(Run("run-head", "00-" + "a" * 32 + "-" + "b" * 16 + "-01"))
    other = Node(Run("run-node1", "00-" + "c" * 32 + "-" + "d" * 16 + "-01", info={"method": "draft_model"}))
    assert run_agreement.agree(head, 0, config(), store) == "published"
    assert run_agreement.agree(other, 1, config(), store) == "joined"
    assert (other.run.run_id, other.run.traceparent) == ("run-head", head.run.traceparent)
    assert other.run.info == {"method": "draft_model"}  # what this node already knew of the engine is kept
    assert os.environ[ACTIVE_RUN_ENV] == head.run.env_value()  # and handed to what this rank starts
    assert store.waited == [run_agreement.WAIT_S]


def test_same_host_ranks_already_agree():
    store = DictStore()
    run = Run("run-1", "tp")
    assert run_agreement.agree(Node(run), 0, config(), store) == "published"
    other = Node(Run("run-1", "tp"))
    assert run_agreement.agree(other, 1, config(), store) == "same" and other.run.run_id == "run-1"


def test_each_data_parallel_engine_agrees_under_its_own_key():
    store = DictStore()
    run_agreement.agree(Node(Run("engine-0", "")), 0, config(dp=0), store)
    run_agreement.agree(Node(Run("engine-1", "")), 0, config(dp=1), store)
    rank_1_of_dp1 = Node(Run("local", ""))
    assert run_agreement.agree(rank_1_of_dp1, 1, config(dp=1), store) == "joined"
    assert rank_1_of_dp1.run.run_id == "engine-1"
    assert sorted(store.values) == ["spectrace/run/dp0", "spectrace/run/dp1"]


def test_silent_rank_0_leaves_the_node_run_with_one_log_line(caplog):
    node = Node(Run("run-node1", ""))
    with caplog.at_level(logging.WARNING, logger="vllm.spectrace"):
        assert run_agreement.agree(node, 1, config(), DictStore(), wait_s=0.01) == "local"
    assert node.run.run_id == "run-node1"
    [line] = caplog.messages
    assert "rank 1 did not learn rank 0's run" in line and "run-node1" in line


def test_untraced_rank_0_run_and_broken_store_never_raise(caplog):
    store = DictStore()
    run_agreement.agree(Node(None), 0, config(), store)  # rank 0 traced but with no run: publishes ""
    node = Node(Run("run-node1", ""))
    assert run_agreement.agree(node, 1, config(), store) == "local" and node.run.run_id == "run-node1"

    class Broken(DictStore):
        def set(self, key, value):
            raise ConnectionResetError("store gone")

    assert run_agreement.agree(Node(Run("r", "")), 0, config(), Broken()) == "local"
    assert run_agreement.agree(Node(Run("r", "")), None, config(), store) is None  # no rank: nothing to agree



def test_ranks_on_two_hosts_are_judged_together_with_their_hosts():
    """What the lake holds after a two-node engine: one run, rank 0 on node-0, rank 1 on node-1."""
    import duckdb

    from spectrace.audit.store_judge import StoreVerdicts, rank_verdicts
    from spectrace.queries import report

    con = duckdb.connect()
    con.execute("create table attention_layout (run_id varchar, host varchar, rank integer, model_role varchar, "
                "layer_index integer, runtime_type varchar, runtime_window integer, causal boolean)")
    con.execute("create table hidden_state_taps (run_id varchar, rank integer, tapped_ids varchar)")
    con.execute("create table verify_counts (run_id varchar, rank integer, source varchar, drafted bigint, accepted bigint)")
    con.execute("create table model_weights (run_id varchar, rank integer, model_role varchar, embed_tokens varchar, "
                "lm_head varchar, unloaded json)")
    for rank, host in ((0, "node-0"), (1, "node-1")):
        con.execute("insert into attention_layout values ('r', ?, ?, 'target', 0, 'full', null, true)", [host, rank])
        con.execute("insert into verify_counts values ('r', ?, 'worker', 30, 30)", [rank])
    con.execute("insert into hidden_state_taps values ('r', 0, '[1, 4, 5]'), ('r', 1, '[2, 4, 5]')")
    seen, [finding], hosts = rank_verdicts(con, "r")
    assert seen == [0, 1] and finding.code == "RANK_DISAGREEMENT"
    assert finding.evidence["aspect"] == "taps" and finding.evidence["hosts"] == {"0": "node-0", "1": "node-1"}
    assert "Ranks: 2 (0 on node-0, 1 on node-1), 1 disagreement(s)" in report._ranks(StoreVerdicts([], [finding], seen, hosts))[0]
    con.execute("update hidden_state_taps set tapped_ids = '[1, 4, 5]'")
    seen, findings, hosts = rank_verdicts(con, "r")
    assert report._ranks(StoreVerdicts([], findings, seen, hosts)) == [
        "Ranks: 2 (0 on node-0, 1 on node-1) agree on layout, taps and verified counts"]


def dp_config(size: int, index: int):
    return SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_size=size, data_parallel_index=index,
                                                           data_parallel_rank=index))


def test_each_data_parallel_engine_is_a_run_of_its_own():
    """``--data-parallel-size 2`` on one host, MoE target: both engine cores and their workers inherit
    the frontend's run; engine index 0 and 1 (``parallel_config.data_parallel_index``), size 2 kept."""
    frontend = Run("run-x", "00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    engines = []
    for index in (0, 1):
        core = Node(Run(frontend.run_id, frontend.traceparent))
        assert run_agreement.join_dp_engine(core, dp_config(2, index)) is True
        worker = Node(Run(core.run.run_id, core.run.traceparent))  # a worker the engine core started
        assert run_agreement.join_dp_engine(worker, dp_config(2, index)) is False  # already there
        engines.append((core.run.run_id, worker.run.run_id, core.run.traceparent))
    assert engines == [("run-x.dp0", "run-x.dp0", frontend.traceparent), ("run-x.dp1", "run-x.dp1", frontend.traceparent)]
    one = Node(Run("run-y", ""))
    assert run_agreement.join_dp_engine(one, dp_config(1, 0)) is False and one.run.run_id == "run-y"


def test_independent_dp_engines_engine_0_keeps_the_frontends_run():
    """Captured on CPU (vLLM 0.32, ``vllm serve --data-parallel-size 2``, a dense target): each engine
    core's config says ``data_parallel_size`` 1 (``reconfigure_for_independent_dp_rank``) with its
    ``data_parallel_index`` kept (0 and 1); before this rule both engines' rows shared one run."""
    runs = []
    for index in (0, 1):
        core = Node(Run("run-x", ""))
        run_agreement.join_dp_engine(core, dp_config(1, index))
        runs.append(core.run.run_id)
    assert runs == ["run-x", "run-x.dp1"]
