"""The worker's step times (``StepTiming``, from its hooks): what a step costs, with and without drafts.

Per flush: decode-only steps by shape (``decode_steps``), steps with a prefill chunk (``chunk_steps``), and the
sums over steps with drafts (``speculation_steps``) that the run judge weighs (does speculation pay?) and that
price every other k with the rank's accepted counts (what k pays: ``spectrace.audit.rules.speedup``).
"""

from __future__ import annotations

import time

import numpy as np

from spectrace.audit.rules import speedup
from spectrace.recorder.verify.capture import WORKER, HostStep, StepTiming, host_tokens


class StepTimes:
    """One process's worker step times across flushes: the sums and accepted counts each (run, rank) has so far."""

    def __init__(self) -> None:
        self.by_k_counts: dict[tuple[str | None, int | None], AcceptedSoFar] = {}
        self.by_k_costs: dict[tuple[str | None, int | None], dict[str, float]] = {}
        self.host: dict[tuple[str | None, str], HostSums] = {}  # (run, role): this process's host steps over the run

    def accepted(self, run_id: str | None, rank: int | None, accepted_at: np.ndarray, request_steps: int) -> None:
        """A flush's verified counts of one worker rank, per position (what k pays)."""
        counts = self.by_k_counts.get((run_id, rank))
        if counts is None:
            counts = self.by_k_counts[(run_id, rank)] = AcceptedSoFar()
        counts.add(accepted_at, request_steps)

    def drain(self, rt, timings: list[StepTiming], yielded: dict) -> dict[tuple[str | None, int | None], dict[str, int]]:
        """A flush's step times: ``decode_steps``, ``chunk_steps`` and ``speculation_steps`` rows; returns each
        (run, rank)'s sums over its steps with drafts, for the run judge (does speculation pay?). ``yielded``: per
        (run, rank), the request-steps and tokens its verified drafts gave."""
        keys = ("steps", "step_ns", "draft_ns", "scheduled_tokens", "scheduled_tokens_sq", "tokens_x_verify_ns", "requests")
        totals: dict[tuple, dict[str, int]] = {}
        shapes: dict[tuple, StepSums] = {}  # (run, rank, requests, drafts): decode-only steps
        chunks: dict[tuple, StepSums] = {}  # (run, rank, requests, verified): steps with a prefill chunk
        run_k: dict[str | None, int | None] = {}
        for timing in timings:
            step_ns = timing.execute_ns + timing.sample_ns
            if timing.run_id not in run_k:
                run_k[timing.run_id] = rt.run_k(timing.run_id)
            shape = _decode_shape(timing, run_k[timing.run_id])
            if shape is not None:
                key = (timing.run_id, timing.rank, timing.requests, shape)
                (shapes.get(key) or shapes.setdefault(key, StepSums())).add(step_ns, timing)
            elif timing.requests > 0:  # a step with a prefill chunk (one of no requests carried nothing)
                key = (timing.run_id, timing.rank, timing.requests, timing.has_drafts)
                (chunks.get(key) or chunks.setdefault(key, StepSums())).add(step_ns, timing)
            if not timing.has_drafts:
                continue
            t = totals.setdefault((timing.run_id, timing.rank), dict.fromkeys(keys, 0))
            tokens = timing.scheduled_tokens
            t["steps"] += 1
            t["step_ns"] += step_ns
            t["draft_ns"] += timing.draft_ns
            t["scheduled_tokens"] += tokens
            t["scheduled_tokens_sq"] += tokens * tokens
            t["tokens_x_verify_ns"] += tokens * (step_ns - timing.draft_ns)
            t["requests"] += timing.requests
        now = time.time_ns()
        for (run_id, rank, requests, drafts), sums in shapes.items():
            rt.pipeline.append("decode_steps", {**rt.common(WORKER, rank, run_id=run_id), "ts": now, "requests": requests,
                                                "drafts": drafts, "steps": sums.steps, "step_ns": sums.step_ns,
                                                "draft_ns": sums.draft_ns})
        for (run_id, rank, requests, verified), sums in chunks.items():
            rt.pipeline.append("chunk_steps", {**rt.common(WORKER, rank, run_id=run_id), "ts": now, "requests": requests,
                                               "verified": verified, "steps": sums.steps, "step_ns": sums.step_ns,
                                               "draft_ns": sums.draft_ns, "scheduled_tokens": sums.scheduled_tokens})
        for (run_id, rank), t in totals.items():
            t["request_steps"], t["tokens"] = yielded.get((run_id, rank), (0, 0))
            rt.pipeline.append("speculation_steps", {**rt.common(WORKER, rank, run_id=run_id), "ts": now, **t})
            whole = self.by_k_costs.setdefault((run_id, rank), dict.fromkeys(keys, 0))
            for key in keys:
                whole[key] += t[key]
        return totals

    def drain_host(self, rt, steps: list[HostStep]) -> None:
        """A flush's host steps (engine core, frontend): one ``host_steps`` row per (run, role) with the sums that fit
        a step's host time as affine in the tokens it emitted (``spectrace.audit.rules.speedup.HostCost``)."""
        sums: dict[tuple[str | None, str], HostSums] = {}
        last = None  # the frontend's chunks of one engine step (same stamp) are one step
        for step in steps:
            key = (step.run_id, step.role)
            tokens = host_tokens(step)
            if last is not None and step.stamp is not None and step.stamp == last[0].stamp and key == last[1]:
                last[2][0] += step.ns
                last[2][1] += tokens
                continue
            if last is not None:
                (sums.get(last[1]) or sums.setdefault(last[1], HostSums())).add(*last[2])
            last = (step, key, [step.ns, tokens])
        if last is not None:
            (sums.get(last[1]) or sums.setdefault(last[1], HostSums())).add(*last[2])
        now = time.time_ns()
        for (run_id, role), s in sums.items():
            rt.pipeline.append("host_steps", {**rt.common(role, run_id=run_id), "ts": now, "steps": s.steps,
                                              "host_ns": s.ns, "tokens": s.tokens, "tokens_sq": s.tokens_sq,
                                              "tokens_x_ns": s.tokens_x_ns})
            whole = self.host.get((run_id, role)) or self.host.setdefault((run_id, role), HostSums())
            whole.merge(s)

    def host_costs(self, run_id: str | None) -> list[speedup.HostCost]:
        """This process's host steps over the run, per role (the live estimate prices what it sees: the engine
        core's where the worker runs in its process; the frontend's only where it does too)."""
        return [s.cost() for (run, _), s in self.host.items() if run == run_id and s.steps]

    def speedup_by_k(self, rt, run_id: str | None, rank: int | None) -> list[dict]:
        """What k pays over the run so far, from this worker's counts and step sums (``spectrace.audit.rules.speedup``)."""
        counts, whole = self.by_k_counts.get((run_id, rank)), self.by_k_costs.get((run_id, rank))
        if counts is None or whole is None or not counts.request_steps or not whole["steps"]:
            return []
        cost = speedup.StepCost(**{key: float(whole[key]) for key in speedup.StepCost.__dataclass_fields__})
        run = rt.run_by_id(run_id)
        return speedup.speedup_by_k([int(a) for a in counts.accepted_at], counts.request_steps, cost,
                                    method=run.info.get("method") if run is not None else None,
                                    host=self.host_costs(run_id))


