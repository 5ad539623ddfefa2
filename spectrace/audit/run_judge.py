"""The run judge: a run's records as each flush produces them in, its findings out, each at most once per run.

The drain (``spectrace.collector.drain``) counts a flush's steps into rows and, beside them, one
:class:`~spectrace.audit.batch.RunBatch` (per run: per-position counts, draft shapes, slices, the draft budget, step
shapes, worker step sums), which :meth:`RunJudge.observe` takes whole; this module keeps what the rules need between
batches (the accumulators below, one :class:`RunRecords` per run) and returns the findings they give. One
``reported`` set per run says what was already said, for every rule: collapse and recovery, context and position
cliffs, dummy drafts, slices, drafts never verified, dynamic k, speculation not paying, engine/worker agreement. The rules themselves are pure functions (``spectrace.audit.rules.acceptance``,
``spectrace.audit.rules.slices``, the ``audit`` finding builders); nothing here reads vLLM or writes a row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from spectrace.audit.rules import acceptance, drift, slices, thinking
from spectrace.audit import codes
from spectrace.audit.curve import (
    collapse_finding,
    drift_finding,
    raised_findings,
    context_cliff_finding,
    dummy_drafts_finding,
    not_paying_finding,
    position_cliff_finding,
)
from spectrace.audit.dynamic_k import k_thrashing, thrashing_finding
from spectrace.audit.batch import ACCEPTANCE_SPAN, ENGINE, WORKER, Judged, RunBatch, RunObservation, Verdict
from spectrace.audit.findings import Finding
from spectrace.audit.ranks import disagreement_finding
from spectrace.audit.requests import (
    dropped_hits,
    dropped_hits_finding,
    slice_finding,
    thinking_finding,
    token_budget_findings,
    unverified_drafts,
    unverified_finding,
)

class RunJudge:
    """Every run rule of one process, over the batches its drain hands it (one per ``spectrace.collector.drain.Drain``).

    :meth:`observe` is the only entry: one :class:`~spectrace.audit.batch.RunBatch` per flush in, its findings out."""

    def __init__(self, *, collapse_threshold: float, collapse_window_tokens: int, collapse_min_tokens: int) -> None:
        self._collapse = dict(threshold=collapse_threshold, window=collapse_window_tokens, min_tokens=collapse_min_tokens)
        self.runs: dict[str, RunRecords] = {}
        # (source, run, rank) -> [drafted, accepted] over the run: the engine core's beside each worker rank's
        self.totals: dict[tuple[str, str, int | None], list[int]] = {}
        self.paying: dict[tuple[str | None, int | None], acceptance.PayingDetector] = {}
        self._agreed: set[str] = set()  # runs whose agreement was judged (once, when the run is over)

    def run(self, run_id: str) -> "RunRecords":
        records = self.runs.get(run_id)
        if records is None:
            records = self.runs[run_id] = RunRecords(acceptance.CollapseDetector(**self._collapse))
        return records

    def observe(self, batch: RunBatch) -> Judged:
        """One flush's records, run by run, in the order the rules need them: the curve and the counts first, then
        collapse and drift (said on an acceptance span), the budget, does speculation pay, and the run-wide rules
        (dynamic k, the curve's cliffs and dummy drafts, slices, thinking phases); engine/worker agreement when the
        batch closes runs. A rule that fails is reported in ``Judged.errors`` and costs no other rule its turn."""
        judged = Judged()
        for run_id, seen in batch.runs.items():
            for name, rule in self._rules:
                try:
                    rule(self, run_id, seen, judged)
                except Exception as exc:  # counted by the drain; the next rule still runs
                    judged.errors.append((name, exc))
        if batch.closing:
            try:
                for run_id, findings in self._agreement(exclude=batch.running):
                    judged.verdicts.append(Verdict(run_id, findings))
            except Exception as exc:
                judged.errors.append(("agreement", exc))
        return judged

    # -- the rules, in the order observe runs them ------------------------------------------------

    def _take(self, run_id: str | None, seen: RunObservation, judged: Judged) -> None:
        """What a batch only adds: the curve, the totals, the shapes, slices, phases."""
        if seen.totals:
            for source, rank, drafted, accepted in seen.totals:
                totals = self.totals.setdefault((source, run_id, rank), [0, 0])
                totals[0] += drafted
                totals[1] += accepted
        records = self.run(run_id)
        if seen.context is not None and records.curve is None:
            records.curve = RunCurve(*seen.context)
        curve = records.curve
        if curve is not None:
            for bounds, drafted, accepted in seen.by_range:
                curve.add_range(bounds, drafted, accepted)
            if seen.draft_shapes:
                curve.add_shapes(seen.draft_shapes)
            if seen.positions is not None:
                curve.add_positions(seen.positions.drafted_at, seen.positions.accepted_at)
        if seen.shapes or seen.transitions:
            records.switches.add(seen.shapes, seen.transitions)
        run_slices = records.slices
        if seen.defaults is not None:
            run_slices.defaults = seen.defaults
        if seen.prefix is not None:
            run_slices.prefix = seen.prefix
        for labels, new, drafted, accepted in seen.slices:
            run_slices.add(labels, new, drafted, accepted)
        if seen.prefix_hits is not None:
            run_slices.prompt_tokens += seen.prefix_hits.prompt_tokens
            run_slices.cached_tokens += seen.prefix_hits.cached_tokens
            run_slices.requests_hit += seen.prefix_hits.requests_hit
        if seen.phases:
            records.phases.add(seen.phases)

    def _collapse_rule(self, run_id: str | None, seen: RunObservation, judged: Judged) -> None:
        """ACCEPTANCE_COLLAPSE, then ACCEPTANCE_RECOVERED, as the collapse detector fires on the flush's positions."""
        if seen.positions is None:
            return
        records = self.run(run_id)
        event = records.collapse.observe(seen.positions.drafted_at, seen.positions.accepted_at, seen.positions.marks)
        if event is None:
            return
        collapse = collapse_finding(event, records.curve.roots if records.curve is not None else ())
        judged.verdicts.append(Verdict(run_id, [collapse, *raised_findings(collapse)], span=ACCEPTANCE_SPAN))

    def _drift_rule(self, run_id: str | None, seen: RunObservation, judged: Judged) -> None:
        """ACCEPTANCE_STEP_CHANGE or ACCEPTANCE_DECAY with its start, then ACCEPTANCE_RESTORED (rules.drift)."""
        if seen.drift is None:
            return
        events = self.run(run_id).drift.observe(*seen.drift)
        if not events:
            return
        ranks = sorted({rank for source, run, rank in self.totals if source == WORKER and run == run_id and rank is not None})
        judged.verdicts.append(Verdict(run_id, [drift_finding(event, ranks) for event in events], span=ACCEPTANCE_SPAN))

    def _budget_rule(self, run_id: str | None, seen: RunObservation, judged: Judged) -> None:
        """DRAFTS_UNVERIFIED once per run, with the token-budget findings that explain it. Requests count only once
        the run proposes (no proposals seen: asynchronous scheduling, or the hook off: nothing to compare)."""
        if seen.budget is None:
            return
        budget = self.run(run_id).budget
        budget.proposed += seen.budget.proposed
        budget.verified += seen.budget.verified
        if not budget.proposed:
            return
        budget.requests += seen.new_requests
        records = self.run(run_id)
        evidence = records.first(codes.DRAFTS_UNVERIFIED,
                                 lambda: unverified_drafts(budget.proposed, budget.verified, budget.requests, seen.k))
        if evidence is not None:
            facts = seen.scheduler
            judged.verdicts.append(Verdict(run_id, [unverified_finding(
                evidence, token_budget_findings(**facts) if facts else [])]))

    def _speculation_rule(self, run_id: str | None, seen: RunObservation, judged: Judged) -> None:
        """Each worker rank's step sums of the flush (``speculation_steps``): the speed-up over the detector's
        window, and SPECULATION_NOT_PAYING once (rank 0 speaks: every rank times the same steps)."""
        for rank, sums in seen.speculation.items():
            detector = self.paying.setdefault((run_id, rank), acceptance.PayingDetector())
            evidence = detector.observe(sums)
            judged.windows[(run_id, rank)] = detector.window()
            if evidence is not None and not rank:
                judged.verdicts.append(Verdict(run_id, [not_paying_finding(evidence)], role=WORKER, rank=rank))

    def _run_rules(self, run_id: str | None, seen: RunObservation, judged: Judged) -> None:
        """The run-wide rules, over the run so far: dynamic k, the curve, slices, thinking phases."""
        findings = (self._switch_findings(run_id, seen.scheduler) + self._curve_findings(run_id)
                    + self._slice_findings(run_id, seen.k, seen.method) + self._phase_findings(run_id, seen.k))
        if findings:
            judged.verdicts.append(Verdict(run_id, findings))

    _rules = (("take", _take), ("collapse", _collapse_rule), ("drift", _drift_rule), ("budget", _budget_rule),
              ("speculation", _speculation_rule), ("run", _run_rules))

    def _curve_findings(self, run_id: str) -> list[Finding]:
        """CONTEXT_CLIFF, POSITION_CLIFF and DUMMY_DRAFTS over the curve so far."""
        records = self.run(run_id)
        curve = records.curve
        if curve is None:
            return []
        findings = []
        if (found := records.first(codes.CONTEXT_CLIFF, lambda: next(
                ((b, c) for b in curve.boundaries
                 if (c := acceptance.context_cliff(curve.by_range_totals(), b.tokens)) is not None), None))) is not None:
            boundary, cliff = found
            findings.append(context_cliff_finding(boundary, cliff, curve.roots, curve.rates_by_range()))
        if curve.drafted_at is not None and (position := records.first(
                codes.POSITION_CLIFF, lambda: acceptance.position_cliff(curve.drafted_at, curve.accepted_at))) is not None:
            findings.append(position_cliff_finding(
                position, curve.drafted_at.tolist(), curve.accepted_at.tolist(), curve.method, curve.parallel))
        if (kind := records.first(codes.DUMMY_DRAFTS, lambda: acceptance.dummy_drafts(
                curve.draft_rows, curve.repeated_rows, curve.repeated_drafted, curve.repeated_accepted,
                curve.repeated_by_token))) is not None:
            gate = next((b for b in curve.boundaries if b.model_role == "draft" and b.field == "max_position_embeddings"), None)
            findings.append(dummy_drafts_finding(
                curve.draft_rows, curve.repeated_rows, curve.repeated_by_token, length_gate=gate, roots=curve.roots,
                kind=kind))
        return findings

    def _agreement(self, *, exclude: str | None = None) -> list[tuple[str, list[Finding]]]:
        """VERIFY_DISAGREEMENT for each run not yet judged (but ``exclude``, the one still running) where both the
        engine core and a worker rank counted: (run, its findings)."""
        judged = []
        for run_id in sorted({run for _, run, _ in self.totals if run != exclude and run not in self._agreed}):
            self._agreed.add(run_id)
            engine = self.totals.get((ENGINE, run_id, None))
            if engine is None:
                continue
            findings = [disagreement_finding(engine, worker, rank, run_id)
                        for (source, run, rank), worker in list(self.totals.items())
                        if source == WORKER and run == run_id and worker != engine]
            judged.append((run_id, findings))
        return judged

    # -- request slices, thinking phases, dynamic k -----------------------------------------------

    def _slice_findings(self, run_id: str, k: int, method: str | None) -> list[Finding]:
        """SLICE_ACCEPTANCE_LOW once per run and dimension (THINKING_MODE_GAP for ``thinking_mode``); PREFIX_HITS_DROPPED
        once per run."""
        records = self.run(run_id)
        run_slices = records.slices
        if not run_slices.changed:
            return []
        run_slices.changed = False
        findings = []
        by_slice = {item: (c.requests, c.drafted, c.accepted) for item, c in run_slices.by_slice.items()}
        for gap in slices.slice_gaps(by_slice, run_slices.total, k):
            if gap.dimension == "thinking_mode":
                if records.first(codes.THINKING_MODE_GAP, lambda: True):
                    findings.append(thinking_finding(gap))
            elif records.first(f"{codes.SLICE_ACCEPTANCE_LOW}:{gap.dimension}", lambda: True):
                findings.append(slice_finding(gap, run_slices.defaults))
        prefix = run_slices.prefix or {}
        if prefix.get("eagle_block_drop") and (evidence := records.first(codes.PREFIX_HITS_DROPPED, lambda: dropped_hits(
                run_slices.cached_tokens, run_slices.requests_hit, prefix.get("block_size"), run_slices.prompt_tokens))) is not None:
            findings.append(dropped_hits_finding(evidence, method))
        return findings

    def _phase_findings(self, run_id: str, k: int) -> list[Finding]:
        """THINKING_MODE_GAP once per run for the thinking phases: the verify steps drafted in reasoning against
        those drafted in the answer (``thinking.phase_gap``)."""
        records = self.run(run_id)
        phases = records.phases
        if not phases.changed:
            return []
        phases.changed = False
        gap = records.first(f"{codes.THINKING_MODE_GAP}:thinking_phase", lambda: thinking.phase_gap(phases.by_phase, k))
        return [thinking_finding(gap)] if gap is not None else []

    def _switch_findings(self, run_id: str, facts: dict | None) -> list[Finding]:
        """DYNAMIC_K_THRASHING once per run, with the run's drafts never verified."""
        records = self.run(run_id)
        switches = records.switches
        if not switches.changed:
            return []
        switches.changed = False
        if codes.DYNAMIC_K_THRASHING in records.reported:
            return []
        facts = facts or {}
        evidence = records.first(codes.DYNAMIC_K_THRASHING,
                                 lambda: k_thrashing(switches.by_shape, switches.transitions, facts.get("dynamic_k")))
        if evidence is None:
            return []
        budget = records.budget
        drafts = None
        if budget.proposed:
            drafts = {"proposed": budget.proposed, "verified": budget.verified,
                      "requests": budget.requests, "num_speculative_tokens": facts["k"]}
        return [thrashing_finding(evidence, drafts, token_budget_findings(**facts), max_num_seqs=facts["max_num_seqs"],
                                  max_num_batched_tokens=facts["max_num_batched_tokens"])]


class RunRecords:
    """What one run's rules keep between batches, and what was already reported."""

    __slots__ = ("collapse", "drift", "curve", "slices", "phases", "budget", "switches", "reported")

    def __init__(self, collapse: acceptance.CollapseDetector) -> None:
        self.collapse = collapse
        self.drift = drift.DriftDetector()
        self.curve: RunCurve | None = None  # built on the first counts, from the run's configs
        self.slices = RunSlices()
        self.phases = RunPhases()
        self.budget = RunBudget()
        self.switches = RunSwitches()
        self.reported: set[str] = set()  # codes (and code:dimension for slices) already said for this run

    def first(self, key: str, check: Callable[[], Any]) -> Any:
        """``check()`` when ``key`` was not reported yet for this run, marking it reported when the check
        finds something (not None, returned); else None."""
        if key in self.reported:
            return None
        found = check()
        if found is not None:
            self.reported.add(key)
            return found
        return None


class RunBudget:
    """One run's draft tokens proposed and verified so far, and the requests that verified drafts."""

    __slots__ = ("proposed", "verified", "requests")

    def __init__(self) -> None:
        self.proposed = self.verified = self.requests = 0


class RunSwitches:
    """One run's verified steps and k switches so far: steps and switches by (batch band, k), switches by
    (k before, k after). Which step switched is the drain's to read (it keeps each run's last k)."""

    __slots__ = ("by_shape", "transitions", "changed")

    def __init__(self) -> None:
        self.by_shape: dict[tuple[str, int], tuple[int, int]] = {}
        self.transitions: dict[tuple[int, int], int] = {}
        self.changed = False

    def add(self, shapes: dict[tuple[str, int], tuple[int, int]], transitions: dict[tuple[int, int], int]) -> None:
        for shape, (steps, switches) in shapes.items():
            n, s = self.by_shape.get(shape, (0, 0))
            self.by_shape[shape] = (n + steps, s + switches)
        for pair, n in transitions.items():
            self.transitions[pair] = self.transitions.get(pair, 0) + n
        self.changed = True


class SliceCounts:
    """One request slice's (dimension, value) requests, drafted and accepted so far."""

    __slots__ = ("requests", "drafted", "accepted")

    def __init__(self) -> None:
        self.requests = self.drafted = self.accepted = 0


class RunPhases:
    """One run's verify steps by thinking phase (reasoning / answer): (request-steps, drafted, accepted) so far."""

    __slots__ = ("by_phase", "changed")

    def __init__(self) -> None:
        self.by_phase: dict[str, tuple[int, int, int]] = {}
        self.changed = False

    def add(self, by_phase: dict[str, tuple[int, int, int]]) -> None:
        for phase, counts in by_phase.items():
            before = self.by_phase.get(phase, (0, 0, 0))
            self.by_phase[phase] = tuple(a + b for a, b in zip(before, counts))
        self.changed = True


class RunSlices:
    """One run's acceptance per request slice, and the prefix-cache hits of its requests."""

    __slots__ = ("by_slice", "requests", "drafted", "accepted", "defaults", "prefix", "prompt_tokens", "cached_tokens",
                 "requests_hit", "changed")

    def __init__(self) -> None:
        self.by_slice: dict[tuple[str, str], SliceCounts] = {}
        self.requests = self.drafted = self.accepted = 0
        self.defaults: dict | None = None  # generation_config sampling defaults (read once)
        self.prefix: dict | None = None  # prefix caching, block size, EAGLE block drop (read with the defaults)
        self.prompt_tokens = self.cached_tokens = self.requests_hit = 0
        self.changed = False

    @property
    def total(self) -> tuple[int, int, int]:
        return self.requests, self.drafted, self.accepted

    def add(self, labels: dict[str, str], new_request: bool, drafted: int, accepted: int) -> None:
        self.requests += new_request
        self.drafted += drafted
        self.accepted += accepted
        for item in labels.items():
            counts = self.by_slice.get(item)
            if counts is None:
                counts = self.by_slice[item] = SliceCounts()
            counts.requests += new_request
            counts.drafted += drafted
            counts.accepted += accepted
        self.changed = True


class RunCurve:
    """One run's acceptance shape so far (engine core), with the boundaries its configs set."""

    __slots__ = ("boundaries", "roots", "method", "parallel", "edges", "by_range", "drafted_at", "accepted_at",
                 "draft_rows", "repeated_rows", "repeated_drafted", "repeated_accepted", "repeated_by_token")

    def __init__(self, boundaries: list, roots: set[str], method: str | None, parallel: bool | None) -> None:
        self.boundaries = boundaries
        self.roots = roots
        self.method = method
        self.parallel = parallel
        self.edges = acceptance.range_edges([b.tokens for b in boundaries])
        self.by_range: dict[tuple[int, int | None], list[int]] = {}  # context range -> [drafted, accepted]
        self.drafted_at: np.ndarray | None = None
        self.accepted_at: np.ndarray | None = None
        self.draft_rows = self.repeated_rows = self.repeated_drafted = self.repeated_accepted = 0
        self.repeated_by_token: dict[int, int] = {}

    def add_range(self, bounds: tuple[int, int | None], drafted: int, accepted: int) -> None:
        total = self.by_range.setdefault(bounds, [0, 0])
        total[0] += drafted
        total[1] += accepted

    def add_positions(self, drafted_at: np.ndarray, accepted_at: np.ndarray) -> None:
        if self.drafted_at is None:
            self.drafted_at = np.zeros(0, dtype=np.int64)
            self.accepted_at = np.zeros(0, dtype=np.int64)
        k = max(len(self.drafted_at), len(drafted_at))
        self.drafted_at = np.pad(self.drafted_at, (0, k - len(self.drafted_at))) + np.pad(drafted_at, (0, k - len(drafted_at)))
        self.accepted_at = np.pad(self.accepted_at, (0, k - len(self.accepted_at))) + np.pad(accepted_at, (0, k - len(accepted_at)))

    def add_shapes(self, shapes: dict) -> None:
        self.draft_rows += shapes["rows"]
        self.repeated_rows += shapes["repeated"]
        self.repeated_drafted += shapes["repeated_drafted"]
        self.repeated_accepted += shapes["repeated_accepted"]
        for token, n in shapes["by_token"].items():
            self.repeated_by_token[token] = self.repeated_by_token.get(token, 0) + n

    def by_range_totals(self) -> dict[tuple[int, int | None], tuple[int, int]]:
        return {bounds: (d, a) for bounds, (d, a) in self.by_range.items()}

    def rates_by_range(self) -> dict[str, float | None]:
        labels = dict(zip(acceptance.range_bounds(self.edges), acceptance.range_labels(self.edges)))
        return {labels.get(b, str(b)): round(a / d, 4) if d else None for b, (d, a) in sorted(self.by_range.items())}
