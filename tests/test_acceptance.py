"""Acceptance arithmetic (pure): buckets, per-position counts, the collapse detector."""

from __future__ import annotations

import numpy as np
import pytest

from spectrace.audit.rules.acceptance import CollapseDetector, context_bucket, position_counts


@pytest.mark.parametrize(
    "context, bucket",
    [(0, "0-512"), (511, "0-512"), (512, "512-1k"), (1023, "512-1k"), (1024, "1k-2k"),
     (4096, "4k-8k"), (16383, "8k-16k"), (16384, "16k+"), (1_000_000, "16k+")],
)
def test_context_buckets_have_inclusive_lower_bounds(context, bucket):
    assert context_bucket(context) == bucket


def test_position_counts_are_prefix_counts():
    drafted = np.array([3, 3, 2, 5])
    accepted = np.array([3, 0, 1, 2])
    d, a = position_counts(drafted, accepted, 5)
    assert d.tolist() == [4, 4, 3, 1, 1]
    assert a.tolist() == [3, 2, 1, 0, 0]


def test_detector_fires_once_per_episode_then_recovers():
    detector = CollapseDetector(threshold=0.1, window=300, min_tokens=100)
    healthy = (np.array([30, 30, 30]), np.array([24, 18, 12]))
    broken = (np.array([30, 30, 30]), np.array([1, 0, 0]))
    events = [detector.observe(*healthy) for _ in range(5)]
    assert events == [None] * 5
    events = [detector.observe(*broken) for _ in range(6)]
    fired = [e for e in events if e]
    assert [e.code for e in fired] == ["ACCEPTANCE_COLLAPSE"]
    assert fired[0].evidence["position_0_rate"] < 0.1
    assert fired[0].evidence["window_drafted_tokens"] <= 300 + 90
    events = [detector.observe(*healthy) for _ in range(6)]
    assert [e.code for e in events if e] == ["ACCEPTANCE_RECOVERED"]


def test_detector_needs_volume_before_judging():
    detector = CollapseDetector(threshold=0.1, window=2000, min_tokens=200)
    assert detector.observe(np.array([50, 50]), np.array([0, 0])) is None  # 100 tokens: too few
    event = detector.observe(np.array([50, 50]), np.array([0, 0]))
    assert event is not None and event.code == "ACCEPTANCE_COLLAPSE"


def test_healthy_eagle_profile_never_fires():
    """Position-0 acceptance 0.6-0.9 with k = 7, long run: no event at default settings."""
    rng = np.random.default_rng(0)
    detector = CollapseDetector()
    for _ in range(500):
        accepted = np.minimum(rng.geometric(0.35, size=64) - 1, 7)
        d, a = position_counts(np.full(64, 7), accepted, 7)
        assert detector.observe(d, a) is None


# -- the shapes of a failing drafter (pure) ------------------------------------------------

from spectrace import audit
from spectrace.audit.rules import acceptance  # noqa: E402


def test_run_boundaries_split_the_fixed_buckets():
    edges = acceptance.range_edges([64, 4096, 0, -1])
    assert acceptance.range_labels(edges)[:3] == ["0-64", "64-512", "512-1k"]
    assert acceptance.range_labels(edges)[-1] == "16k+"
    assert acceptance.range_indices(edges, np.array([63, 64, 600])).tolist() == [0, 1, 2]
    assert acceptance.range_bounds(edges)[1] == (64, 512)


def test_context_cliff_needs_a_healthy_rate_before_and_data_on_both_sides():
    assert acceptance.context_cliff({(0, 64): (200, 190), (64, 512): (300, 30)}, 64).after_rate == 0.1
    assert acceptance.context_cliff({(0, 64): (200, 190), (64, 512): (300, 150)}, 64) is None  # a gentle decline
    assert acceptance.context_cliff({(0, 64): (50, 50), (64, 512): (300, 0)}, 64) is None  # too little before


def test_position_cliff_is_conditional_on_the_previous_position():
    # geometric decay (each position 60 % of the one before) is no cliff
    assert acceptance.position_cliff(np.array([500] * 3), np.array([300, 180, 108])) is None
    assert acceptance.position_cliff(np.array([500] * 4), np.array([400, 380, 3, 0])) == 1