def _decode_shape(timing: StepTiming, k: int | None) -> int | None:
    """The drafts per request of a decode-only step (every request scheduled the same ``1 + drafts`` tokens),
    or None: a step with a prefill chunk, or one whose tokens divide evenly but exceed ``1 + k``. Read from the
    step's two totals: a step without drafts is decode-only exactly when it scheduled one token per request; one
    with drafts is taken as such when its tokens are ``requests * (1 + d)``, ``d <= k``."""
    requests = timing.requests
    if requests <= 0:
        return None
    per, rest = divmod(timing.scheduled_tokens, requests)
    if rest or per < 1:
        return None
    if not timing.has_drafts:
        return 0 if per == 1 else None
    drafts = per - 1
    return drafts if 1 <= drafts <= (k if k else MAX_DECODE_DRAFTS) else None


MAX_DECODE_DRAFTS = 32  # the most drafts per request a decode-only step is taken to carry when the run's k is unknown


class StepSums:
    """Worker steps of one shape in a flush: how many, their time, their drafting time, their scheduled tokens."""

    __slots__ = ("steps", "step_ns", "draft_ns", "scheduled_tokens")

    def __init__(self) -> None:
        self.steps = self.step_ns = self.draft_ns = self.scheduled_tokens = 0

    def add(self, step_ns: int, timing: StepTiming) -> None:
        self.steps += 1
        self.step_ns += step_ns
        self.draft_ns += timing.draft_ns
        self.scheduled_tokens += timing.scheduled_tokens


class AcceptedSoFar:
    """A worker rank's accepted drafts per position and request-steps over the run (what k pays)."""

    __slots__ = ("accepted_at", "request_steps")

    def __init__(self) -> None:
        self.accepted_at = np.zeros(0, dtype=np.int64)
        self.request_steps = 0

    def add(self, accepted_at: np.ndarray, request_steps: int) -> None:
        k = len(accepted_at)
        if len(self.accepted_at) < k:
            self.accepted_at = np.concatenate([self.accepted_at, np.zeros(k - len(self.accepted_at), dtype=np.int64)])
        self.accepted_at[:k] += accepted_at
        self.request_steps += request_steps


class HostSums:
    """Host steps of one (run, role): how many, their time, and the token sums of the fit (``speedup.HostCost``)."""

    __slots__ = ("steps", "ns", "tokens", "tokens_sq", "tokens_x_ns")

    def __init__(self) -> None:
        self.steps = self.ns = self.tokens = self.tokens_sq = self.tokens_x_ns = 0

    def add(self, ns: int, tokens: int) -> None:
        self.steps += 1
        self.ns += ns
        self.tokens += tokens
        self.tokens_sq += tokens * tokens
        self.tokens_x_ns += tokens * ns

    def merge(self, other: "HostSums") -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def cost(self) -> speedup.HostCost:
        return speedup.HostCost(float(self.steps), float(self.ns), float(self.tokens), float(self.tokens_sq),
                                float(self.tokens_x_ns))
