"""What the run judge is fed and what it gives back: one flush's finished records per run in (:class:`RunBatch`),
findings and estimates out (:class:`Judged`).

The drain (``spectrace.collector.drain``) turns a flush's captured steps into rows and, beside them, one
:class:`RunObservation` per run: the counts the rules weigh, nothing of vLLM's. ``RunJudge.observe(batch)`` is the
only way records reach the rules. Pure data: numpy arrays and plain values, no callables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from spectrace.audit.findings import Finding

ENGINE, WORKER = "engine_core", "worker"
ACCEPTANCE_SPAN = "spectrace.verify.acceptance"  # the span a collapse, a recovery or a drift is an event on


class Positions(NamedTuple):
    """The engine core's verified drafts of a flush per draft position, and its steps' marks (the collapse onset)."""

    drafted_at: np.ndarray
    accepted_at: np.ndarray
    marks: list  # acceptance.StepMark per step that verified drafts


class Drift(NamedTuple):
    """The engine core's verified drafts of a flush per (context range, position) and per request (rules.drift)."""

    ts_ns: int  # the flush's last step
    strata: dict[tuple[str, int], tuple[int, int]]
    requests: dict[str, tuple[int, int]]
    k: int  # the most drafts one request-step verified


class Budget(NamedTuple):
    """A flush's draft tokens proposed (by the drafter) and verified (by the engine core)."""

    proposed: int
    verified: int


class PrefixHits(NamedTuple):
    """The prompt and prefix-cache tokens of the requests a flush read first, and how many of them hit the cache."""

    prompt_tokens: int
    cached_tokens: int
    requests_hit: int


@dataclass
class RunObservation:
    """One run's records of one flush, as the drain counted them (each part empty where the flush had none)."""

    k: int = 1  # the run's num_speculative_tokens (1 where unknown)
    method: str | None = None  # the run's speculative method
    scheduler: dict | None = None  # the run's scheduler facts (``RunConfig.scheduler``), where its engine core ran here
    # the run's configs as the curve reads them: (boundaries, root-cause codes, method, parallel drafting); given
    # with the run's first engine counts
    context: tuple[list, set[str], str | None, bool | None] | None = None
    totals: list[tuple[str, int | None, int, int]] = field(default_factory=list)  # (source, rank, drafted, accepted)
    positions: Positions | None = None
    drift: Drift | None = None
    by_range: list[tuple[tuple[int, int | None], int, int]] = field(default_factory=list)  # (range, drafted, accepted)
    draft_shapes: dict | None = None  # acceptance.repeated_rows of the flush's drafts (dummy drafts)
    shapes: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)  # (batch band, k) -> (steps, k switches)
    transitions: dict[tuple[int, int], int] = field(default_factory=dict)  # (k before, k after) -> switches
    slices: list[tuple[dict[str, str], bool, int, int]] = field(default_factory=list)  # (slice, first step, drafted, accepted)
    prefix_hits: PrefixHits | None = None
    defaults: dict | None = None  # the run's generation_config sampling defaults, once read
    prefix: dict | None = None  # the run's prefix caching facts (block size, EAGLE block drop), once read
    phases: dict[str, tuple[int, int, int]] | None = None  # thinking phase -> (request-steps, drafted, accepted)
    budget: Budget | None = None
    new_requests: int = 0  # requests whose first verified step was in this flush
    speculation: dict[int | None, dict[str, float]] = field(default_factory=dict)  # worker rank -> its step sums


@dataclass
class RunBatch:
    """One flush's records, per run; ``closing``: the runs but ``running`` are over (engine/worker agreement)."""

    runs: dict[str | None, RunObservation] = field(default_factory=dict)
    closing: bool = False
    running: str | None = None

    def run(self, run_id: str | None) -> RunObservation:
        seen = self.runs.get(run_id)
        if seen is None:
            seen = self.runs[run_id] = RunObservation()
        return seen


@dataclass(frozen=True)
class Verdict:
    """Findings of one run, and where they are said: the run's span, or an event span (``span``) of their own."""

    run_id: str | None
    findings: list[Finding]
    role: str = ENGINE
    rank: int | None = None
    span: str | None = None


@dataclass
class Judged:
    """What one batch gave: the findings, the live speed-up window of each worker rank that timed steps
    (``PayingDetector.window``), and the rules that failed on it (counted by the drain, never raised)."""

    verdicts: list[Verdict] = field(default_factory=list)
    windows: dict[tuple[str | None, int | None], dict[str, Any] | None] = field(default_factory=dict)
    errors: list[tuple[str, Exception]] = field(default_factory=list)
