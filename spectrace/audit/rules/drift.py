"""Acceptance that changes with time, not with the request: a step change at a moment (a weight reload, a LoRA swap,
a cache reset, a redeploy) and a slow decay (vllm-ascend#10118: acceptance falls to 0 % after a while), each with the
time it began, the requests it spanned, and its recovery. Pure: counts and times in, events out.

The collapse detector (``acceptance.CollapseDetector``) says when acceptance is below an absolute floor; this says
*when* it moved, against the run's own level, however high that level is.

Method. The run's verified drafts are cut into time blocks of about ``block_tokens`` drafted tokens each (whole
flushes; adjacent blocks merged, and the block size doubled, once there are ``max_blocks``, so an hours-long run
keeps a bounded, coarser history). Within a block, counts are kept per *stratum*, a (context range, draft position)
pair: acceptance falls with the position and with the context, so a run whose requests grow longer, or draft
deeper, accepts less for that reason alone. Every comparison is stratified:

- each block's *level* is its accepted tokens over what it would have accepted at the run's pooled rate of each of
  its strata (1.0: the run's usual acceptance for what it drafted);
- the variance of a level counts a request-step's ``k`` drafts as one trial (a rejection ends the step; the same
  rule as ``slices``): ``var = k * sum(n p (1 - p)) / expected^2``;
- the levels are fitted by weighted least squares along the run's progress in drafted tokens (a loaded or idle
  spell stretches the clock, not the shape). A *step* is a jump: flat, then at a block boundary a jump and whatever
  slope after it (acceptance often slides on after a change, as the requests' caches turn over); it is named when
  the best such fit explains at least ``z**2`` (chi-square units) more than flat and its jump is at least
  ``jump_z`` standard errors down and at least half of the whole fall to the end (a small jump that starts a long
  decline is a decay). A *decay* is a decline without a jump: flat, then a straight line down from a
  block boundary (the run's start included), fitted without the newest blocks (a fresh step in them would draw a
  line), named when it explains ``z**2`` more than flat and the best jump fit's jump is under ``wait_z`` standard
  errors or less than half the fall (otherwise a step may be forming: more blocks decide). Either
  needs its level after the change at most ``1 - drop`` of its level before.

Time, not the request. A request that has verify steps on both sides of the change (``carried``) is its own
control: its acceptance before and after is in the evidence. When no request spans the change, the evidence says
the requests' mix is not ruled out (the request slices compare the mix).

Recovery. Once a signature fired, each later block is compared with the stratified rates before its start; two
blocks in a row back at ``1 - drop / 2`` of that level or above are a recovery (``ACCEPTANCE_RESTORED``), and the
detector starts afresh from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

STEP, DECAY, RESTORED = "step", "decay", "restored"

MAX_REQUESTS_PER_BLOCK = 4096  # request ids a block keeps counts for (the carried requests' evidence); more: uncounted


@dataclass
class Block:
    start_ns: int
    end_ns: int
    strata: dict[tuple[str, int], list[int]] = field(default_factory=dict)  # (range, position) -> [drafted, accepted]
    requests: dict[str, list[int]] = field(default_factory=dict)  # request -> [drafted, accepted]
    drafted: int = 0
    accepted: int = 0

    def add(self, ts_ns: int, strata: dict[tuple[str, int], tuple[int, int]], requests: dict[str, tuple[int, int]]) -> None:
        self.end_ns = max(self.end_ns, ts_ns)
        for key, (d, a) in strata.items():
            cell = self.strata.setdefault(key, [0, 0])
            cell[0] += d
            cell[1] += a
            self.drafted += d
            self.accepted += a
        for request, (d, a) in requests.items():
            cell = self.requests.get(request)
            if cell is None:
                if len(self.requests) >= MAX_REQUESTS_PER_BLOCK:
                    continue
                cell = self.requests[request] = [0, 0]
            cell[0] += d
            cell[1] += a

    def strata_total(self) -> list[int]:
        return [self.drafted, self.accepted]

    def merge(self, other: "Block") -> "Block":
        merged = Block(self.start_ns, other.end_ns)
        for block in (self, other):
            merged.add(block.end_ns, {key: tuple(cell) for key, cell in block.strata.items()},
                       {request: tuple(cell) for request, cell in block.requests.items()})
        merged.end_ns = other.end_ns
        return merged


@dataclass
class DriftEvent:
    kind: str  # STEP | DECAY | RESTORED
    evidence: dict[str, Any]


def _pooled(blocks: list[Block]) -> dict[tuple[str, int], float]:
    sums: dict[tuple[str, int], list[int]] = {}
    for block in blocks:
        for key, (d, a) in block.strata.items():
            cell = sums.setdefault(key, [0, 0])
            cell[0] += d
            cell[1] += a
    return {key: a / d for key, (d, a) in sums.items() if d}


def _level(block: Block, rates: dict[tuple[str, int], float], k: int) -> tuple[float, float, float] | None:
    """(level, its variance, expected accepted) of ``block`` against ``rates``; None where nothing is comparable."""
    expected = variance = observed = 0.0
    for key, (d, a) in block.strata.items():
        p = rates.get(key)
        if p is None or not d:
            continue
        expected += d * p
        variance += d * p * (1 - p)
        observed += a
    if expected <= 0:
        return None
    # a block whose strata all accept everything (or nothing) has no binomial spread: a floor of one trial
    variance = max(variance * k, 1.0)
    return observed / expected, variance / expected ** 2, expected


def _flat_sse(y: np.ndarray, w: np.ndarray) -> float:
    """The weighted squared residual of one level through ``y`` (the flat shape every other is compared with)."""
    return float((w * y * y).sum() - (w * y).sum() ** 2 / w.sum())


def _hinge_fits(y: np.ndarray, w: np.ndarray, t: np.ndarray, starts: np.ndarray):
    """``y = c + s * max(0, t - t0)``, weighted, for each t0 in ``starts``: (c, s, sse) per start."""
    x = np.maximum(0.0, t[None, :] - starts[:, None])
    sw, sy, syy = w.sum(), (w * y).sum(), (w * y * y).sum()
    sx, sxx, sxy = x @ w, (x * x) @ w, x @ (w * y)
    det = sw * sxx - sx * sx
    flat = det <= 1e-12 * np.maximum(sw * sxx, 1.0)
    s = np.where(flat, 0.0, (sw * sxy - sx * sy) / np.where(flat, 1.0, det))
    c = (sy - s * sx) / sw
    sse = syy - 2 * c * sy - 2 * s * sxy + c * c * sw + 2 * c * s * sx + s * s * sxx
    return c, s, sse


def _jump_fits(y: np.ndarray, w: np.ndarray, t: np.ndarray, lo: int, hi: int):
    """``y = c + d * [i >= j] + s * max(0, t - b_j)``, weighted, for each j in ``lo .. hi`` (``b_j``: the boundary
    between blocks j - 1 and j): a level, a jump at the boundary, a slope after it. Returns (j, c, d, s, the jump's
    and the slope's standard errors, sse) per j (the weights are inverse variances: the fit's scale is known)."""
    js = np.arange(lo, hi + 1)
    bounds = (t[js - 1] + t[js]) / 2
    index = np.arange(len(y))
    x = np.stack([np.ones((len(js), len(y))), (index[None, :] >= js[:, None]).astype(float),
                  np.maximum(0.0, t[None, :] - bounds[:, None])], axis=2)  # (J, n, 3)
    xw = x * w[None, :, None]
    a = np.einsum("jni,jnk->jik", xw, x)
    b = np.einsum("jni,n->ji", xw, y)
    inverse = np.linalg.pinv(a)
    beta = np.einsum("jik,jk->ji", inverse, b)
    sse = (w * y * y).sum() - np.einsum("ji,ji->j", b, beta)
    return (js, beta[:, 0], beta[:, 1], beta[:, 2], np.sqrt(np.maximum(inverse[:, 1, 1], 0.0)),
            np.sqrt(np.maximum(inverse[:, 2, 2], 0.0)), sse)


def _rate(cells: list[list[int]]) -> float | None:
    d = sum(c[0] for c in cells)
    return round(sum(c[1] for c in cells) / d, 4) if d else None


@dataclass
class DriftDetector:
    """Step changes and slow decays of one run's acceptance in time (module docstring)."""

    block_tokens: int = 200
    max_blocks: int = 48
    min_blocks: int = 6  # closed blocks before anything is judged
    min_side_blocks: int = 2  # blocks on each side of a step, after a decay's start
    z: float = 5.0  # the bar, in standard deviations: a scan over every boundary needs a strict one
    drop: float = 0.3  # the level at the end at most 1 - drop of the level at the start
    jump_z: float = 3.0  # a step's jump, in its standard errors (below it, a decline is a decay)
    wait_z: float = 2.0  # a jump this sure somewhere is a step forming: no decay is named until more blocks decide
    min_carried_tokens: int = 20  # drafted on each side for a request to count as carried across the change
    blocks: list[Block] = field(default_factory=list)
    current: Block | None = None
    fired: DriftEvent | None = None  # the signature in force (until restored)
    _reference: dict[tuple[str, int], float] | None = None  # the stratified rates before the fired signature began
    _good: int = 0  # blocks in a row back at the reference level
    k: int = 1  # the most drafts per request-step seen (the variance's trial size)

    def observe(self, ts_ns: int, strata: dict[tuple[str, int], tuple[int, int]],
                requests: dict[str, tuple[int, int]] | None = None, k: int = 1) -> list[DriftEvent]:
        """One flush of the run's verified drafts: counts per (context range, position), and per request."""
        if not strata or not any(d for d, _ in strata.values()):
            return []
        self.k = max(self.k, int(k))
        if self.current is None:
            self.current = Block(ts_ns, ts_ns)
        self.current.add(ts_ns, strata, requests or {})
        if self.current.drafted < self.block_tokens:
            return []
        closed, self.current = self.current, None
        self.blocks.append(closed)
        if len(self.blocks) >= self.max_blocks:
            self.blocks = [a.merge(b) for a, b in zip(self.blocks[::2], self.blocks[1::2])] + (
                [self.blocks[-1]] if len(self.blocks) % 2 else [])
            self.block_tokens *= 2
        if self.fired is not None:
            return self._recovery(closed)
        event = self.judge()
        if event is not None:
            self.fired = event
        return [event] if event is not None else []

    # -- the fit --------------------------------------------------------------------------

    def judge(self) -> DriftEvent | None:
        """The signature the closed blocks show now, or None."""
        blocks = self.blocks
        if len(blocks) < self.min_blocks:
            return None
        rates = _pooled(blocks)
        levels = [_level(b, rates, self.k) for b in blocks]
        if any(level is None for level in levels):
            return None
        y = np.array([level[0] for level in levels])
        w = 1.0 / np.array([level[1] for level in levels])
        # the fits' axis is the run's progress, in drafted tokens (a block's middle), not the clock: a loaded or idle
        # spell stretches the clock, never the shape; the evidence gives the clock's times
        drafted = np.array([b.drafted for b in blocks], dtype=float)
        t = (np.cumsum(drafted) - drafted / 2) / 1000.0
        n = len(blocks)
        sse_flat = _flat_sse(y, w)
        lo, hi = self.min_side_blocks, n - self.min_side_blocks
        if hi < lo:
            return None
        bar = self.z ** 2
        # a step is a jump in the level (then whatever slope): the best break, and whether its jump is real
        js, c, d, slope, se, se_slope, sse = _jump_fits(y, w, t, lo, hi)
        at = int(np.argmin(sse))
        step_gain = sse_flat - float(sse[at])
        jump = float(d[at] / se[at]) if se[at] > 0 else 0.0  # the best break's jump, in standard errors
        j = int(js[at])
        # ... and its share of the whole fall to the end: a step is mostly the jump (a decline that a small jump
        # starts is a decay); a slope after it that its own error does not tell from flat is no fall
        falling = slope[at] < 0 and slope[at] <= -2 * se_slope[at]
        end = c[at] + d[at] + (float(slope[at]) if falling else 0.0) * (float(t[-1]) - (t[j - 1] + t[j]) / 2)
        share = float(-d[at] / (c[at] - end)) if c[at] > end else 0.0
        jumped = jump <= -self.jump_z and share >= 0.5
        if step_gain >= bar and jumped and c[at] > 0 and c[at] + d[at] <= (1 - self.drop) * c[at]:
            return DriftEvent(STEP, self._evidence(j, STEP, {
                "before_level": round(float(c[at]), 4), "after_level": round(float(c[at] + d[at]), 4),
                "end_level": round(max(float(end), 0.0), 4), "jump_z": round(jump, 1), "jump_share": round(share, 2),
                "chi2_gain": round(step_gain, 1)}))
        # a decay is a decline without a jump: flat, then a straight line down from a block boundary (the run's start
        # included), at least min_side_blocks before the end. It is fitted without the newest min_side_blocks blocks:
        # a decline the older blocks show already, not one that a step in the newest (not yet a step: too few blocks
        # after it) draws through them
        m = n - self.min_side_blocks
        if m < self.min_blocks:
            return None
        yo, wo, to = y[:m], w[:m], t[:m]
        flat_o = _flat_sse(yo, wo)
        starts = np.concatenate(([to[0]], (to[:m - self.min_side_blocks - 1] + to[1:m - self.min_side_blocks]) / 2))
        c, slope, sse = _hinge_fits(yo, wo, to, starts)
        sse = np.where(slope < 0, sse, np.inf)
        if not np.isfinite(sse).any():
            return None
        at = int(np.argmin(sse))
        decay_gain = flat_o - float(sse[at])
        if decay_gain < bar or (jump <= -self.wait_z and share >= 0.5):
            # not enough, or the best break's jump nearly real: a step forming, not a decay (more blocks decide)
            return None
        c, s, start, j = float(c[at]), float(slope[at]), float(starts[at]), at
        end = c + s * (float(to[-1]) - start)
        if c <= 0 or end > (1 - self.drop) * c:
            return None
        span_h = max(blocks[-1].end_ns - blocks[j].start_ns, 1) / 3.6e12
        return DriftEvent(DECAY, self._evidence(j, DECAY, {
            "start_level": round(c, 4), "end_level": round(max(end, 0.0), 4), "slope_per_1k_drafted": round(s, 6),
            "slope_per_hour": round((max(end, 0.0) - c) / span_h, 4), "chi2_gain": round(decay_gain, 1)}))

    def _evidence(self, j: int, kind: str, fit: dict[str, Any]) -> dict[str, Any]:
        """What a signature beginning at block ``j`` says: when, the rates around it, the requests it spanned."""
        blocks = self.blocks
        before_blocks, after_blocks = blocks[:j], blocks[j:]
        self._reference = _pooled(before_blocks) if before_blocks else _pooled(blocks[:1])
        self._good = 0
        before_requests: dict[str, list[int]] = {}
        after_requests: dict[str, list[int]] = {}
        for side, group in ((before_requests, before_blocks), (after_requests, after_blocks)):
            for block in group:
                for request, (d, a) in block.requests.items():
                    cell = side.setdefault(request, [0, 0])
                    cell[0] += d
                    cell[1] += a
        carried = sorted(r for r in set(before_requests) & set(after_requests)
                         if before_requests[r][0] >= self.min_carried_tokens
                         and after_requests[r][0] >= self.min_carried_tokens)
        onset = blocks[j] if j < len(blocks) else blocks[-1]
        evidence: dict[str, Any] = {
            "signature": kind,
            "onset_ts_ns": onset.start_ns,
            "onset_after_ts_ns": blocks[j - 1].end_ns if j > 0 else onset.start_ns,  # the change lies between these
            "rate_before": _rate([b.strata_total() for b in before_blocks]) if before_blocks else None,
            "rate_after": _rate([b.strata_total() for b in after_blocks]),
            "drafted_before": sum(b.drafted for b in before_blocks),
            "drafted_after": sum(b.drafted for b in after_blocks),
            "blocks": len(blocks),
            "requests_after": len(after_requests),
            "carried_requests": len(carried),
            "carried_rate_before": _rate([before_requests[r] for r in carried]) if carried else None,
            "carried_rate_after": _rate([after_requests[r] for r in carried]) if carried else None,
            "z": self.z,
            **fit,
        }
        return evidence

    def _recovery(self, block: Block) -> list[DriftEvent]:
        level = _level(block, self._reference or {}, self.k)
        if level is None:
            return []
        self._good = self._good + 1 if level[0] >= 1 - self.drop / 2 else 0
        if self._good < 2:
            return []
        fired, self.fired = self.fired, None
        event = DriftEvent(RESTORED, {
            "signature": fired.evidence["signature"],
            "onset_ts_ns": fired.evidence["onset_ts_ns"],
            "recovered_ts_ns": self.blocks[-2].start_ns if len(self.blocks) >= 2 else block.start_ns,
            "level": round(level[0], 4),
            "rate_now": _rate([block.strata_total()]),
            "rate_before": fired.evidence.get("rate_before"),
        })
        self.blocks = self.blocks[-2:]  # afresh from the recovery
        self._reference = None
        return [event]
