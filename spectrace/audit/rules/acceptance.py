"""Acceptance arithmetic: context buckets, per-position counts, collapse detection.

Pure functions and small classes over plain numbers; the live aggregator
(``spectrace.recorder.verify``) and the tests use them alike.

Per request-step, ``d`` drafted and ``a`` accepted tokens (greedy verification
accepts a prefix): positions ``0..d-1`` were drafted, positions ``0..a-1``
accepted. The rate at position ``p`` is accepted[p] / drafted[p].
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from spectrace.audit import codes
from spectrace.audit.rules.speedup_figure import SPEEDUP_BASIS, SPEEDUP_WINDOW
from spectrace.bands import BATCH_BANDS, band_bounds, band_order, batch_band  # noqa: F401 (the drain, report, speedup)

CONTEXT_BUCKETS = ("0-512", "512-1k", "1k-2k", "2k-4k", "4k-8k", "8k-16k", "16k+")
_EDGES = np.array([512, 1024, 2048, 4096, 8192, 16384])


def context_bucket(context_len: int) -> str:
    """Bucket label of a context length (lower bound inclusive)."""
    return CONTEXT_BUCKETS[int(np.searchsorted(_EDGES, context_len, side="right"))]


def position_counts(drafted: np.ndarray, accepted: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-position drafted and accepted totals for arrays of request-steps: at position p, the request-steps
    that drafted (accepted) more than p tokens -- a histogram of the counts (``bincount``), summed from the top."""
    return _above(drafted, k), _above(accepted, k)


def _above(counts: np.ndarray, k: int) -> np.ndarray:
    """For p in 0..k-1: how many of ``counts`` exceed p."""
    histogram = np.bincount(np.clip(np.asarray(counts, dtype=np.int64), 0, k), minlength=k + 1)
    return np.cumsum(histogram[::-1])[::-1][1:].astype(np.int64)


@dataclass
class CollapseEvent:
    code: str  # ACCEPTANCE_COLLAPSE | ACCEPTANCE_RECOVERED
    evidence: dict[str, Any]


@dataclass
class CollapseDetector:
    """Acceptance over the last ``window`` drafted tokens, per position.

    Fires ``ACCEPTANCE_COLLAPSE`` once when position-0 or overall acceptance falls
    below ``threshold`` (with at least ``min_tokens`` drafted in the window), then
    ``ACCEPTANCE_RECOVERED`` once both are back above it.
    """

    threshold: float = 0.1
    window: int = 2000
    min_tokens: int = 200
    collapsed: bool = False
    _chunks: deque = field(default_factory=deque)
    _drafted_total: int = 0
    _onset: dict[str, Any] | None = None  # first step of the current stretch below the threshold
    _collapsed_at: dict[str, Any] | None = None

    def _mark(self, steps: "list[StepMark] | None") -> None:
        """Follow, step by step, where the current stretch of low acceptance began."""
        for mark in steps or ():
            if not mark.drafted:
                continue
            low = (mark.pos0_accepted < self.threshold * mark.pos0_drafted) or (mark.accepted < self.threshold * mark.drafted)
            if low and self._onset is None:
                self._onset = {"step": mark.step, "ts_ns": mark.ts_ns, "context_len": mark.context_len}
            elif not low and not self.collapsed:
                self._onset = None

    def observe(
        self, drafted_at: np.ndarray, accepted_at: np.ndarray, steps: "list[StepMark] | None" = None
    ) -> CollapseEvent | None:
        """One flush's per-position counts; ``steps`` (optional) the same flush step by step,
        so a collapse names the step, time and context where it began."""
        drafted_at = np.asarray(drafted_at, dtype=np.int64)
        accepted_at = np.asarray(accepted_at, dtype=np.int64)
        if drafted_at.sum() == 0:
            return None
        self._mark(steps)
        self._chunks.append((drafted_at, accepted_at))
        self._drafted_total += int(drafted_at.sum())
        while len(self._chunks) > 1 and self._drafted_total - int(self._chunks[0][0].sum()) >= self.window:
            self._drafted_total -= int(self._chunks.popleft()[0].sum())
        k = max(len(c[0]) for c in self._chunks)
        drafted = np.zeros(k, dtype=np.int64)
        accepted = np.zeros(k, dtype=np.int64)
        for d, a in self._chunks:
            drafted[: len(d)] += d
            accepted[: len(a)] += a
        total = int(drafted.sum())
        if total < self.min_tokens:
            return None
        pos0 = accepted[0] / drafted[0] if drafted[0] else 1.0
        overall = accepted.sum() / total
        rates = [round(float(a / d), 4) if d else None for a, d in zip(accepted, drafted)]
        evidence = {
            "window_drafted_tokens": total,
            "position_0_rate": round(float(pos0), 4),
            "overall_rate": round(float(overall), 4),
            "rates_by_position": rates,
            "threshold": self.threshold,
        }
        low = pos0 < self.threshold or overall < self.threshold
        if low and not self.collapsed:
            self.collapsed = True
            onset = self._onset or {}
            evidence.update({f"onset_{k}": v for k, v in onset.items()})
            self._collapsed_at = onset
            return CollapseEvent(codes.ACCEPTANCE_COLLAPSE, evidence)
        if not low and self.collapsed:
            self.collapsed = False
            last = steps[-1] if steps else None
            evidence.update({f"onset_{k}": v for k, v in (self._collapsed_at or {}).items()})
            if last is not None:
                evidence.update(recovered_step=last.step, recovered_ts_ns=last.ts_ns, recovered_context_len=last.context_len)
            self._onset = None
            return CollapseEvent(codes.ACCEPTANCE_RECOVERED, evidence)
        return None


