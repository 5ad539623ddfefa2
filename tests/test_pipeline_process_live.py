"""SPECTRACE_PIPELINE=process on real vLLM runs: the engine keeps its hooks and a shipper; a pipeline process
counts, judges and writes every sink under the engine's identity. Same tokens, same counts, same findings as
the in-process flush; a pipeline process killed mid-run is started again and vLLM never notices."""

from __future__ import annotations

import json

import pytest

import spectrace.store
from spectrace.testing.engine import method_specs, run_engines

pytestmark = [pytest.mark.vllm]

PROCESS = {"SPECTRACE_PIPELINE": "process"}


def _specs(zoo, *names, **changes):
    specs = [spec for spec in method_specs(zoo) if spec.name in names]
    for spec in specs:
        for key, value in changes.items():
            setattr(spec, key, value)
    return specs


def _by_position(con, run_id):
    return con.execute("select position, drafted, accepted from acceptance_by_position where run_id = ? order by position",
                       [run_id]).fetchall()


def _codes(con, run_id):
    return sorted({r[0] for r in con.execute("select code from findings where run_id = ?", [run_id]).fetchall()})


@pytest.fixture(scope="module")
def process_runs(zoo, scratch, cache_root):
    store = scratch / "pipeline-process-store"
    results = run_engines(_specs(zoo, "self", "seeded"), store=store, cache_root=cache_root,
                          log_file=scratch / "pipeline-process.log", env=PROCESS)
    return store, results


@pytest.mark.parametrize("name", ["self", "seeded"])
def test_same_tokens_counts_and_findings_as_the_flush_thread(process_runs, traced_methods, untraced_methods, name):
    store, results = process_runs
    result = results[name]
    assert result.ok, result.error
    assert result.tokens == untraced_methods[name].tokens
    con = spectrace.store.open(store)
    rows = _by_position(con, result.run_id)
    # vLLM's own counters, position by position
    assert [a for _, _, a in rows] == result.metrics["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert sum(d for _, d, _ in rows) == result.metrics["vllm:spec_decode_num_draft_tokens"]
    # and what the in-process flush wrote for the same engine
    thread_store, thread_results = traced_methods
    thread_con = spectrace.store.open(thread_store)
    assert rows == _by_position(thread_con, thread_results[name].run_id)
    assert _codes(con, result.run_id) == _codes(thread_con, thread_results[name].run_id)
    if name == "seeded":
        assert "ACCEPTANCE_COLLAPSE" in _codes(con, result.run_id)


def test_rows_are_the_engines_and_the_pipeline_is_another_process(process_runs):
    store, results = process_runs
    con = spectrace.store.open(store)
    engine_pids = {r[0] for r in con.execute(
        "select distinct pid from verify_counts union select distinct pid from spans union select distinct pid from hooks"
    ).fetchall()}
    assert len(engine_pids) == 1  # one engine child ran both engines; every row is keyed by it
    shipper = results["seeded"].exporter["shipper"]
    assert shipper["pid"] not in engine_pids and shipper["started"] == 1
    assert shipper["messages"] > 10 and shipper["lost_records"] == 0 and shipper["lost_messages"] == 0
    # the pipeline process's own stats came back with its acknowledgements: its store sink wrote the segments
    assert results["seeded"].exporter["duckdb"]["segments_written"] > 0
    assert results["seeded"].exporter["dropped"] == 0
    starts = [json.loads(a) for (a,) in con.execute(
        "select attributes from spans where name = 'spectrace.process.start'").fetchall()]
    exporters = {json.loads(a["spectrace.exporters"])["duckdb"] for a in starts}
    assert exporters == {f"pipeline process (pid {shipper['pid']})"}


def test_a_killed_pipeline_process_is_started_again(zoo, scratch, cache_root, untraced_methods):
    """SPECTRACE_INJECT_FAULT=pipeline_process: the first pipeline process SIGKILLs itself on a message with engine
    steps (its third or later)."""
    store = scratch / "pipeline-killed-store"
    result = run_engines(
        _specs(zoo, "self", repeat=3), store=store, cache_root=cache_root, log_file=scratch / "pipeline-killed.log",
        env={**PROCESS, "SPECTRACE_INJECT_FAULT": "pipeline_process", "SPECTRACE_SHIP_INTERVAL": "0.05"},
    )["self"]
    assert result.ok, result.error
    assert result.tokens == untraced_methods["self"].tokens  # vLLM never noticed
    shipper = result.exporter["shipper"]
    assert shipper["started"] == 2
    assert shipper["lost_records"] > 0  # the first process's unwritten messages, counted ...
    assert result.exporter["dropped"] >= shipper["lost_records"]  # ... as dropped by the second
    con = spectrace.store.open(store)
    rows = _by_position(con, result.run_id)
    drafted = sum(d for _, d, _ in rows)
    assert 0 < drafted <= result.metrics["vllm:spec_decode_num_draft_tokens"]  # the steps after the restart
    assert all(a == d for _, d, a in rows)  # the self-drafter still accepts everything it drafted
    log = (scratch / "pipeline-killed.log").read_text()
    assert "the pipeline process ended" in log
