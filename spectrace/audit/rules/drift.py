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
  spell stretches the clock, not the shape). Three shapes are fitted besides flat:
  - a *line*: flat, then a straight decline from a block boundary (the run's start included);
  - a *step with a slide*: flat, then at a block boundary a jump and whatever slope after it (acceptance often
    slides on after a change, as the requests' caches turn over);
  - a *plain step*: flat, a jump, flat, the change at a block boundary or inside a block. A change inside a block
    leaves that block with both levels; it is left out of the fit (its own level), or else the slope above takes it
    and the noise after it for a slide, and a step reads as a line.
- a *step* is named when a step fit explains at least ``z**2`` (chi-square units) more than flat, its jump is at
  least ``jump_z`` standard errors down (with a slide: and at least half of the whole fall to the end; a small jump
  that starts a long decline is a decay), and it fits better than the line by ``prefer``;
- a *decay* is a decline without a jump: the line, through at least ``min_decline_blocks`` blocks and fitted
  without the newest ``min_side_blocks`` (a fresh step in them would draw a line), explains ``z**2`` more than
  flat, the slide fit's jump is under ``wait_z`` standard errors or less than half the fall, and a plain step fits
  no better, on those blocks (within ``prefer``) or on all of them. Otherwise a step may be forming: more blocks
  decide;
- either needs its level after the change at most ``1 - drop`` of its level before.

Measured on simulated runs (tests/test_drift.py's binomial flushes; 80 seeds, each at 24 to 72 and at 96 to 288
request-steps a flush: 160 runs per shape). Before the plain step was fitted, a step to 55 % of the level was read
as a decay in 17 of 160 runs, one to 30 % in 19, one with a slide after it in 44; now in 4, 2 and 6. Three decays
(the level falling by 1/8000, 1/5000 and 1/12000 of itself per drafted token) were read as steps or missed in 4, 5
and 5 runs before, and in 5, 2 and 8 now (4 of those 8 named nothing within the run).

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


def _best_line(y: np.ndarray, w: np.ndarray, t: np.ndarray, last: int):
    """The best falling ``_hinge_fits`` line, its start at the run's start or at the boundary before block j for j in
    ``1 .. last``: (j, c, s, start, sse), or None where no line falls."""
    last = max(min(last, len(y) - 1), 0)
    starts = np.concatenate(([t[0]], (t[:last] + t[1:last + 1]) / 2))
    c, s, sse = _hinge_fits(y, w, t, starts)
    sse = np.where(s < 0, sse, np.inf)
    if not np.isfinite(sse).any():
        return None
    at = int(np.argmin(sse))
    return at, float(c[at]), float(s[at]), float(starts[at]), float(sse[at])


def _best_plateau(y: np.ndarray, w: np.ndarray, lo: int, hi: int) -> dict[str, Any] | None:
    """The best plain step ``y = before`` up to block j, ``after`` from it, for j in ``lo .. hi``; or with block j
    left out (``within``: the change lies inside it, so it holds both levels; j < hi, as many blocks after it).
    Weighted means, the jump in its standard errors, and the weighted squared residual (the block left out fits
    itself: its own level)."""
    best = None
    for j in range(lo, hi + 1):
        for within in (False, True) if j < hi else (False,):
            wb, wa = w[:j], w[j + within:]
            yb, ya = y[:j], y[j + within:]
            sb, sa = float(wb.sum()), float(wa.sum())
            if sb <= 0 or sa <= 0:
                continue
            before, after = float((wb * yb).sum() / sb), float((wa * ya).sum() / sa)
            sse = float((wb * (yb - before) ** 2).sum() + (wa * (ya - after) ** 2).sum())
            if best is None or sse < best["sse"]:
                best = {"j": j, "within": within, "before": before, "after": after, "sse": sse,
                        "jump": (after - before) / float(np.sqrt(1 / sb + 1 / sa))}
    return best


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
    prefer: float = 4.0  # chi-square units a step must fit better than the line (and a decay's line nearly as well)
    min_decline_blocks: int = 8  # a decay's line runs through this many blocks at least (fewer: a mixed block and
    # the first blocks after a step draw the same line)
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
        # the line: flat, then a straight decline from a block boundary with at least min_side_blocks + 1 blocks
        # after it, over every block (what a step is told from)
        line = _best_line(y, w, t, n - self.min_side_blocks - 1)
        line_sse = line[4] if line is not None else float("inf")
        # a step with a slide after it: the best break, and whether its jump is real ...
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
        if (step_gain >= bar and jump <= -self.jump_z and share >= 0.5 and c[at] > 0
                and c[at] + d[at] <= (1 - self.drop) * c[at] and float(sse[at]) + self.prefer < line_sse):
            return DriftEvent(STEP, self._evidence(j, STEP, {
                "before_level": round(float(c[at]), 4), "after_level": round(float(c[at] + d[at]), 4),
                "end_level": round(max(float(end), 0.0), 4), "jump_z": round(jump, 1), "jump_share": round(share, 2),
                "chi2_gain": round(step_gain, 1)}))
        # a plain step: flat, a jump, flat; the change at a block boundary or inside a block (a block that holds both
        # levels, left out of the fit). The slope above can take a mixed block and the noise after it for a slide
        plateau = _best_plateau(y, w, lo, hi)
        if plateau is None:
            return None
        p_gain = sse_flat - plateau["sse"]
        p_before, p_after = plateau["before"], plateau["after"]
        if (p_gain >= bar and plateau["jump"] <= -self.jump_z and p_before > 0 and p_after <= (1 - self.drop) * p_before
                and plateau["sse"] + self.prefer < line_sse):
            return DriftEvent(STEP, self._evidence(plateau["j"], STEP, {
                "before_level": round(p_before, 4), "after_level": round(p_after, 4),
                "end_level": round(max(p_after, 0.0), 4), "jump_z": round(plateau["jump"], 1), "jump_share": 1.0,
                "chi2_gain": round(p_gain, 1)}, within=plateau["within"]))
        # a decay is a decline without a jump: flat, then a straight line down from a block boundary (the run's start
        # included) through at least min_decline_blocks blocks. It is fitted without the newest min_side_blocks
        # blocks: a decline the older blocks show already, not one that a step in the newest (not yet a step: too
        # few blocks after it) draws through them
        m = n - self.min_side_blocks
        if m < self.min_blocks:
            return None
        yo, wo, to = y[:m], w[:m], t[:m]
        old_line = _best_line(yo, wo, to, m - self.min_decline_blocks)
        if old_line is None:
            return None
        j, c, s, start, sse_line = old_line
        decay_gain = _flat_sse(yo, wo) - sse_line
        if decay_gain < bar or (jump <= -self.wait_z and share >= 0.5):
            # not enough, or the best break's jump nearly real: a step forming, not a decay (more blocks decide)
            return None
        # the line must fit as well as a plain step: on the older blocks (within ``prefer``), and on every block
        old_plateau = _best_plateau(yo, wo, self.min_side_blocks, m - self.min_side_blocks)
        if old_plateau is not None and old_plateau["sse"] + self.prefer < sse_line:
            return None
        if line_sse > plateau["sse"]:
            return None
        end = c + s * (float(to[-1]) - start)
        if c <= 0 or end > (1 - self.drop) * c:
            return None
        span_h = max(blocks[-1].end_ns - blocks[j].start_ns, 1) / 3.6e12
        return DriftEvent(DECAY, self._evidence(j, DECAY, {
            "start_level": round(c, 4), "end_level": round(max(end, 0.0), 4), "slope_per_1k_drafted": round(s, 6),
            "slope_per_hour": round((max(end, 0.0) - c) / span_h, 4), "chi2_gain": round(decay_gain, 1)}))

    def _evidence(self, j: int, kind: str, fit: dict[str, Any], within: bool = False) -> dict[str, Any]:
        """What a signature beginning at block ``j`` says: when, the rates around it, the requests it spanned (a
        change ``within`` block j lies inside it: the block's end is the onset, the end of the block before it the last
        moment before, as for a change at the boundary)."""
        blocks = self.blocks
        # a block the change falls inside holds both levels: in neither side's rates (nor its requests')
        before_blocks, after_blocks = blocks[:j], blocks[j + 1:] if within and j + 1 < len(blocks) else blocks[j:]
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
            "onset_ts_ns": onset.end_ns if within else onset.start_ns,
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