def test_one_token_rows_skip_placeholders_and_single_drafts():
    shapes = acceptance.one_token_rows([[0, 0, 0], [5, 5, 5], [1, 2, 3], [-1, -1, -1], [7]], [0, 3, 1, 0, 0])
    assert (shapes["rows"], shapes["repeated"], shapes["repeated_accepted"]) == (3, 2, 3)
    assert shapes["by_token"] == {0: 1, 5: 1}
    # token 0 repeated and rejected: placeholders; repeated and accepted: a target that repeats itself
    assert acceptance.dummy_drafts(100, 90, 270, 0, {0: 90}) == "placeholder_id"
    assert acceptance.dummy_drafts(100, 90, 270, 270, {0: 90}) is None
    assert acceptance.dummy_drafts(100, 10, 30, 0, {0: 10}) is None
    # one id other than 0 in nearly every row, whatever the request: a drafter that ignores its input
    assert acceptance.dummy_drafts(100, 95, 285, 0, {7: 95}) == "constant"
    assert acceptance.dummy_drafts(100, 80, 240, 0, {7: 80}) is None


def test_a_drafters_repeated_mistake_is_no_placeholder():
    """The trained zoo's EAGLE-3 served right on 400-character prompts (tests/test_trained_detection_live.py,
    SPECTRACE_RECORD_TOKENS=1): 101 of 142 rows one id repeated, 27 of their 303 drafts accepted, the ids its
    predictions (`` |`` 268 in 67 rows, seven others); and the same drafter without its d2t map (its draft ids
    scored as target ids: 127 of 186 rows, none accepted). Neither is a placeholder."""
    trained = {268: 67, 20: 8, 21: 8, 16: 8, 24: 4, 441: 3, 406: 2, 198: 1}
    assert sum(trained.values()) == 101
    assert acceptance.dummy_drafts(142, 101, 303, 27, trained) is None
    no_d2t = {34: 83, 2: 9, 6: 8, 7: 8, 158: 6, 10: 4, 40: 2, 32: 2, 25: 2, 125: 2, 35: 1}
    assert sum(no_d2t.values()) == 127 and acceptance.dummy_drafts(186, 127, 381, 0, no_d2t) is None
    # the old rule (one id repeated in half the rows, rejected) named both
    assert 101 >= 0.5 * 142 and 27 < 0.1 * 303


def test_no_draft_step_time_is_fitted_affine_in_scheduled_tokens():
    # verification takes 5 ms + 0.25 ms per scheduled token; steps of 4 requests x 4 tokens and 2 x 4
    steps = [(16, 4, 9.0), (16, 4, 9.0), (8, 2, 7.0), (8, 2, 7.0)]
    sums = dict(n=4, sum_t=48, sum_t2=640, sum_tv=sum(t * v for t, _, v in steps), sum_v=32.0, sum_r=12)
    # without drafts: 5 + 0.25 * 4 and 5 + 0.25 * 2 ms
    assert acceptance.no_draft_step_ns(**sums) == pytest.approx(2 * 6.0 + 2 * 5.5)
    # one batch shape only: nothing to fit, the verification time itself
    assert acceptance.no_draft_step_ns(n=2, sum_t=32, sum_t2=512, sum_tv=288.0, sum_v=18.0, sum_r=8) == 18.0


def test_speedup_estimate_and_not_paying_detector():
    assert acceptance.speedup_estimate(4.0, 5.0, 20.0) == pytest.approx(1.0)
    assert acceptance.speedup_estimate(1.0, 5.0, 10.0) == pytest.approx(0.5)
    detector = acceptance.PayingDetector(min_steps=50)
    flush = {"steps": 40, "step_ns": 40 * 10_000_000, "draft_ns": 40 * 5_000_000, "scheduled_tokens": 40 * 16,
             "scheduled_tokens_sq": 40 * 256, "tokens_x_verify_ns": 40 * 16 * 5_000_000, "requests": 160,
             "request_steps": 160, "tokens": 160}  # fmt: skip
    assert detector.observe(flush) is None  # too few steps
    evidence = detector.observe(flush)
    assert evidence["speedup_estimate"] == 0.5 and evidence["window_steps"] == 80
    assert evidence["no_draft_ms_per_step"] == 5.0
    assert detector.observe(flush) is None  # once per run
    # the window is the run so far (what report's speculation_cost sums): every step, not the last N
    later = {**flush, "steps": 400, "step_ns": 400 * 10_000_000, "draft_ns": 400 * 5_000_000, "scheduled_tokens": 400 * 16,
             "scheduled_tokens_sq": 400 * 256, "tokens_x_verify_ns": 400 * 16 * 5_000_000, "requests": 1600,
             "request_steps": 1600, "tokens": 6400}  # fmt: skip
    detector.observe(later)
    whole = detector.window()
    assert whole["window_steps"] == 520 and whole["window"] == "the run so far" and whole["basis"] == "fit"
    length = (3 * 160 + 6400) / (3 * 160 + 1600)
    assert whole["speedup_estimate"] == pytest.approx(length * 5.0 / 10.0, abs=1e-4)
    finding = audit.not_paying_finding(evidence)
    assert "over the run's first 80 steps that verified drafts" in finding.message
    assert "fitted from this run, not measured" in finding.message


