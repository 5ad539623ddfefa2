"""What k pays (spectrace.audit.rules.speedup): the expected length at every k' and the step cost model, on sums."""

from pathlib import Path

import pytest

from spectrace.audit.rules import acceptance
from spectrace.audit.rules.speedup import Baseline, StepCost, best, by_band, expected_lengths, speedup_by_k


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


def test_prefill_chunks_are_held_fixed_and_pull_the_speedup_toward_one():
    base = Baseline(steps=10, plain_ns=10 * 12e6, verify_ns=10 * 18e6, draft_ns=10 * 8e6, baseline_steps=40)
    fit = _cost(None, 30e6, 0.0, 8e6, 8, [40] * 10)
    alone = {r["k"]: r["speedup"] for r in speedup_by_k([8, 6, 4, 2], 10, fit, extra=0, baseline=base)}
    # as much time in prefill chunks as in decoding at k = 4: a run's time at k' is decode(k') + chunks(k)
    half = Baseline(10, 10 * 12e6, 10 * 18e6, 10 * 8e6, 40, chunk_ns=100e6, decode_ns=100e6)
    rows = {r["k"]: r for r in speedup_by_k([8, 6, 4, 2], 10, fit, extra=0, baseline=half)}
    assert rows[4]["chunk_share"] == 0.5 and rows[0]["speedup"] == 1.0
    for k in (1, 2, 3, 4):  # alone: plain / (step(k) / L(k)); decode time at k' over k's: alone[4] / alone[k']
        assert rows[k]["speedup"] == pytest.approx((alone[4] + 1) / (alone[4] / alone[k] + 1), abs=1e-3)
        assert abs(rows[k]["speedup"] - 1) < abs(alone[k] - 1)  # toward 1: the chunks' time does not change


BANDS = {"5-8": (9, [8, 6, 4, 2]), "3-4": (1, [1, 1, 0, 0])}  # band -> request-steps, accepted per position


def _write_run(writer, run_id, target, *, k=None, decode=(), timing=None, chunks=(), host=(), requests=()):
    """One run's rows as the drain writes them: decode_steps (requests, drafts, steps, step_ns, draft_ns), and
    for a run at k its engine-core counts (accepted 8, 6, ... per position of 10 request-steps; by batch-size band
    :data:`BANDS`) and step sums; ``host``: (process role, [(host ns, tokens) per step]) as ``host_steps`` rows;
    ``requests``: (request-steps, accepted, emitted, output tokens) per request (request_counts, request_outputs)."""
    for i, (steps, accepted, emitted, output) in enumerate(requests):
        writer.append("request_counts", {"run_id": run_id, "process_role": "engine_core", "ts": 2, "request_id": f"r{i}",
                                         "request_steps": steps, "drafted": 4 * steps, "accepted": accepted, "emitted": emitted})
        writer.append("request_outputs", {"run_id": run_id, "process_role": "frontend", "ts": 3, "request_id": f"r{i}",
                                          "output_tokens": output})
    for role, steps in host:
        writer.append("host_steps", {"run_id": run_id, "process_role": role, "host": "h", "ts": 2, "steps": len(steps),
                                     "host_ns": sum(ns for ns, _ in steps), "tokens": sum(t for _, t in steps),
                                     "tokens_sq": sum(t * t for _, t in steps), "tokens_x_ns": sum(t * ns for ns, t in steps)})
    writer.append("runs", {"run_id": run_id, "process_role": "frontend", "started_at": 1, "target_model": target,
                           "method": "draft_model" if k else None, "num_speculative_tokens": k})
    for requests, drafts, steps, step_ns, draft_ns in decode:
        writer.append("decode_steps", {"run_id": run_id, "process_role": "worker", "host": "h", "rank": 0, "ts": 2,
                                       "requests": requests, "drafts": drafts, "steps": steps, "step_ns": step_ns,
                                       "draft_ns": draft_ns})
    for requests, verified, steps, step_ns in chunks:
        writer.append("chunk_steps", {"run_id": run_id, "process_role": "worker", "host": "h", "rank": 0, "ts": 2,
                                      "requests": requests, "verified": verified, "steps": steps, "step_ns": step_ns,
                                      "draft_ns": 0, "scheduled_tokens": steps * 60})
    if k:
        writer.extend("verify_counts", [{"run_id": run_id, "process_role": "engine_core", "source": "engine_core", "ts": 2,
                                         "position": i, "drafted": 10, "accepted": 8 - 2 * i} for i in range(k)])
        writer.append("speculation_steps", {"run_id": run_id, "process_role": "worker", "host": "h", "rank": 0, "ts": 2,
                                            **timing})
        writer.extend("band_positions", [{"run_id": run_id, "process_role": "engine_core", "ts": 2, "batch_band": band,
                                          "position": i, "drafted": n, "accepted": a}
                                         for band, (n, accepted) in BANDS.items() for i, a in enumerate(accepted[:k])])


