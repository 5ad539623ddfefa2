"""What k pays (spectrace.speedup): the expected length at every k' and the step cost model, on sums."""

import pytest

from spectrace import acceptance
from spectrace.speedup import StepCost, best, expected_lengths, speedup_by_k


def test_expected_length_at_every_k_is_the_prefix_counts():
    # 10 request-steps at k=3 accepting 0,1,1,2,2,2,3,3,3,3 drafts
    accepted = [0, 1, 1, 2, 2, 2, 3, 3, 3, 3]
    import numpy as np

    _, accepted_at = acceptance.position_counts(np.full(10, 3), np.array(accepted), 3)
    rows = expected_lengths(list(accepted_at), 10, extra=0)
    for k_new, length, extrapolated in rows:
        assert not extrapolated
        assert length == pytest.approx(1 + sum(min(j, k_new) for j in accepted) / 10)


def test_extrapolation_continues_the_last_conditional_rate():
    rows = expected_lengths([80, 40, 20], 100, extra=2)
    assert [r[0] for r in rows] == [0, 1, 2, 3, 4, 5]
    assert [r[2] for r in rows] == [False] * 4 + [True] * 2
    assert rows[4][1] == pytest.approx(1 + (80 + 40 + 20 + 10) / 100)
    assert rows[5][1] == pytest.approx(1 + (80 + 40 + 20 + 10 + 5) / 100)
    assert expected_lengths([5], 0) == []


def _cost(steps, verify_a, per_token, draft, requests, tokens_list):
    n = len(tokens_list)
    v = [verify_a + per_token * t for t in tokens_list]
    return StepCost(steps=n, step_ns=sum(v) + draft * n, draft_ns=draft * n, scheduled_tokens=sum(tokens_list),
                    scheduled_tokens_sq=sum(t * t for t in tokens_list),
                    tokens_x_verify_ns=sum(t * x for t, x in zip(tokens_list, v)), requests=requests * n)


def test_step_cost_prices_verification_per_token_and_drafting_per_position():
    # 8 requests at k=3 (32 tokens), some steps with a prefill chunk on top (spread for the fit)
    cost = _cost(None, 1e6, 1e4, 6e6, 8, [32, 32, 48, 32, 64, 32])
    a, b = cost.verify_fit()
    assert a == pytest.approx(1e6) and b == pytest.approx(1e4)
    mean_tokens = sum([32, 32, 48, 32, 64, 32]) / 6
    assert cost.step_ns_at(3, 0) == pytest.approx(1e6 + 1e4 * (mean_tokens - 24))
    assert cost.step_ns_at(3, 1) == pytest.approx(1e6 + 1e4 * (mean_tokens - 16) + 2e6)
    assert cost.step_ns_at(3, 3) == pytest.approx(cost.step_ns / cost.steps)
    assert cost.step_ns_at(3, 1, parallel=True) == pytest.approx(1e6 + 1e4 * (mean_tokens - 16) + 6e6)


def test_speedup_at_k_in_force_is_the_runs_own_estimate_and_the_pick():
    cost = _cost(None, 10e6, 0.0, 3e6, 8, [32] * 20)  # a cheap drafter: 1 ms a position, verification 10 ms
    rows = speedup_by_k([90, 50, 10], 100, cost, extra=1)
    at_k = next(r for r in rows if r["in_force"])
    no_draft = acceptance.no_draft_step_ns(cost.steps, cost.scheduled_tokens, cost.scheduled_tokens_sq,
                                           cost.tokens_x_verify_ns, cost.step_ns - cost.draft_ns, cost.requests)
    assert at_k["speedup"] == pytest.approx(acceptance.speedup_estimate(2.5, no_draft, cost.step_ns), abs=1e-4)
    by_k = {r["k"]: r["speedup"] for r in rows}
    assert by_k[0] == 1.0
    assert by_k[2] == pytest.approx(2.4 * 10 / 12, abs=1e-4)  # the third position accepts 10 %: k'=2 pays most
    assert best(rows)["k"] == 2
    assert rows[-1]["extrapolated"] and best([r for r in rows if r["k"] == 4]) is None
