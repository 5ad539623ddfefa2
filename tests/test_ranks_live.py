"""Tensor parallelism on CPU: a TP=2 engine (two worker processes, multiprocess engine) records both
ranks, and the ranks of a healthy engine agree (no RANK_DISAGREEMENT). Real vLLM on CPU."""

from __future__ import annotations

import dataclasses

import pytest

import spectrace.store
from spectrace.audit import store_judge
from spectrace.queries import report
from spectrace.testing.engine import method_specs, run_engines

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def tp2(zoo, scratch, cache_root):
    spec = next(s for s in method_specs(zoo) if s.name == "self")
    spec = dataclasses.replace(spec, name="tp2", extra_llm_kwargs={"tensor_parallel_size": 2})
    store = scratch / "tp2-store"
    result = run_engines(
        [spec], store=store, multiprocessing=True, cache_root=cache_root, log_file=scratch / "tp2.log",
        env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"},  # one core per rank (vLLM's CPU workers bind threads)
    )["tp2"]
    return spectrace.store.open(store), result


def test_both_ranks_recorded_and_agree(tp2, untraced_methods):
    con, result = tp2
    assert result.ok, result.error
    assert result.tokens == untraced_methods["self"].tokens  # TP=2 generates what one rank does
    layouts, taps, counts, _, _ = store_judge.rank_records(con, result.run_id)
    assert sorted(layouts) == [0, 1] and len(layouts[0]) == len(layouts[1]) > 0
    drafted = result.metrics["vllm:spec_decode_num_draft_tokens"]
    accepted = result.metrics["vllm:spec_decode_num_accepted_tokens"]
    assert counts == {0: (drafted, accepted), 1: (drafted, accepted)}  # each rank verified the whole batch
    assert store_judge.rank_verdicts(con, result.run_id)[:2] == ([0, 1], [])
    assert "Ranks: 2 (0, 1) agree on layout, taps and verified counts" in report.render(con, run_id=result.run_id)