def test_named_query_is_the_python_model_with_and_without_a_baseline(tmp_path):
    import spectrace.store
    from spectrace.queries import named
    from spectrace.audit.rules.speedup import from_store
    from spectrace.testing import store_pipeline

    writer = store_pipeline(tmp_path, retention_s=0, compact_interval_s=0)
    sums = dict(steps=10, step_ns=10 * 26_000_000, draft_ns=10 * 8_000_000, request_steps=80, tokens=320,
                scheduled_tokens=10 * 40 + 24, scheduled_tokens_sq=9 * 1600 + 64 ** 2,
                tokens_x_verify_ns=9 * 40 * 18e6 + 64 * 18e6, requests=80)
    decode = [(8, 4, 9, 9 * 26_000_000, 9 * 8_000_000), (3, 4, 1, 20_000_000, 5_000_000)]
    # prefill chunks: three steps of 8 at 40 ms (14 ms over a decode step at k), one that verified nothing (20 ms)
    _write_run(writer, "priced", "t", k=4, decode=decode, timing=sums, chunks=[(8, True, 3, 120_000_000), (8, False, 1, 20_000_000)])
    # host time outside the worker: the engine core's 0.3 ms + 10 us a token emitted (8..32 tokens, mean 20), the
    # frontend's 0.1 ms whatever it emits (no spread: its mean)
    host = [("engine_core", [(300_000 + 10_000 * t, t) for t in (8, 16, 24, 32) * 5]), ("frontend", [(100_000, 24)] * 20)]
    # its requests: 10 request-steps that accepted 20 drafts gave 27 tokens (3 cut by stops), 8 tokens out each
    _write_run(writer, "alone", "other-target", k=4, decode=decode, timing=sums, host=host,
               requests=[(5, 10, 14, 8), (5, 10, 13, 8)])
    _write_run(writer, "plain", "t", decode=[(8, 0, 30, 30 * 12_000_000, 0), (5, 0, 4, 4 * 10_000_000, 0)])
    writer.flush()
    con = spectrace.store.open(tmp_path)
    sql = con.execute(named.load("speedup_by_k")).fetchall()
    for run_id, band, source in (("priced", "all", "baseline"), ("alone", "all", "fit"), ("priced", "5-8", "baseline"),
                                 ("priced", "3-4", "fit"), ("alone", "5-8", "fit")):  # no step without drafts at 3
        py = [r for r in from_store(con, run_id, batch_band=band) if not r["extrapolated"]]
        assert {r["step_source"] for r in py} == {source}
        assert [(r["k"], r["in_force"], r["expected_length"], r["emitted_length"], r["step_ms"], r["host_ms"], r["speedup"],
                 r["step_source"], r["chunk_share"]) for r in py] == \
            [row[3:] for row in sql if row[0] == run_id and row[1] == "all" and row[2] == band], (run_id, band)
    assert [row[2] for row in sql if row[0] == "priced" and row[1] == "all" and row[3] == 0] == ["all", "3-4", "5-8"]
    assert list(by_band(con, "priced")) == ["3-4", "5-8"]
    eight = {r["k"]: r for r in from_store(con, "priced", batch_band="5-8")}
    assert eight[4]["expected_length"] == pytest.approx(1 + 20 / 9, abs=1e-4) and eight[0]["step_ms"] == 12.0
    priced = {r["k"]: r for r in from_store(con, "priced")}
    assert priced[0]["step_ms"] == 12.0  # the baseline's 8-request steps; its 5-request ones match no step at k
    assert priced[4]["step_ms"] == 26.0
    # the chunks cost 3 * 14 + 20 ms beside (9 + 3) * 26 + 20 ms of decoding at k (the 3-request step included)
    rho = 62 / 332
    assert priced[4]["chunk_share"] == pytest.approx(rho / (1 + rho), abs=1e-4)
    per_token = 26 / 3.0  # L(4) = 3
    assert priced[2]["speedup"] == pytest.approx((12 / per_token + rho) / (19 / 2.4 / per_token + rho), abs=1e-4)
    assert {r["chunk_share"] for r in from_store(con, "alone")} == {0.0}  # the fit prices decode steps alone
    # what a request-step gives: 27 of 30 accepted tokens survived the stops (waste 0.1 at L(4) = 3, in proportion to
    # L - 1 at other k'); with its prefill step an 8-token request gets 8 E / (E + 7) a step
    alone = {r["k"]: r for r in from_store(con, "alone") if not r["extrapolated"]}

    def gives(length):
        e = length * (1 - 0.1 * (length - 1) / 2)
        return 8 * e / (e + 7)

    for k_new, length in ((0, 1.0), (1, 1.8), (2, 2.4), (4, 3.0)):
        assert alone[k_new]["emitted_length"] == pytest.approx(gives(length), abs=1e-4)
        # host time: a step at k' emits gives(k') / gives(4) of the run's mean 20 tokens; k' = 0 one token a request
        assert alone[k_new]["host_ms"] == pytest.approx(
            (300_000 + 10_000 * 20 * gives(length) / gives(3.0) + 100_000) / 1e6, abs=1e-4)
        assert alone[k_new]["speedup"] == pytest.approx(
            gives(length) * (alone[0]["step_ms"] + alone[0]["host_ms"]) / (alone[k_new]["step_ms"] + alone[k_new]["host_ms"]),
            abs=2e-4)
    assert alone[0]["emitted_length"] == 1.0
    # the model before issue #36: the worker's step alone, per accepted length
    before = {r["k"]: r for r in from_store(con, "alone", host=False, emitted=False)}
    for k_new, length in ((1, 1.8), (4, 3.0)):
        assert before[k_new]["host_ms"] == 0.0 and before[k_new]["step_ms"] == alone[k_new]["step_ms"]
        assert before[k_new]["emitted_length"] == length
        assert before[k_new]["speedup"] == pytest.approx(length * alone[0]["step_ms"] / alone[k_new]["step_ms"], abs=2e-4)
        assert before[k_new]["speedup"] > alone[k_new]["speedup"]  # fewer tokens a step than accepted: it paid less