@dataclass
class StepMark:
    """One engine step's totals over its request-steps (what the collapse onset needs)."""

    step: int
    ts_ns: int
    context_len: int  # the longest context in the step
    drafted: int
    accepted: int
    pos0_drafted: int
    pos0_accepted: int
    k: int = 0  # the most drafts one request got in the step


# -- per-run context ranges: the fixed buckets split at the run's own boundaries ------------


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def range_edges(boundaries: "list[int] | tuple[int, ...]" = ()) -> np.ndarray:
    """The fixed bucket edges plus a run's boundaries (windows, context lengths)."""
    extra = {int(b) for b in boundaries if isinstance(b, int) and b > 0}
    return np.array(sorted(set(int(e) for e in _EDGES) | extra), dtype=np.int64)


def range_labels(edges: np.ndarray) -> list[str]:
    """Labels of the ranges ``edges`` make: ``0-64``, ``64-512``, ``512-1k``, ..., ``16k+``."""
    lows = [0, *[int(e) for e in edges]]
    return [f"{_tokens(lo)}-{_tokens(hi)}" for lo, hi in zip(lows, edges)] + [f"{_tokens(lows[-1])}+"]


def range_bounds(edges: np.ndarray) -> list[tuple[int, int | None]]:
    """(low, high) of each range ``edges`` make (high None: open)."""
    lows = [0, *[int(e) for e in edges]]
    return [(lo, int(hi)) for lo, hi in zip(lows, edges)] + [(lows[-1], None)]


def range_indices(edges: np.ndarray, context_lens: np.ndarray) -> np.ndarray:
    return np.searchsorted(edges, context_lens, side="right")


# -- the shapes of a failing drafter ---------------------------------------------------------


@dataclass
class Cliff:
    """Acceptance before and after a context boundary."""

    boundary: int
    before_drafted: int
    before_accepted: int
    after_drafted: int
    after_accepted: int

    @property
    def before_rate(self) -> float:
        return self.before_accepted / self.before_drafted if self.before_drafted else 0.0

    @property
    def after_rate(self) -> float:
        return self.after_accepted / self.after_drafted if self.after_drafted else 0.0


