"""Request slices, the token budget and prefix-cache hits on real vLLM runs (CPU build).

One child, four engines, each the zoo target drafting for itself (``draft_model``, 100 % greedy
acceptance without request parameters), so any fall is the request's or the scheduler's doing:

- ``penalized``: every other request asks for ``repetition_penalty=1.5``. The drafter proposes
  from unpenalized logits, the target verifies after the penalty: ``SLICE_ACCEPTANCE_LOW`` names
  the penalty, with the slice's numbers.
- ``healthy``: the same engine and prompts without penalties: nothing new is raised.
- ``budget``: ``max_num_batched_tokens=20`` for ``max_num_seqs=16`` and k 7: ``TOKEN_BUDGET_SHORT``
  from the frontend's config audit, and the drafts the scheduler trimmed (``DRAFTS_UNVERIFIED``).
- ``eagle_prefix``: prompts sharing a ~600-token prefix with prefix caching on, generated twice, an
  EAGLE3 drafter (the zero-norm pair: 100 % acceptance) and 256-token blocks: the second round hits
  the cache (``request_slices.cached_tokens``), hits and misses accept alike, and vLLM drops the last
  matched block of each hit, half of what the hits would have restored: ``PREFIX_HITS_DROPPED``. The
  ``draft_model`` engines (prefix caching on, vLLM 0.32's default) drop nothing: the healthy twin.
"""

from __future__ import annotations

import json
import time

import pytest

import spectrace.store
from spectrace.audit.rules import slices
from spectrace.audit import codes
from spectrace.queries import named as named_queries
from spectrace.testing.engine import EngineSpec, run_engines

pytestmark = pytest.mark.vllm

K = 3
PROMPTS = [
    "the quick brown fox", "hello world speculative decoding", "a b c d e f g", "once upon a time there was",
    "the cat sat on the mat", "one two three four five", "in the beginning there was", "red green blue yellow",
]
PREFIX = "the quick brown fox jumps over the lazy dog " * 20  # ~600 tokens (the zoo tokenizer: 30 a repetition)


@pytest.fixture(scope="module")
def slice_runs(zoo, scratch, cache_root):
    store = scratch / "slices-store"
    target = zoo["target"]

    def spec(name, k=K, max_tokens=96, **extra):
        return EngineSpec(name=name, target=target, prompts=PROMPTS, max_tokens=max_tokens,
                          speculative={"method": "draft_model", "model": target, "num_speculative_tokens": k}, **extra)

    specs = [
        spec("penalized", sampling=[{}, {"repetition_penalty": 1.5}]),
        spec("healthy"),
        spec("budget", k=7, max_tokens=128, extra_llm_kwargs={"max_num_seqs": 16, "max_num_batched_tokens": 20}),
        # EAGLE3 (the zero-norm pair: 100 % acceptance) with 256-token blocks: vLLM drops the last matched block
        EngineSpec(name="eagle_prefix", target=zoo["target_zero"], max_tokens=16, max_model_len=1024, repeat=2,
                   prompts=[PREFIX + tail for tail in PROMPTS[:4]],
                   speculative={"method": "eagle3", "model": zoo["eagle3_zero"], "num_speculative_tokens": K},
                   extra_llm_kwargs={"enable_prefix_caching": True, "block_size": 256}),
    ]
    started = time.perf_counter()
    results = run_engines(specs, store=store, cache_root=cache_root, log_file=scratch / "slices.log")
    print(f"slices live child: {time.perf_counter() - started:.1f} s")
    for name, result in results.items():
        assert result.ok and result.run_id, (name, result.error)
    return spectrace.store.open(store), results


def findings(con, run_id, code):
    return con.execute("select severity, message, evidence, fix, caused_by from findings where run_id = ? and code = ?",
                       [run_id, code]).fetchall()


def test_penalty_slice_is_named_with_its_numbers(slice_runs):
    con, results = slice_runs
    run = results["penalized"].run_id
    [(severity, message, evidence, fix, _)] = findings(con, run, codes.SLICE_ACCEPTANCE_LOW)
    ev = json.loads(evidence)
    assert (severity, ev["dimension"], ev["value"]) == ("warning", "repetition_penalty", "1.5")
    assert 2 <= ev["slice"]["requests"] <= 4 and 2 <= ev["rest"]["requests"] <= 4
    assert ev["rest"]["rate"] == 1.0  # the target drafting for itself, unpenalized
    assert ev["slice"]["rate"] < 0.75 and ev["slice"]["interval_95"][1] < ev["rest"]["interval_95"][0]
    assert "cannot see request penalties" in fix and "repetition_penalty=1.5" in message
    # the view says the same, from the store's complete per-request counts
    view = {row[0]: row[1:] for row in con.execute(
        "select value, requests, drafted, accepted, rest_rate from acceptance_by_slice "
        "where run_id = ? and dimension = 'repetition_penalty'", [run]).fetchall()}
    # the finding was judged at the first flush where the rule held; the view holds the whole run
    assert ev["slice"]["drafted"] <= view["1.5"][1] and ev["rest"]["drafted"] <= view["off"][1]
    assert view["1.5"][0] == view["off"][0] == 4 and view["1.5"][3] == 1.0
    final = slices.slice_gap("repetition_penalty", "1.5", view["1.5"][:3], (8, view["1.5"][1] + view["off"][1],
                             view["1.5"][2] + view["off"][2]), K)
    assert final is not None and final.rest_rate == 1.0
    # and the counts agree with the run's acceptance_by_position (every request-step counted once)
    total = con.execute("select sum(drafted), sum(accepted) from acceptance_by_position where run_id = ?", [run]).fetchone()
    assert total == (view["1.5"][1] + view["off"][1], view["1.5"][2] + view["off"][2])
    named = con.execute(named_queries.load("slice_acceptance_low")).fetchall()
    assert any(r[0] == run and r[1] == "repetition_penalty" and r[2] == "1.5" for r in named)
    print(f"penalized slice: {ev['slice']}, rest: {ev['rest']}")


