"""Acceptance arithmetic: context buckets, per-position counts, collapse detection.

Pure functions and small classes over plain numbers; the live aggregator
(``spectrace.tracer.verify``) and the tests use them alike.

Per request-step, ``d`` drafted and ``a`` accepted tokens (greedy verification
accepts a prefix): positions ``0..d-1`` were drafted, positions ``0..a-1``
accepted. The rate at position ``p`` is accepted[p] / drafted[p].
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

CONTEXT_BUCKETS = ("0-512", "512-1k", "1k-2k", "2k-4k", "4k-8k", "8k-16k", "16k+")
_EDGES = np.array([512, 1024, 2048, 4096, 8192, 16384])


def context_bucket(context_len: int) -> str:
    """Bucket label of a context length (lower bound inclusive)."""
    return CONTEXT_BUCKETS[int(np.searchsorted(_EDGES, context_len, side="right"))]


def bucket_indices(context_lens: np.ndarray) -> np.ndarray:
    return np.searchsorted(_EDGES, context_lens, side="right")


def position_counts(drafted: np.ndarray, accepted: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-position drafted and accepted totals for arrays of request-steps."""
    positions = np.arange(k)
    drafted_at = (drafted[:, None] > positions[None, :]).sum(axis=0)
    accepted_at = (accepted[:, None] > positions[None, :]).sum(axis=0)
    return drafted_at.astype(np.int64), accepted_at.astype(np.int64)


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

    def observe(self, drafted_at: np.ndarray, accepted_at: np.ndarray) -> CollapseEvent | None:
        drafted_at = np.asarray(drafted_at, dtype=np.int64)
        accepted_at = np.asarray(accepted_at, dtype=np.int64)
        if drafted_at.sum() == 0:
            return None
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
            return CollapseEvent("ACCEPTANCE_COLLAPSE", evidence)
        if not low and self.collapsed:
            self.collapsed = False
            return CollapseEvent("ACCEPTANCE_RECOVERED", evidence)
        return None