def test_collapse_names_its_onset_and_recovery():
    detector = CollapseDetector(threshold=0.1, window=300, min_tokens=100)
    mark = acceptance.StepMark
    good = [mark(1, 10, 20, 30, 24, 10, 9)]
    bad = [mark(2, 20, 30, 30, 0, 10, 0), mark(3, 30, 40, 30, 0, 10, 0)]
    assert detector.observe(np.array([40, 40, 40]), np.array([35, 30, 25]), good) is None
    event = detector.observe(np.array([300, 300, 300]), np.array([0, 0, 0]), bad)
    assert event.code == "ACCEPTANCE_COLLAPSE"
    assert (event.evidence["onset_step"], event.evidence["onset_ts_ns"], event.evidence["onset_context_len"]) == (2, 20, 30)
    event = detector.observe(np.array([300, 300, 300]), np.array([290, 280, 270]), [mark(9, 90, 99, 30, 27, 10, 10)])
    assert event.code == "ACCEPTANCE_RECOVERED"
    assert (event.evidence["onset_step"], event.evidence["recovered_step"]) == (2, 9)


def test_position_counts_equal_the_comparison_they_replace():
    rng = np.random.default_rng(3)
    for k in (0, 1, 4, 7):
        drafted = rng.integers(0, k + 3, 500)  # some past k: they count at every position
        accepted = np.minimum(drafted, rng.integers(-1, k + 1, 500))  # and some below 0: at none
        d, a = position_counts(drafted, accepted, k)
        p = np.arange(k)
        assert d.tolist() == (drafted[:, None] > p).sum(axis=0).tolist()
        assert a.tolist() == (accepted[:, None] > p).sum(axis=0).tolist()
        assert d.dtype == a.dtype == np.int64 and len(d) == k


def test_a_fit_whose_intercept_falls_below_zero_goes_through_the_origin():
    """Noisy step times (a loaded host) can fit a slope so steep that a step without drafts would take no time at all
    (the quickstart's run in a loaded suite priced it at 0.00 ms: speed-up 0.00x). A step takes no negative fixed
    time: the fit is the one through the origin, and a step without drafts costs its share of it."""
    from spectrace.audit.rules.acceptance import no_draft_step_ns, verify_fit

    steps = [(4, 1.0e6), (16, 9.0e6), (8, 2.0e6), (12, 7.5e6)]  # (scheduled tokens, verify ns): intercept < 0
    n, t, t2 = len(steps), sum(s for s, _ in steps), sum(s * s for s, _ in steps)
    tv, v = sum(s * ns for s, ns in steps), sum(ns for _, ns in steps)
    spread = n * t2 - t * t
    assert (v - (n * tv - t * v) / spread * t) / n < 0  # the free line's intercept
    a, b = verify_fit(n, t, t2, tv, v)
    assert a == 0.0 and b == tv / t2
    requests = 4.0  # one request a step: one token each without drafts
    assert no_draft_step_ns(n, t, t2, tv, v, requests) == b * requests > 0
    # a line with a positive intercept is left as it was: (4, 3 ms) and (8, 4 ms) are 2 ms + 0.25 ms a token
    a, b = verify_fit(2, 12, 80, 4 * 3e6 + 8 * 4e6, 7e6)
    assert (round(a), round(b)) == (2_000_000, 250_000)
