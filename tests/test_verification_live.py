"""Per-step verification on real vLLM runs: spectrace's counts equal vLLM's own."""

from __future__ import annotations

import pytest

import spectrace.store
from spectrace.testing.engine import K

pytestmark = pytest.mark.vllm


def _by_position(con, run_id, source):
    rows = con.execute(
        "select position, sum(drafted), sum(accepted) from verify_counts "
        "where run_id = ? and source = ? group by position order by position",
        [run_id, source],
    ).fetchall()
    return [r[1] for r in rows], [r[2] for r in rows]


@pytest.mark.parametrize("name", ["self", "seeded", "eagle3", "dflash", "mtp", "ngram"])
def test_counts_equal_vllm_metrics(traced_methods, name):
    store, results = traced_methods
    result = results[name]
    assert result.ok, result.error
    con = spectrace.store.open(store)
    drafted, accepted = _by_position(con, result.run_id, "engine_core")
    vllm_accepted = result.metrics["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert sum(drafted[:1]) > 0, "no verification step was recorded"
    # vLLM reports accepted per position and drafted in total; compare both exactly.
    padded = accepted + [0] * (len(vllm_accepted) - len(accepted))
    assert padded == vllm_accepted
    assert sum(drafted) == result.metrics["vllm:spec_decode_num_draft_tokens"]
    # vLLM's num_drafts is the number of request-steps with drafts = drafted at position 0.
    assert drafted[0] == result.metrics["vllm:spec_decode_num_drafts"]
    # The worker verified exactly what the engine core counted.
    w_drafted, w_accepted = _by_position(con, result.run_id, "worker")
    assert (w_drafted, w_accepted) == (drafted, accepted)
    disagreements = con.execute(
        "select count(*) from findings where run_id = ? and code = 'VERIFY_DISAGREEMENT'", [result.run_id]
    ).fetchone()[0]
    assert disagreements == 0


def test_self_drafter_accepts_everything_and_never_collapses(traced_methods):
    store, results = traced_methods
    con = spectrace.store.open(store)
    rates = con.execute(
        "select position, rate from acceptance_by_position where run_id = ? order by position",
        [results["self"].run_id],
    ).fetchall()
    assert [p for p, _ in rates] == list(range(K))
    assert all(rate == 1.0 for _, rate in rates)
    codes = [r[0] for r in con.execute("select code from findings where run_id = ?", [results["self"].run_id]).fetchall()]
    assert codes == []


def test_seeded_drafter_collapse_is_named(traced_methods):
    store, results = traced_methods
    con = spectrace.store.open(store)
    row = con.execute(
        "select severity, evidence->>'position_0_rate', process_role from findings "
        "where run_id = ? and code = 'ACCEPTANCE_COLLAPSE'",
        [results["seeded"].run_id],
    ).fetchall()
    assert len(row) == 1
    severity, pos0, role = row[0]
    assert severity == "error" and float(pos0) < 0.1 and role == "engine_core"


def test_verify_steps_rows_and_context(traced_methods):
    store, results = traced_methods
    con = spectrace.store.open(store)
    run_id = results["self"].run_id
    rows = con.execute(
        "select request_id, context_len, num_drafted, num_accepted, greedy from verify_steps where run_id = ?",
        [run_id],
    ).fetchall()
    assert len(rows) == results["self"].metrics["vllm:spec_decode_num_drafts"]
    assert {r[2] for r in rows} == {K} and {r[3] for r in rows} == {K}
    assert all(r[4] is True for r in rows)
    # context grows by k + 1 tokens per step for a fully accepting drafter
    by_request: dict[str, list[int]] = {}
    for request_id, ctx, *_ in rows:
        by_request.setdefault(request_id, []).append(ctx)
    for contexts in by_request.values():
        contexts.sort()
        assert all(b - a == K + 1 for a, b in zip(contexts, contexts[1:]))
    buckets = con.execute(
        "select distinct context_bucket from acceptance_by_context where run_id = ?", [run_id]
    ).fetchall()
    assert buckets == [("0-512",)]


def test_tracing_never_changes_generated_tokens(traced_methods, untraced_methods):
    _, traced = traced_methods
    for name, baseline in untraced_methods.items():
        assert baseline.ok, baseline.error
        assert traced[name].tokens == baseline.tokens, name


def test_compiled_run_counts_equal_vllm_metrics(zoo, scratch, cache_root):
    """torch.compile on: vLLM's profiling run exercises the sampler with dummy drafts,
    which must not be counted."""
    from spectrace.testing.engine import method_specs, run_engines

    spec = method_specs(zoo, enforce_eager=False)[0]  # the self drafter
    store = scratch / "compiled-store"
    result = run_engines([spec], store=store, cache_root=cache_root, log_file=scratch / "compiled.log")["self"]
    assert result.ok, result.error
    con = spectrace.store.open(store)
    drafted, accepted = _by_position(con, result.run_id, "engine_core")
    assert accepted == result.metrics["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert sum(drafted) == result.metrics["vllm:spec_decode_num_draft_tokens"]
    assert _by_position(con, result.run_id, "worker") == (drafted, accepted)
