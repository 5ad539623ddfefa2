"""What k pays (spectrace.speedup): the expected length at every k' and the step cost model, on sums."""

import pytest

from spectrace import acceptance
from spectrace.speedup import Baseline, StepCost, best, expected_lengths, speedup_by_k


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


def test_a_baseline_prices_step_zero_as_measured_and_interpolates_verification():
    # 10 steps of 8 requests at k=4: verification 18 ms, drafting 8 ms (2 ms a position); no drafts: 12 ms
    base = Baseline(steps=10, plain_ns=10 * 12e6, verify_ns=10 * 18e6, draft_ns=10 * 8e6, baseline_steps=40)
    assert base.step_ns_at(4, 0) == pytest.approx(12e6)
    assert base.step_ns_at(4, 2) == pytest.approx(15e6 + 4e6)  # verification halfway, two positions drafted
    assert base.step_ns_at(4, 4) == pytest.approx(26e6)
    assert base.step_ns_at(4, 1, parallel=True) == pytest.approx(13.5e6 + 8e6)
    fit = _cost(None, 30e6, 0.0, 8e6, 8, [40] * 10)  # the run alone prices step(0) at 30 ms
    rows = speedup_by_k([8, 6, 4, 2], 10, fit, extra=0, baseline=base)
    assert {r["step_source"] for r in rows} == {"baseline"}
    by_k = {r["k"]: r for r in rows}
    assert by_k[0]["speedup"] == 1.0 and by_k[4]["step_ms"] == pytest.approx(26.0)
    assert by_k[2]["speedup"] == pytest.approx(2.4 * 12 / 19, abs=1e-4)
    assert {r["step_source"] for r in speedup_by_k([8, 6, 4, 2], 10, fit, extra=0)} == {"fit"}


def _write_run(writer, run_id, target, *, k=None, decode=(), timing=None):
    """One run's rows as the drain writes them: decode_steps (requests, drafts, steps, step_ns, draft_ns), and
    for a run at k its engine-core counts (accepted 8, 6, ... per position of 10 request-steps) and step sums."""
    writer.append("runs", {"run_id": run_id, "process_role": "frontend", "started_at": 1, "target_model": target,
                           "method": "draft_model" if k else None, "num_speculative_tokens": k})
    for requests, drafts, steps, step_ns, draft_ns in decode:
        writer.append("decode_steps", {"run_id": run_id, "process_role": "worker", "host": "h", "rank": 0, "ts": 2,
                                       "requests": requests, "drafts": drafts, "steps": steps, "step_ns": step_ns,
                                       "draft_ns": draft_ns})
    if k:
        writer.extend("verify_counts", [{"run_id": run_id, "process_role": "engine_core", "source": "engine_core", "ts": 2,
                                         "position": i, "drafted": 10, "accepted": 8 - 2 * i} for i in range(k)])
        writer.append("speculation_steps", {"run_id": run_id, "process_role": "worker", "host": "h", "rank": 0, "ts": 2,
                                            **timing})


def test_named_query_is_the_python_model_with_and_without_a_baseline(tmp_path):
    import spectrace.store
    from spectrace.queries import named
    from spectrace.speedup import from_store
    from spectrace.testing import store_pipeline

    writer = store_pipeline(tmp_path, retention_s=0, compact_interval_s=0)
    sums = dict(steps=10, step_ns=10 * 26_000_000, draft_ns=10 * 8_000_000, request_steps=80, tokens=320,
                scheduled_tokens=10 * 40 + 24, scheduled_tokens_sq=9 * 1600 + 64 ** 2,
                tokens_x_verify_ns=9 * 40 * 18e6 + 64 * 18e6, requests=80)
    decode = [(8, 4, 9, 9 * 26_000_000, 9 * 8_000_000), (3, 4, 1, 20_000_000, 5_000_000)]
    _write_run(writer, "priced", "t", k=4, decode=decode, timing=sums)
    _write_run(writer, "alone", "other-target", k=4, decode=decode, timing=sums)
    _write_run(writer, "plain", "t", decode=[(8, 0, 30, 30 * 12_000_000, 0), (5, 0, 4, 4 * 10_000_000, 0)])
    writer.flush()
    con = spectrace.store.open(tmp_path)
    sql = con.execute(named.load("speedup_by_k")).fetchall()
    for run_id, source in (("priced", "baseline"), ("alone", "fit")):
        py = [r for r in from_store(con, run_id) if not r["extrapolated"]]
        assert {r["step_source"] for r in py} == {source}
        assert [(r["k"], r["in_force"], r["expected_length"], r["step_ms"], r["speedup"], r["step_source"]) for r in py] == \
            [row[2:] for row in sql if row[0] == run_id and row[1] == "all"], run_id
    priced = {r["k"]: r for r in from_store(con, "priced")}
    assert priced[0]["step_ms"] == 12.0  # the baseline's 8-request steps; its 5-request ones match no step at k
    assert priced[4]["step_ms"] == 26.0