def context_cliff(
    by_range: dict[tuple[int, int | None], tuple[int, int]],
    boundary: int,
    *,
    min_tokens: int = 100,
    healthy: float = 0.2,
    ratio: float = 0.5,
) -> Cliff | None:
    """A cliff at ``boundary``: acceptance past it well below acceptance before it.

    ``by_range`` maps a context range (low, high) to (drafted, accepted) summed over
    positions. Ranges wholly below the boundary are "before", ranges from it on
    "after". A cliff needs ``min_tokens`` drafted on each side, a healthy rate before
    (``>= healthy``) and a rate after below ``ratio`` times it.
    """
    before_d = before_a = after_d = after_a = 0
    for (low, high), (drafted, accepted) in by_range.items():
        if high is not None and high <= boundary:
            before_d += drafted
            before_a += accepted
        elif low >= boundary:
            after_d += drafted
            after_a += accepted
    cliff = Cliff(boundary, before_d, before_a, after_d, after_a)
    if before_d < min_tokens or after_d < min_tokens:
        return None
    if cliff.before_rate < healthy or cliff.after_rate >= ratio * cliff.before_rate:
        return None
    return cliff


def position_cliff(
    drafted_at: np.ndarray, accepted_at: np.ndarray, *, min_tokens: int = 100, healthy: float = 0.2, near_zero: float = 0.05
) -> int | None:
    """The first position ``i`` whose acceptance is healthy while ``i + 1`` accepts almost
    nothing of what ``i`` accepted (conditional rate ``accepted[i+1] / accepted[i]``).

    Greedy verification accepts a prefix, so position ``i + 1`` can only be accepted
    where ``i`` was; the conditional rate separates a cliff from a gentle decay.
    """
    drafted_at = np.asarray(drafted_at, dtype=np.int64)
    accepted_at = np.asarray(accepted_at, dtype=np.int64)
    for i in range(len(drafted_at) - 1):
        if drafted_at[i] < min_tokens or drafted_at[i + 1] < min_tokens or accepted_at[i] < min_tokens // 4:
            continue
        if accepted_at[i] / drafted_at[i] < healthy:
            continue
        if accepted_at[i + 1] / accepted_at[i] < near_zero:
            return i
    return None


def one_token_rows(draft_rows: "list[list[int]]", accepted=None) -> dict[str, Any]:
    """:func:`repeated_rows` over draft rows as lists (joined first)."""
    lengths = np.fromiter(map(len, draft_rows), np.int64, len(draft_rows))
    tokens = np.fromiter(chain.from_iterable(draft_rows), np.int64, int(lengths.sum()))
    return repeated_rows(tokens, np.cumsum(lengths) - lengths, lengths, accepted)


def repeated_rows(tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray, accepted=None) -> dict[str, Any]:
    """How many draft rows (of two or more drafts) are one token id repeated; row i is
    ``tokens[starts[i]:starts[i] + lengths[i]]``.

    Returns ``rows``, ``repeated`` (rows all one id), ``repeated_drafted`` and
    ``repeated_accepted`` (tokens in those rows; ``accepted``: accepted count per row)
    and ``by_token`` (repeated rows per id). Placeholder ids (negative: vLLM's async
    scheduling sends -1) are no drafts and are skipped; single drafts say nothing.
    Counted with NumPy over each row's first and last id, then over the ids of the rows whose last id is their
    first.
    """
    out: dict[str, Any] = {"rows": 0, "repeated": 0, "repeated_drafted": 0, "repeated_accepted": 0, "by_token": {}}
    n = len(lengths)
    if not n:
        return out
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    accepted = np.zeros(n, np.int64) if accepted is None else np.asarray(accepted, dtype=np.int64)
    wide = lengths >= 2
    if not wide.any():
        return out
    if not wide.all():
        starts, lengths, accepted = starts[wide], lengths[wide], accepted[wide]
    # each row's first and last id; only a row whose last id is its first can be one id repeated, and only those
    # rows' ids are compared with their first
    first = tokens[starts]
    same_as_first = first == tokens[starts + lengths - 1]
    if same_as_first.any():
        at = np.flatnonzero(same_as_first)
        widths = lengths[at]
        offsets = np.cumsum(widths) - widths
        # the ids of those rows, one flat index each: the row's start plus the id's place in its row
        index = np.repeat(starts[at] - offsets, widths) + np.arange(int(widths.sum()))
        same_as_first[at] = np.logical_and.reduceat(tokens[index] == np.repeat(first[at], widths), offsets)
    drafts = first >= 0
    same = drafts & same_as_first
    repeated = int(same.sum())
    out["rows"] = int(drafts.sum())
    out["repeated"] = repeated
    out["repeated_drafted"] = int(lengths[same].sum())
    out["repeated_accepted"] = int(accepted[same].sum())
    tokens_at, counts = np.unique(first[same], return_counts=True)
    out["by_token"] = dict(zip(tokens_at.tolist(), counts.tolist()))
    return out


