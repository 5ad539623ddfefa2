"""Acceptance arithmetic (pure): buckets, per-position counts, the collapse detector."""

from __future__ import annotations

import numpy as np
import pytest

from spectrace.acceptance import CollapseDetector, context_bucket, position_counts


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
