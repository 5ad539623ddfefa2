"""What ``k`` pays: the speed-up at every number of speculative tokens, from one run.

Pure arithmetic over the sums one run records (README, "What k pays"); the live drain,
``spectrace report`` and the tests use it alike, and the ``speedup_by_k`` view
(``store/views.sql``) is its SQL twin.

Acceptance at ``k' <= k`` is exact from the per-position counts: greedy verification accepts a
prefix, so ``accepted[i]`` counts the request-steps that accepted more than ``i`` drafts, and a
request-step that accepted ``j`` of ``k`` drafts would have accepted ``min(j, k')`` of ``k'``:

    L(k') = 1 + sum(accepted[i] for i < k') / request_steps

(``request_steps``: those that drafted at least one token). Past ``k`` the curve is extended
with its last conditional rate ``accepted[k-1] / accepted[k-2]`` (flagged ``extrapolated``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from spectrace import acceptance

EXTRAPOLATE = 2  # k' past the k in force, from the curve's last conditional rate


def expected_lengths(accepted_at: Sequence[int], request_steps: int, *, extra: int = EXTRAPOLATE) -> list[tuple[int, float, bool]]:
    """``(k', L(k'), extrapolated)`` for ``k' = 0 .. k + extra`` (``L(0) = 1``)."""
    k = len(accepted_at)
    if request_steps <= 0:
        return []
    out = [(0, 1.0, False)]
    total = 0.0
    for i, accepted in enumerate(accepted_at):
        total += accepted
        out.append((i + 1, 1.0 + total / request_steps, False))
    if k and extra > 0:
        last = float(accepted_at[-1])
        before = float(accepted_at[-2]) if k >= 2 else float(request_steps)
        rate = min(last / before, 1.0) if before > 0 else 0.0
        for m in range(extra):
            last *= rate
            total += last
            out.append((k + m + 1, 1.0 + total / request_steps, True))
    return out


PARALLEL_METHODS = ("dflash",)  # one drafter pass drafts every position (vLLM's parallel drafting)


@dataclass(frozen=True)
class StepCost:
    """One run's worker step sums over the steps that verified drafts (``speculation_steps``)."""

    steps: float
    step_ns: float
    draft_ns: float
    scheduled_tokens: float
    scheduled_tokens_sq: float
    tokens_x_verify_ns: float
    requests: float

    def verify_fit(self) -> tuple[float, float]:
        """``(a, b)``: a step's verification time (its time less drafting) as ``a + b * scheduled tokens``
        (:func:`spectrace.acceptance.verify_fit`, the fit of the run's own speed-up estimate)."""
        return acceptance.verify_fit(self.steps, self.scheduled_tokens, self.scheduled_tokens_sq, self.tokens_x_verify_ns,
                                     self.step_ns - self.draft_ns)

    def step_ns_at(self, k: int, k_new: int, *, parallel: bool = False) -> float:
        """Host time of one step at ``k_new`` drafts per request (0: no speculation), priced from the
        steps run at ``k``: verification at ``requests * (1 + k_new)`` scheduled tokens, drafting at its
        cost per draft position (autoregressive drafters) or per pass (``parallel``: one pass drafts all)."""
        n = self.steps
        a, b = self.verify_fit()
        requests = self.requests / n
        tokens = self.scheduled_tokens / n - requests * (k - k_new)  # each request schedules 1 + k_new
        verify = max(a + b * tokens, 0.0)
        if k_new == 0:
            return verify
        draft = self.draft_ns / n
        return verify + (draft if parallel or k <= 0 else draft * k_new / k)


def speedup_by_k(accepted_at: Sequence[int], request_steps: int, cost: StepCost, *, method: str | None = None,
                 extra: int = EXTRAPOLATE) -> list[dict]:
    """Per ``k'``: expected accepted length, step time and speed-up over decoding without drafts
    (``L(k') * step(0) / step(k')``). At ``k' = k`` this is the run's own estimate (``speculation_cost``) when no
    prefill chunk shared the drafted steps; a chunk's tokens stay in ``step(0)`` here, where that estimate
    prices the step without drafts at one token per request."""
    k = len(accepted_at)
    if k == 0 or cost.steps <= 0 or cost.step_ns <= 0:
        return []
    parallel = method in PARALLEL_METHODS
    plain = cost.step_ns_at(k, 0)
    rows = []
    for k_new, length, extrapolated in expected_lengths(accepted_at, request_steps, extra=extra):
        step = cost.step_ns_at(k, k_new, parallel=parallel)
        rows.append({
            "k": k_new,
            "expected_length": round(length, 4),
            "step_ms": round(step / 1e6, 4),
            "speedup": round(length * plain / step, 4) if step > 0 else None,
            "extrapolated": extrapolated,
            "in_force": k_new == k,
        })
    return rows


def best(rows: list[dict]) -> dict | None:
    """The measured (not extrapolated) ``k'`` with the highest speed-up; ``k' = 0`` is "no speculation"."""
    measured = [r for r in rows if not r["extrapolated"] and r["speedup"] is not None]
    return max(measured, key=lambda r: r["speedup"]) if measured else None


def from_store(con, run_id: str, *, extra: int = EXTRAPOLATE) -> list[dict]:
    """:func:`speedup_by_k` for one run of a store connection (``spectrace.store.open``): acceptance from the
    engine core's ``verify_counts``, step costs from the lowest worker rank's ``speculation_steps``."""
    counts = con.execute(
        "SELECT position, sum(drafted), sum(accepted) FROM verify_counts WHERE run_id = ? AND source = 'engine_core' "
        "GROUP BY position ORDER BY position", [run_id]).fetchall()
    if not counts or counts[0][0] != 0:
        return []
    accepted_at = [int(a) for _, _, a in counts]
    request_steps = int(counts[0][1])
    row = con.execute(
        "SELECT sum(steps), sum(step_ns), sum(draft_ns), sum(scheduled_tokens), sum(scheduled_tokens_sq), "
        "sum(tokens_x_verify_ns), sum(requests) FROM speculation_steps WHERE run_id = ? AND steps > 0 "
        "AND coalesce(rank, -1) = (SELECT min(coalesce(rank, -1)) FROM speculation_steps WHERE run_id = ? AND steps > 0)",
        [run_id, run_id]).fetchone()
    if row is None or not row[0]:
        return []
    method = con.execute("SELECT any_value(method) FROM runs WHERE run_id = ?", [run_id]).fetchone()
    cost = StepCost(*[float(x or 0) for x in row])
    return speedup_by_k(accepted_at, request_steps, cost, method=method[0] if method else None, extra=extra)