def test_healthy_twin_raises_nothing_new(slice_runs):
    con, results = slice_runs
    run = results["healthy"].run_id
    new = (codes.SLICE_ACCEPTANCE_LOW, codes.TOKEN_BUDGET_SHORT, codes.DRAFTS_UNVERIFIED)
    assert con.execute(f"select code from findings where run_id = ? and code in {new}", [run]).fetchall() == []
    slices_seen = con.execute("select count(*), count(distinct repetition_penalty), min(prompt_tokens) from request_slices "
                              "where run_id = ?", [run]).fetchone()
    assert slices_seen[0] == 8 and slices_seen[1] == 1 and slices_seen[2] > 0
    budget = con.execute("select sum(proposed), sum(verified) from draft_budget where run_id = ?", [run]).fetchone()
    assert budget[0] >= budget[1] > 0  # every verified draft was proposed; the rest: each request's last proposal


def test_token_budget_rule_live_and_the_drafts_it_trims(slice_runs):
    con, results = slice_runs
    run = results["budget"].run_id
    [(severity, message, evidence, fix, _)] = findings(con, run, codes.TOKEN_BUDGET_SHORT)
    ev = json.loads(evidence)
    assert (ev["max_num_batched_tokens"], ev["max_num_seqs"], ev["num_speculative_tokens"]) == (20, 16, 7)
    assert (ev["drafting_slots"], ev["needed"], ev["full_draft_requests"]) == (1, 16 * 9, 2)
    proposed, verified = con.execute("select sum(proposed), sum(verified) from draft_budget where run_id = ?", [run]).fetchone()
    [(severity, message, evidence, fix, caused_by)] = findings(con, run, codes.DRAFTS_UNVERIFIED)
    ev = json.loads(evidence)
    assert caused_by == codes.TOKEN_BUDGET_SHORT and ev["token_budget"]["needed"] == 144
    assert ev["proposed"] <= proposed and ev["share"] >= 0.10 and ev["unverified"] == ev["proposed"] - ev["verified"] - ev["requests"] * 7
    print(f"budget: proposed {proposed}, verified {verified}; finding {ev['share']:.1%} unverified")


def test_prefix_cache_hits_are_recorded_and_accept_like_misses(slice_runs):
    con, results = slice_runs
    run = results["eagle_prefix"].run_id
    rows = con.execute("select prompt_tokens, cached_tokens from request_slices where run_id = ? order by ts, request_id",
                       [run]).fetchall()
    assert len(rows) == 8 and all(512 < p < 768 for p, _ in rows)
    hits = [c for _, c in rows if c > 0]
    assert len(hits) >= 4 and all(c < p for p, c in rows)  # the second round restores the shared prefix
    requests, requests_hit, prompt, cached, rate = con.execute(
        "select requests, requests_hit, prompt_tokens, cached_tokens, token_hit_rate from prefix_cache_hits where run_id = ?",
        [run]).fetchone()
    assert (requests, requests_hit, cached) == (8, len(hits), sum(hits)) and 0 < rate < 1
    by_hit = dict(con.execute("select value, rate from acceptance_by_slice where run_id = ? and dimension = 'prefix_cache'",
                              [run]).fetchall())
    assert set(by_hit) == {"hit", "miss"} and by_hit["hit"] == by_hit["miss"] == 1.0
    assert findings(con, run, codes.SLICE_ACCEPTANCE_LOW) == []
    print(f"prefix: {len(hits)} of 8 requests hit, {cached} of {prompt} prompt tokens restored")


def test_eagle_block_drop_costs_half_the_hits(slice_runs):
    con, results = slice_runs
    run = results["eagle_prefix"].run_id
    row = con.execute("select requests, requests_hit, cached_tokens, block_size, eagle_block_drop, dropped_tokens_at_least, "
                      "token_hit_rate, token_hit_rate_without_drop_at_least from prefix_cache_hits where run_id = ?",
                      [run]).fetchone()
    requests, hit, cached, block, drop, dropped, rate, without = row
    assert (requests, block, drop) == (8, 256, True) and hit >= 4 and dropped == hit * 256 and without > rate
    [(severity, message, evidence, fix, _)] = findings(con, run, codes.PREFIX_HITS_DROPPED)
    ev = json.loads(evidence)
    assert (ev["requests_hit"], ev["cached_tokens"], ev["block_size"]) == (hit, cached, 256)
    assert ev["share_of_hits_lost"] >= 0.25 and "disable_eagle_block_drop" in fix
    # a draft_model engine (prefix caching on): vLLM drops no block
    twin = results["healthy"].run_id
    assert con.execute("select eagle_block_drop, dropped_tokens_at_least from prefix_cache_hits where run_id = ?",
                       [twin]).fetchone() == (False, 0)
    assert findings(con, twin, codes.PREFIX_HITS_DROPPED) == []
    print(f"eagle prefix: {hit} hits, {cached} tokens restored, at least {dropped} dropped ({ev['share_of_hits_lost']:.0%})")