# Token ids a drafter emits regardless of its input: vLLM's length gate sends token 0 for a whole batch
# (``GPUModelRunner._input_fits_in_drafter``), and constant logits (a zeroed final norm or head, weights never
# loaded) argmax to id 0. Any other id is a prediction unless one id fills nearly every row (``constant_share``).
PLACEHOLDER_IDS = (0,)


def dummy_drafts(rows: int, repeated: int, repeated_drafted: int, repeated_accepted: int, by_token: dict[int, int], *,
                 min_rows: int = 50, share: float = 0.5, constant_share: float = 0.9, max_rate: float = 0.1) -> str | None:
    """Placeholder drafts, rejected: why they are placeholders (``"placeholder_id"``, ``"constant"``), or None.

    - ``placeholder_id``: at least ``share`` of the rows repeat a :data:`PLACEHOLDER_IDS` id at every position;
    - ``constant``: at least ``constant_share`` of the rows repeat one and the same id, whatever the request or
      its context: drafts that never vary with the input.

    A real drafter also repeats its mistakes (a trained EAGLE-3 drafting `` | | |`` in 67 of 142 rows, seven other
    ids in 34 more, on prompts past its training length): one id repeated within a row is a prediction unless it is
    a placeholder id or the same in nearly every row. A drafter that follows a target which really repeats a token
    drafts one id too, and those drafts are accepted: the repeated rows' acceptance tells them apart
    (``max_rate``)."""
    if rows < min_rows or repeated < share * rows or repeated_accepted >= max_rate * max(repeated_drafted, 1):
        return None
    if sum(by_token.get(t, 0) for t in PLACEHOLDER_IDS) >= share * rows:
        return "placeholder_id"
    if by_token and max(by_token.values()) >= constant_share * rows:
        return "constant"
    return None


# -- does speculation pay? -------------------------------------------------------------------


def verify_fit(n: float, sum_t: float, sum_t2: float, sum_tv: float, sum_v: float) -> tuple[float, float]:
    """``(a, b)``: a step's verification time as ``a + b * scheduled tokens``, least squares over ``n``
    steps from their sums (``sum_t`` tokens, ``sum_t2`` tokens squared, ``sum_tv`` tokens × time, ``sum_v``
    time). Without spread in the token counts, or with a negative slope, ``b = 0`` (``a``: the mean time). A step
    takes no negative fixed time: where the line's intercept falls below 0 (noisy step times on a loaded host fit a
    slope too steep), the fit is the one through the origin (``a = 0``, ``b = sum_tv / sum_t2``), so a step
    without drafts is never priced at nothing."""
    spread = n * sum_t2 - sum_t * sum_t
    b = 0.0
    if spread > 1e-9 * max(n * sum_t2, 1.0):
        b = max((n * sum_tv - sum_t * sum_v) / spread, 0.0)
    if sum_v - b * sum_t < 0 and sum_t2 > 0:
        return 0.0, sum_tv / sum_t2
    return (sum_v - b * sum_t) / n, b


