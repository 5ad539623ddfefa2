"""A probe's arithmetic, pure: per-request acceptance from vLLM's per-request speculative metrics, the pooled rate
with a 95 % interval from the per-request spread, the paired difference between two readings served the same
prompts, and the verdict.

The pooled rate is what vLLM's counters say (accepted / drafted over every request). Its interval is the ratio
estimator's (delta method): se = sqrt(sum((a_i - R d_i)^2) / (n (n - 1))) / mean(d), with Student's t for n - 1
degrees of freedom. Two readings are compared request by request (same prompts, greedy), so the difference's
interval is the paired one: the same residuals, candidate minus served, per prompt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

# two-sided 95 % Student t quantiles by degrees of freedom (1..30); beyond, the normal's
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t95(df: int) -> float:
    if df < 1:
        return math.inf
    return _T95[df - 1] if df <= len(_T95) else 1.96


@dataclass
class Request:
    """One prompt's verification under one reading (vLLM's ``RequestSpecDecodeMetrics.to_dict``)."""

    accepted: int
    drafted: int
    steps: int
    histogram: list[int]  # steps by accepted drafts j = 0..k
    output_tokens: int = 0

    @classmethod
    def from_vllm(cls, metrics: dict[str, Any] | None, output_tokens: int = 0) -> "Request":
        m = metrics or {}
        return cls(int(m.get("num_accepted_draft_tokens", 0)), int(m.get("num_draft_tokens", 0)),
                   int(m.get("num_spec_steps", 0)), list(m.get("acceptance_histogram") or []), output_tokens)


@dataclass
class Summary:
    requests: int
    drafted: int
    accepted: int
    acceptance: float  # pooled: accepted / drafted
    low: float
    high: float
    per_position: list[float]  # share of steps whose i-th draft was accepted
    mean_length: float  # tokens per verification step, the bonus token included
    mean_length_low: float
    mean_length_high: float


def _residual_se(values: Sequence[float]) -> float:
    n = len(values)
    if n < 2:
        return math.inf
    return math.sqrt(sum(v * v for v in values) / (n * (n - 1)))


def _ratio(num: Sequence[float], den: Sequence[float]) -> tuple[float, list[float]]:
    """The pooled ratio and each request's linearised residual (a_i - R d_i) / mean(d)."""
    total = sum(den)
    if total <= 0:
        return 0.0, [0.0] * len(den)
    r = sum(num) / total
    mean = total / len(den)
    return r, [(a - r * d) / mean for a, d in zip(num, den)]


def summarize(requests: Sequence[Request], k: int) -> Summary:
    n = len(requests)
    rate, res = _ratio([r.accepted for r in requests], [r.drafted for r in requests])
    half = t95(n - 1) * _residual_se(res)
    length, lres = _ratio([r.accepted for r in requests], [r.steps for r in requests])
    lhalf = t95(n - 1) * _residual_se(lres)
    steps = sum(r.steps for r in requests)
    per_position = []
    for i in range(k):
        hit = sum(sum(r.histogram[j] for j in range(i + 1, len(r.histogram))) for r in requests)
        per_position.append(hit / steps if steps else 0.0)
    return Summary(n, sum(r.drafted for r in requests), sum(r.accepted for r in requests), rate,
                   max(0.0, rate - half), min(1.0, rate + half), per_position,
                   1 + length, 1 + max(0.0, length - lhalf), 1 + min(float(k), length + lhalf))


def paired_difference(candidate: Sequence[Request], served: Sequence[Request]) -> tuple[float, float]:
    """Candidate's pooled rate minus the served one's, and the half width of its 95 % interval (paired by prompt)."""
    if len(candidate) != len(served) or not candidate:
        return 0.0, math.inf
    rc, ec = _ratio([r.accepted for r in candidate], [r.drafted for r in candidate])
    rs, es = _ratio([r.accepted for r in served], [r.drafted for r in served])
    return rc - rs, t95(len(candidate) - 1) * _residual_se([a - b for a, b in zip(ec, es)])


@dataclass
class Verdict:
    best: str | None  # the candidate that accepts best (None: nothing ran)
    served: str
    beats_served: bool  # the best is another reading and its difference's interval excludes zero
    delta: float | None = None  # best minus served, pooled acceptance
    half_width: float | None = None
    text: str = ""
    deltas: dict[str, tuple[float, float]] = field(default_factory=dict)  # every other ran candidate: (delta, half)


def _pct(x: float) -> str:
    return f"{x:.0%}" if abs(x) >= 0.1 else f"{x:.1%}"


def verdict(results: dict[str, list[Request]], summaries: dict[str, Summary], readings: dict[str, str],
            served: str = "served") -> Verdict:
    """Which reading accepts best, by how much, and whether that beats the served reading beyond the interval.

    ``results`` / ``summaries``: the candidates that ran (by name); ``readings``: each one's verdict phrase."""
    if not summaries:
        return Verdict(None, served, False, text="no candidate ran")
    if served not in summaries:
        best = max(summaries, key=lambda n: summaries[n].acceptance)
        return Verdict(best, served, False, text=f"the served reading did not run; best: {readings[best]} "
                                                 f"({_pct(summaries[best].acceptance)})")
    deltas = {name: paired_difference(results[name], results[served]) for name in results if name != served}
    base = summaries[served].acceptance
    best = max(summaries, key=lambda n: (summaries[n].acceptance, n == served))
    if best == served:
        rival = max(deltas, key=lambda n: deltas[n][0], default=None)
        text = f"no candidate beats the served reading ({_pct(base)})"
        if rival is not None:
            d, h = deltas[rival]
            text += f"; next best: {readings[rival]} ({d * 100:+.1f} points, 95 % interval ±{h * 100:.1f})"
        return Verdict(served, served, False, 0.0, 0.0, text, deltas)
    d, h = deltas[best]
    beats = d - h > 0
    if beats:
        text = (f"{readings[best]} ({_pct(summaries[best].acceptance)} against {_pct(base)} as served, "
                f"{d * 100:+.1f} points, 95 % interval ±{h * 100:.1f})")
    else:
        text = (f"no candidate beats the served reading beyond the interval ({_pct(base)}; best: {readings[best]}, "
                f"{d * 100:+.1f} points, 95 % interval ±{h * 100:.1f})")
    return Verdict(best, served, beats, d, h, text, deltas)
