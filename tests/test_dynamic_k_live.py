"""Dynamic speculation on real vLLM runs (CPU build): k switches per step and DYNAMIC_K_THRASHING.

One child, two engines, the zoo target drafting for itself (``draft_model``, 100 % greedy acceptance:
whatever happens here is about k, not acceptance), greedy, ``ignore_eos`` so every length is fixed:

- ``thrashing``: ``max_num_seqs=4``, ``max_num_batched_tokens=14`` and the inverted schedule
  ``[(1, 3, 1), (4, 4, 4)]``. A full batch drafts 4 for the next step; 4 x (1 + 4 + 1 drafting slot) does not
  fit 14 tokens, so that step verifies the drafts of two requests and the smaller batch drafts 1; at 1 draft
  each the batch refills, drafts 4 again, and so on: k flips from one step to the next while the batch sits
  on the threshold (measured: 38 switches in 68 verified steps; the test asserts the rule's bounds, not these).
- ``once``: the schedule ``[(1, 2, 1), (3, 4, 4)]`` with an ample budget; half the requests stop early, so
  the batch crosses the threshold once.

The switches spectrace records (``step_shapes.k_switches``, summed over the drain's flushes) are checked
against the per-step k rebuilt from the request-step rows (``verify_steps``, every request-step), and those
rows against vLLM's own counters (drafts, draft tokens, accepted tokens per position).
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

import spectrace.store
from spectrace.audit.rules.acceptance import batch_band
from spectrace.audit import codes
from spectrace.queries import report
from spectrace.testing.engine import EngineSpec, run_engines

pytestmark = pytest.mark.vllm

K = 4
THRASHING = [(1, 3, 1), (4, 4, 4)]
ONCE = [(1, 2, 1), (3, 4, 4)]
PROMPTS = [
    "the quick brown fox", "hello world speculative decoding", "a b c d e f g", "once upon a time there was",
    "the cat sat on the mat", "one two three four five", "in the beginning there was", "red green blue yellow",
]


@pytest.fixture(scope="module")
def dynamic_runs(zoo, scratch, cache_root):
    store = scratch / "dynamic-k-store"

    def spec(name, schedule, prompts, max_tokens, sampling, **llm):
        return EngineSpec(name=name, target=zoo["target"], prompts=prompts, max_tokens=max_tokens, sampling=sampling,
                          speculative={"method": "draft_model", "model": zoo["draft_self"], "num_speculative_tokens": K,
                                       "num_speculative_tokens_per_batch_size": schedule},
                          extra_llm_kwargs={"max_num_seqs": 4, **llm})

    specs = [
        spec("thrashing", THRASHING, PROMPTS, 64, [{"ignore_eos": True}], max_num_batched_tokens=14),
        spec("once", ONCE, PROMPTS[:4], 48, [{"ignore_eos": True}, {"ignore_eos": True, "max_tokens": 24}]),
    ]
    results = run_engines(specs, store=store, cache_root=cache_root, log_file=scratch / "dynamic-k.log")
    for name, result in results.items():
        assert result.ok, (name, result.error)
    return spectrace.store.open(store), results


def per_step(con, run_id: str) -> list[tuple[int, int]]:
    """(requests with drafts, k) of each verified step in order, from the request-step rows."""
    rows = con.execute("select step, count(*), max(num_drafted) from verify_steps where run_id = ? group by step "
                       "order by step", [run_id]).fetchall()
    return [(n, k) for _, n, k in rows]


def switched(steps: list[tuple[int, int]]) -> list[bool]:
    return [False] + [a[1] != b[1] for a, b in zip(steps, steps[1:])]


def check_rows_against_vllm(con, result) -> None:
    """verify_steps holds every request-step vLLM verified: its counters, position by position."""
    m = result.metrics
    drafted = [r[0] for r in con.execute("select num_drafted from verify_steps where run_id = ?", [result.run_id]).fetchall()]
    assert len(drafted) == m["vllm:spec_decode_num_drafts"]
    assert sum(drafted) == m["vllm:spec_decode_num_draft_tokens"] == m["vllm:spec_decode_num_accepted_tokens"]  # 100 %
    assert [sum(d > i for d in drafted) for i in range(K)] == m["vllm:spec_decode_num_accepted_tokens_per_pos"]


def recorded_shapes(con, run_id: str) -> dict[tuple[str, int], tuple[int, int]]:
    rows = con.execute("select batch_band, k, sum(steps), sum(k_switches) from step_shapes where run_id = ? group by all",
                       [run_id]).fetchall()
    return {(band, k): (int(n), int(s)) for band, k, n, s in rows}


def rebuilt_shapes(steps: list[tuple[int, int]]) -> dict[tuple[str, int], tuple[int, int]]:
    out: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for (batch, k), flipped in zip(steps, switched(steps)):
        out[(batch_band(batch), k)][0] += 1
        out[(batch_band(batch), k)][1] += flipped
    return {key: tuple(v) for key, v in out.items()}


def findings(con, run_id: str, code: str) -> list[dict]:
    rows = con.execute("select message, evidence, fix from findings where run_id = ? and code = ?", [run_id, code]).fetchall()
    return [{"message": m, "evidence": json.loads(e), "fix": f} for m, e, f in rows]


def test_k_flips_step_to_step_and_the_switches_are_what_the_engine_did(dynamic_runs, record_property):
    con, results = dynamic_runs
    result = results["thrashing"]
    check_rows_against_vllm(con, result)
    steps = per_step(con, result.run_id)
    flips = sum(switched(steps))
    assert {k for _, k in steps} >= {1, K}  # the schedule's two k (and a budget-trimmed one between)
    assert flips >= 20 and flips >= 0.25 * len(steps)  # it really thrashes
    assert recorded_shapes(con, result.run_id) == rebuilt_shapes(steps)  # per band and k, over every flush
    budget = con.execute("select sum(proposed), sum(verified) from draft_budget where run_id = ?", [result.run_id]).fetchone()
    record_property("thrashing", {"verified_steps": len(steps), "k_switches": flips, "proposed": budget[0],
                                  "verified": budget[1], "k_sequence": "".join(str(k) for _, k in steps)})


def test_thrashing_is_named_with_its_evidence(dynamic_runs, record_property):
    """Named once, at the first flush where the rule held: its evidence is the run up to that flush."""
    con, results = dynamic_runs
    result = results["thrashing"]
    steps = per_step(con, result.run_id)
    [f] = findings(con, result.run_id, codes.DYNAMIC_K_THRASHING)
    ev = f["evidence"]
    seen = steps[:ev["verified_steps"]]  # the steps of the flushes before the finding
    assert 0 < len(seen) <= len(steps) and ev["k_switches"] == sum(switched(seen))
    assert ev["k_switches"] >= 20 and ev["share"] >= 0.25
    assert {(s["batch_band"], s["k"]): (s["steps"], s["k_switches"]) for s in ev["switched_shapes"]} == {
        key: value for key, value in rebuilt_shapes(seen).items() if value[1]}
    assert ev["num_speculative_tokens_per_batch_size"] == [list(entry) for entry in THRASHING]
    assert (ev["max_num_seqs"], ev["max_num_batched_tokens"]) == (4, 14) and ev["token_budget"]["needed"] == 24
    assert {"1", str(K)} <= set(ev["k_steps"])
    # the drafts never verified: what draft_budget held at that flush, the verified ones those of the steps seen
    proposed, verified = con.execute(
        "select sum(proposed), sum(verified) from draft_budget where run_id = ? and ts <= "
        "(select ts from findings where run_id = ? and code = ?)", [result.run_id, result.run_id, codes.DYNAMIC_K_THRASHING],
    ).fetchone()
    last_step = con.execute("select step from verify_steps where run_id = ? group by step order by step limit 1 offset ?",
                            [result.run_id, len(seen) - 1]).fetchone()[0]
    drafted, requests = con.execute("select sum(num_drafted), count(distinct request_id) from verify_steps "
                                    "where run_id = ? and step <= ?", [result.run_id, last_step]).fetchone()
    assert verified == drafted
    assert ev["drafts"] == {"proposed": proposed, "verified": verified, "unverified": proposed - verified,
                            "finished_allowance_at_most": requests * K}
    assert ev["drafts"]["unverified"] > ev["drafts"]["finished_allowance_at_most"]  # more than the last proposals
    assert "num_speculative_tokens_per_batch_size" in f["fix"] and "static num_speculative_tokens" in f["fix"]
    text = report.render(con, run_id=result.run_id)  # the report: the whole run
    assert codes.DYNAMIC_K_THRASHING in text and f"k switched in {sum(switched(steps))} of {len(steps)} verified" in text
    record_property("finding", f["message"])


def test_a_schedule_crossed_once_records_one_switch_and_no_finding(dynamic_runs):
    con, results = dynamic_runs
    result = results["once"]
    check_rows_against_vllm(con, result)
    steps = per_step(con, result.run_id)
    assert {k for _, k in steps} == {1, K}  # dynamic: both k drafted
    assert recorded_shapes(con, result.run_id) == rebuilt_shapes(steps)
    assert sum(switched(steps)) <= 2
    assert findings(con, result.run_id, codes.DYNAMIC_K_THRASHING) == []
    # greedy at 100 % acceptance: whatever k each step drafted, the text is the target's own
    thrashing = results["thrashing"].tokens
    assert all(thrashing[i][:len(tokens)] == tokens for i, tokens in enumerate(result.tokens))