def no_draft_step_ns(n: int, sum_t: float, sum_t2: float, sum_tv: float, sum_v: float, sum_r: float) -> float:
    """Host time the same ``n`` steps would take without drafts (total ns).

    A step's verification time (its whole time minus drafting) is fitted as affine in
    the tokens it scheduled (:func:`verify_fit`); without drafts each step schedules one
    token per request, so it would take ``a + b * requests`` (``sum_r``: requests summed
    over the steps). Without spread in the token counts (or a negative slope) there is
    nothing to fit: the verification time itself is taken.
    """
    if n <= 0:
        return 0.0
    a, b = verify_fit(n, sum_t, sum_t2, sum_tv, sum_v)
    if b == 0.0:
        return float(sum_v)
    return max(n * a + b * sum_r, 0.0)


def speedup_estimate(mean_acceptance_length: float, no_draft_ns: float, step_ns: float) -> float | None:
    """Speed-up over decoding without drafts: ``L * no_draft / step`` (:data:`SPEEDUP_DEFINITION`).

    The steps took ``step_ns`` and yielded ``L`` (``mean_acceptance_length``) tokens per
    request each; the same steps without drafts (:func:`no_draft_step_ns`) would take
    ``no_draft_ns`` and yield one token per request, so ``L`` times as many are needed.
    """
    if step_ns <= 0 or mean_acceptance_length <= 0:
        return None
    return mean_acceptance_length * no_draft_ns / step_ns


@dataclass
class PayingDetector:
    """The speed-up (:data:`SPEEDUP_DEFINITION`) over the run so far (:data:`SPEEDUP_WINDOW`: every step of one worker
    rank that verified drafts, the sums ``spectrace report`` reads from ``speculation_cost``), and
    ``SPECULATION_NOT_PAYING`` once it is below 1 with at least ``min_steps`` steps in it.

    One window for every surface (issue #57): the report's whole run, the finding's, ``top``'s and the gauge's are the
    same sums, so on a finished run they print the same number; the finding says how many steps it had seen."""

    min_steps: int = 50
    flagged: bool = False
    _sums: dict = field(default_factory=dict)

    def observe(self, totals: dict[str, float]) -> dict[str, Any] | None:
        """One flush's sums over worker steps with drafts: ``steps``, ``step_ns``, ``draft_ns``,
        ``scheduled_tokens``, ``scheduled_tokens_sq``, ``tokens_x_verify_ns``, ``requests`` and
        the ``request_steps`` and ``tokens`` (accepted + 1 each) they yielded."""
        if totals.get("steps", 0) <= 0:
            return None
        for key, value in totals.items():
            self._sums[key] = self._sums.get(key, 0) + value
        evidence = self.window()
        if evidence is None or evidence["window_steps"] < self.min_steps or evidence["speedup_estimate"] >= 1.0 or self.flagged:
            return None
        self.flagged = True
        return evidence

    def window(self) -> dict[str, Any] | None:
        """The estimate over the run so far (None before any step yielded a token)."""
        s = self._sums
        if not s or not s.get("request_steps") or not s.get("step_ns"):
            return None
        length = s["tokens"] / s["request_steps"]
        no_draft = no_draft_step_ns(s["steps"], s["scheduled_tokens"], s["scheduled_tokens_sq"], s["tokens_x_verify_ns"],
                                    s["step_ns"] - s["draft_ns"], s["requests"])  # fmt: skip
        estimate = speedup_estimate(length, no_draft, s["step_ns"])
        n = s["steps"]
        return {
            "window_steps": n,
            "window": SPEEDUP_WINDOW,
            "basis": SPEEDUP_BASIS,
            "mean_acceptance_length": round(length, 4),
            "draft_ms_per_step": round(s["draft_ns"] / n / 1e6, 4),
            "verify_ms_per_step": round((s["step_ns"] - s["draft_ns"]) / n / 1e6, 4),
            "no_draft_ms_per_step": round(no_draft / n / 1e6, 4),
            "speedup_estimate": round(estimate, 4),
        }