def test_k_better_names_the_k_that_pays_clearly_more_from_measured_steps_only():
    from spectrace.audit import codes, k_better_finding

    # k=4 in force: verification 18 ms, drafting 16 ms (4 ms a position), 12 ms without drafts; the third and
    # fourth positions rarely accept: k'=2 pays 2.4 x 12 / 23 = 1.25x against 2.6 x 12 / 34 = 0.92x at k=4
    base = Baseline(steps=10, plain_ns=10 * 12e6, verify_ns=10 * 18e6, draft_ns=10 * 16e6, baseline_steps=40)
    fit = _cost(None, 18e6, 0.0, 16e6, 8, [40] * 10)
    rows = speedup_by_k([8, 6, 1, 1], 10, fit, extra=1, baseline=base)
    finding = k_better_finding(rows)
    assert finding is not None and finding.code == codes.SPECULATION_K_BETTER and finding.severity == "warning"
    ev = finding.evidence
    assert (ev["k_in_force"], ev["k_best"]) == (4, 2)
    assert ev["speedup_best"] == pytest.approx(2.4 * 12 / 23, abs=1e-4) and ev["speedup_in_force"] == pytest.approx(2.6 * 12 / 34, abs=1e-4)
    assert ev["gain"] == pytest.approx(ev["speedup_best"] / ev["speedup_in_force"] - 1, abs=1e-4)
    assert "num_speculative_tokens=2" in finding.fix and "k = 2 pays" in finding.message
    # the run-alone fit never advises (it reads high on CPU); a gain inside the model's accuracy neither
    assert k_better_finding(speedup_by_k([8, 6, 1, 1], 10, fit, extra=1)) is None
    assert k_better_finding(rows, margin=ev["gain"] + 0.01) is None
    # the k in force within the margin of the best: nothing to say
    assert k_better_finding(speedup_by_k([8, 6, 1, 1], 10, _cost(None, 18e6, 0.0, 16e6, 8, [24] * 10), extra=0,
                                         baseline=Baseline(10, 10 * 12e6, 10 * 13e6, 10 * 2e6, 40))) is None
    # by batch size: small batches pay most at k'=2, large ones without drafts -> vLLM's per-batch-size schedule
    small = speedup_by_k([8, 6, 1, 1], 10, fit, extra=0, baseline=base)
    large = speedup_by_k([2, 1, 0, 0], 10, fit, extra=0, baseline=base)
    banded = k_better_finding(rows, by_band={"3-4": small, "9-16": large, "17-32": speedup_by_k([2, 1, 0, 0], 10, fit)})
    assert banded.evidence["best_by_band"] == {"3-4": 2, "9-16": 0}  # the fit-priced band gives no advice
    assert "num_speculative_tokens=2 and num_speculative_tokens_per_batch_size=[(1, 4, 2), (9, 16, 0)]" in banded.fix
    # nothing accepted: no speculation is the k that pays
    none = k_better_finding(speedup_by_k([0, 0, 0, 0], 10, fit, extra=0, baseline=base))
    assert none is not None and none.evidence["k_best"] == 0 and "turn speculative decoding off" in none.fix


def test_report_names_a_better_k_from_the_store(tmp_path):
    import spectrace.store
    from spectrace.queries import report
    from spectrace.testing import store_pipeline

    writer = store_pipeline(tmp_path, retention_s=0, compact_interval_s=0)
    sums = dict(steps=10, step_ns=10 * 48_000_000, draft_ns=10 * 30_000_000, request_steps=80, tokens=320,
                scheduled_tokens=400, scheduled_tokens_sq=16000, tokens_x_verify_ns=400 * 18e6, requests=80)
    # drafting 30 ms for four positions: k'=1 (1.8 x 12 / 21 ms) pays 1.03x, the k=4 in force 3.0 x 12 / 48 = 0.75x
    _write_run(writer, "costly", "t", k=4, decode=[(8, 4, 10, 10 * 48_000_000, 10 * 30_000_000)], timing=sums)
    cheap = dict(sums, step_ns=10 * 26_000_000, draft_ns=10 * 8_000_000)
    _write_run(writer, "cheap", "t", k=4, decode=[(8, 4, 10, 10 * 26_000_000, 10 * 8_000_000)], timing=cheap)
    _write_run(writer, "plain", "t", decode=[(8, 0, 30, 30 * 12_000_000, 0)])
    writer.flush()
    con = spectrace.store.open(tmp_path)
    text = report.render(con, run_id="costly")
    assert "Findings: 0 error(s), 1 warning(s)" in text
    line = next(x for x in text.splitlines() if "SPECULATION_K_BETTER" in x)
    assert "k = 1 pays 37% more than k = 4 in force: predicted speed-up 1.03x against 0.75x" in line and "(from the store)" in line
    assert "fix: set num_speculative_tokens=1" in text
    assert "SPECULATION_K_BETTER" not in report.render(con, run_id="cheap")  # k'=2 pays 9 % more: inside the margin


def test_the_baseline_views_bands_are_the_drains(tmp_path):
    """speedup_baseline names batch sizes with the CASE rendered from spectrace.bands: the drain's bands."""
    import spectrace.store
    from spectrace.testing import store_pipeline

    sizes = [1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 300]
    writer = store_pipeline(tmp_path, retention_s=0, compact_interval_s=0)
    _write_run(writer, "run", "t", k=4, decode=[(n, 4, 1, 20_000_000, 8_000_000) for n in sizes],
               timing=dict(steps=1, step_ns=1, draft_ns=0, request_steps=1, tokens=1, scheduled_tokens=1,
                           scheduled_tokens_sq=1, tokens_x_verify_ns=1, requests=1))
    _write_run(writer, "plain", "t", decode=[(n, 0, 1, 10_000_000, 0) for n in sizes])
    writer.flush()
    con = spectrace.store.open(tmp_path)
    got = dict(con.execute("SELECT batch_band, steps FROM speedup_baseline WHERE run_id = 'run'").fetchall())
    want: dict[str, int] = {"all": len(sizes)}
    for n in sizes:
        want[acceptance.batch_band(n)] = want.get(acceptance.batch_band(n), 0) + 1
    assert got == want


def test_report_calls_speedups_within_two_percent_of_the_best_a_tie():
    from dataclasses import replace as _replace

    from spectrace.audit.store_judge import StoreVerdicts, k_choice
    from spectrace.queries import report

    def _by_k(rows, bands):  # the report renders what the store judge chose
        return report._by_k(StoreVerdicts([], [], [], {}, rows, bands, *k_choice(rows)))

    # a self-drafter (100 %) whose drafting costs almost what it saves: every k' pays about the same
    base = Baseline(steps=10, plain_ns=10 * 12e6, verify_ns=10 * 18e6, draft_ns=10 * 41e6, baseline_steps=40)
    fit = _cost(None, 30e6, 0.0, 8e6, 8, [40] * 10)
    rows = speedup_by_k([10, 10, 10, 10], 10, fit, extra=0, baseline=base)
    assert best(rows)["k"] == 4 and best(rows)["speedup"] == pytest.approx(60 / 59, abs=1e-4)
    line = next(line for line in _by_k(rows, {}) if line.startswith("  best: "))
    assert line == "  best: k = 4 (1.02x); k' = 0, 1, 2, 3 within 2 % of it: a tie, not advice", line
    clear = speedup_by_k([2, 1, 0, 0], 10, fit, extra=0, baseline=_replace(base, draft_ns=10 * 8e6))
    assert next(line for line in _by_k(clear, {}) if line.startswith("  best: ")) == "  best: no speculation (1.00x)"
    # the best pays 2 % over no speculation: within the model's error, so speculating is not shown to pay
    assert any("not shown to pay" in line for line in _by_k(rows, {}))
    assert not any("not shown to pay" in line for line in _by_k(clear, {}))  # the best is no speculation
    # priced by the run alone (no step without drafts measured): the fit's pick is shown, never as advice
    alone = speedup_by_k([10, 10, 10, 10], 10, fit, extra=0)
    text = _by_k(alone, {})
    assert not any(line.startswith("  best: ") for line in text)
    assert any(line.startswith("  highest by the fit: ") and "not advice" in line for line in text), text


def test_band_sql_is_rendered_from_the_one_definition():
    """The SQL CASE and order list come from spectrace.bands; no view or named query keeps a placeholder or a copy."""
    import duckdb

    import spectrace
    from spectrace import bands
    from spectrace.queries import named
    from spectrace.store.read import derived_views

    con = duckdb.connect()
    sizes = list(range(1, 600))
    got = con.execute(f"SELECT n, {bands.sql_case('n')} FROM unnest(?::INT[]) t(n)", [sizes]).fetchall()
    assert dict(got) == {n: bands.batch_band(n) for n in sizes}
    order = con.execute(f"SELECT list_position({bands.sql_order()}, b) FROM unnest(?) t(b)", [list(bands.BATCH_BANDS)]).fetchall()
    assert [o for (o,) in order] == list(range(2, len(bands.BATCH_BANDS) + 2))
    texts = [sql for _, sql in derived_views()] + [named.load(n) for n in named.names()]
    assert not [t for t in texts if "{{" in t]
    sources = [p.read_text() for p in (Path(spectrace.__file__).parent / "queries").glob("*.sql")]
    sources.append((Path(spectrace.__file__).parent / "store" / "views.sql").read_text())
    assert not [t for t in sources if "'129-256'" in t]  # a band spelled out again
