"""The verification drain: what the hooks captured, turned into rows, counts and findings.

Runs on the pipeline's flush thread (its first source), never on vLLM's: in the collector, over the records a
source holds (the hooks' capture in the traced process, or the collector's inbox of shipments). Per flush: the engine core's steps (``EngineStep``) become ``verify_steps``
rows, per-position counts by context range (``verify_counts``), acceptance lengths and
one-token draft rows; the worker's steps (``WorkerStep``) the worker-side counts; the
worker's step times (``StepTiming``) ``speculation_steps``. Each batch of records goes to the
run judge as one ``RunBatch`` (``spectrace.audit.batch``; ``RunJudge.observe``: collapse, cliffs, dummy drafts,
slices, the token budget, dynamic k, speculation not paying, engine/worker agreement), whose findings are emitted
here. What the drain keeps between flushes is what its rows need (each run's last k, its curve's context, whether
it proposes); what the rules keep is the judge's.

Counting rules follow vLLM's ``Scheduler.update_from_output`` /
``make_spec_decoding_stats``: accepted = max(sampled - num_sampled_per_step, 0),
drafted minus grammar-invalidated drafts, request-steps with no sampled output
skipped. Unlike vLLM, requests aborted while their step ran are still counted
(the device did verify them).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from itertools import compress, repeat
from operator import itemgetter

import numpy as np
import pyarrow as pa

from spectrace.audit.rules import acceptance, slices, thinking
from spectrace.audit.batch import Budget, Drift, Positions, PrefixHits, RunBatch, RunObservation
from spectrace.audit.run_judge import RunJudge
from spectrace.collector import columns, findings as findings_out, judging
from spectrace.collector.timings import StepTimes
from spectrace.recorder.verify.capture import ENGINE, MAX_ACTIVE_SLICES, WORKER, ReadRequest, RequestNote
from spectrace.recorder.verify.run_config import RunConfig
from spectrace.recorder.wire import drafts_total
from spectrace.values import SliceCounts, Speedup
from spectrace.vllm_objects.requests import defaults_in_force, request_parameters

log = logging.getLogger("vllm.spectrace")


class Drain:
    """The verification drain over one source of records: rows, counts, value records and findings, from the
    flush thread.

    ``source``: where the records wait, with the capture's ``take_*`` methods, ``request_flags``,
    ``request_traces``, ``config_of`` and ``let_go``: the hooks' own capture
    (``spectrace.recorder.verify.capture.Capture``) where the flush runs in the traced process
    (``SPECTRACE_PIPELINE=thread``), or the collector's :class:`~spectrace.collector.inbox.Inbox`, which the
    shipments fill, in a pipeline process. One per :class:`~spectrace.recorder.runtime.Runtime` that flushes
    (``rt.drain``): a forked child builds its own, with fresh locks.
    """

    def __init__(self, source) -> None:
        self.source = source
        self.judge: RunJudge | None = None  # built on the first drain, with the runtime's settings
        self._span_countdown = 0
        self._sampler = np.random.default_rng(0)  # SPECTRACE_STEP_SAMPLE's draws
        self._lock = threading.RLock()
        # what k pays (spectrace.audit.rules.speedup), per (run, rank): the worker's per-position accepted counts and
        # request-steps, and its step sums, both over the whole run
        self.step_times = StepTimes()  # the worker's step times: decode/chunk steps, does speculation pay, what k pays
        self.requests: dict[str, RequestNote] = {}  # added, slice not read yet
        self.slice_of: dict[str, dict[str, str] | None] = {}  # request id -> its slice (None: no note)
        self.request_totals: dict[str, RequestTotals] = {}  # request id -> its counts so far, until it finishes
        self.phases: dict[str, thinking.PhaseTracker] = {}  # run id -> each request's phase (a reasoning parser's runs)
        # per run, what its rows need across flushes (the oldest run forgotten past MAX_RUNS)
        self.contexts: dict[str | None, tuple] = {}  # the curve's context (judging.run_context) and its range edges
        self.last_k: dict[str | None, int] = {}  # the k of the run's last verified step (its k switches)
        self.proposing: dict[str | None, None] = {}  # runs whose drafter proposals were seen (the draft budget)

    # -- background ------------------------------------------------------------

    def drain(self, rt, *, closing: bool = False, running: str | None = None) -> None:
        """One flush: rows, then one batch to the run judge and its findings out. ``closing``: the runs but
        ``running`` are over (engine/worker agreement is judged)."""
        with self._lock:
            if self.judge is None:
                settings = rt.settings
                self.judge = RunJudge(collapse_threshold=settings.collapse_threshold,
                                      collapse_window_tokens=settings.collapse_window_tokens,
                                      collapse_min_tokens=settings.collapse_min_tokens)
            source = self.source
            batch = RunBatch(closing=closing, running=running)
            finished = source.take_finished()  # first: the steps before each are in the engine steps taken next
            engine = source.take_engine_steps()
            worker = source.take_worker_steps()
            dropped = source.take_dropped()
            for note in source.take_new_requests():
                if len(self.requests) >= MAX_ACTIVE_SLICES:  # never verified (finished first, or no drafts)
                    self.requests.pop(next(iter(self.requests)))
                self.requests[note.request_id] = note
            if dropped:
                rt.pipeline.count_dropped(dropped)
            proposals = source.take_proposals()
            if engine:
                self._drain_engine(rt, engine, batch)
            for run_id, ts, requests in finished:
                self._end_requests(rt, run_id, ts, requests)
            if proposals or engine:
                self._drain_budget(rt, proposals, engine, batch)
            yielded = self._drain_worker(rt, worker, batch) if worker else {}
            host = source.take_host_steps()
            if host:  # before the worker's timings: the live estimate prices this flush's host steps too
                self.step_times.drain_host(rt, host)
            timings = source.take_timings()
            if timings:
                for (run_id, rank), sums in self.step_times.drain(rt, timings, yielded).items():
                    batch.run(run_id).speculation[rank] = sums
            source.let_go(engine, worker, proposals, host)  # counted: vLLM's threads drop them (capture)
            self._judge(rt, batch)

    def _judge(self, rt, batch: RunBatch) -> None:
        """The flush's batch to the run judge: each run's k, method and (where its engine core ran here) scheduler
        facts added; its findings emitted, a rule's fault counted, the live speed-up of each timed rank noted."""
        for run_id, seen in batch.runs.items():
            seen.k = int(rt.run_k(run_id) or 1)
            seen.method = _method(rt, run_id)
            if run_id in self.contexts or seen.budget is not None:
                seen.scheduler = self.config_of(run_id).scheduler()
        judged = self.judge.observe(batch)
        for name, exc in judged.errors:
            rt.count_error("drain." + name, exc)
        for verdict in judged.verdicts:
            if not verdict.findings:
                continue
            run = rt.run_by_id(verdict.run_id)
            if verdict.span is None:
                findings_out.emit(rt, verdict.findings, role=verdict.role, rank=verdict.rank, run=run)
                continue
            with rt.span(verdict.span, role=verdict.role, run=run,
                         attributes={"spectrace.event": verdict.findings[0].code}) as span:
                findings_out.emit(rt, verdict.findings, role=verdict.role, rank=verdict.rank, span=span, run=run)
        if rt.metered:  # the judge's estimates: value records (spectrace.values), for the metrics sink
            for run_id, seen in batch.runs.items():
                for rank in seen.speculation:
                    window = judged.windows.get((run_id, rank))
                    rt.pipeline.note(Speedup(run_id, rank, window["speedup_estimate"] if window else None,
                                             self.step_times.speedup_by_k(rt, run_id, rank) or []))

    def _drain_engine(self, rt, steps: list[tuple], batch: RunBatch) -> None:
        """The engine core's steps of one flush, counted as columns (``columns``: no loop per request-step)."""
        runs: dict[str, columns.RunColumns] = {}
        ended: list[tuple[str | None, int, list[str]]] = []  # (run, ts, requests) that finished in a step
        sampled_of: dict[str, list] = {}  # run -> per counted step: (its rows' request ids, sampled ids) or None
        for (ts, step_no, run_id, drafts, sampled_lens, req_ids, cached, invalid, num_sampled, emitted, finished,
             sampled_ids) in steps:
            run = runs.get(run_id)  # EngineStep
            if run is None:
                run = runs[run_id] = columns.RunColumns()
            before = len(run._sizes)
            run.add(ts, step_no, drafts, sampled_lens, req_ids, cached, invalid, num_sampled, emitted)
            if len(run._sizes) > before and (sampled_ids is not None or run_id in sampled_of):
                per_step = sampled_of.setdefault(run_id, [None] * before)
                per_step.append((req_ids, sampled_ids) if sampled_ids is not None else None)
            if finished:
                ended.append((run_id, ts, finished))
        common = rt.common(ENGINE)
        band_rows: list[dict] = []
        shape_rows: list[dict] = []
        per_request: dict[tuple[str, str], tuple[int, int, int, int, list[int]]] = {}
        now = time.time_ns()
        for run_id, run in runs.items():
            counted = run.count()
            if counted is None:
                continue
            seen = batch.run(run_id)
            marks, step_bands, by_shape = self._steps(rt, run_id, counted, seen)
            arr = counted.table()  # one array per run: the counts, the band positions and the rows share it
            self._verify_rows(rt, common, run_id, counted)
            band_rows += _band_positions(common, run_id, arr, step_bands)
            shapes = acceptance.repeated_rows(counted.tokens, counted.starts, counted.lengths, counted.accepted)
            seen.draft_shapes = shapes
            if shapes["rows"]:
                rt.pipeline.append(
                    "draft_shapes",
                    {**common, "run_id": run_id, "ts": time.time_ns(), "rows": shapes["rows"], "repeated_rows": shapes["repeated"],
                     "repeated_drafted": shapes["repeated_drafted"], "repeated_accepted": shapes["repeated_accepted"]},
                )
            strata = self._count(rt, ENGINE, run_id, None, arr, seen, marks)
            flush = counted.per_request()
            seen.drift = Drift(int(counted.ts.max()), strata, dict(zip(
                flush.ids, zip(flush.drafted.tolist(), flush.accepted.tolist()))), int(counted.drafted.max()))
            totals = self.request_totals
            first_ts = int(counted.ts[0])
            for req_id, n, d, a, e, h in zip(flush.ids, flush.steps.tolist(), flush.drafted.tolist(),
                                             flush.accepted.tolist(), flush.emitted.tolist(), flush.histogram.tolist()):
                per_request[(run_id, req_id)] = (n, d, a, e, h)
                request = totals.get(req_id)
                if request is None:
                    if len(totals) >= MAX_ACTIVE_SLICES:  # finished where no step verified drafts: never ended here
                        totals.pop(next(iter(totals)))
                    request = totals[req_id] = RequestTotals(first_ts)
                request.add(n, d, a, e, h)
            rows = [{**common, "run_id": run_id, "ts": now, "batch_band": band, "k": k, "steps": c.steps,
                     "request_steps": c.request_steps, "drafted": c.drafted, "accepted": c.accepted,
                     "k_switches": c.switches} for (band, k), c in by_shape.items()]
            shape_rows += rows
            seen.shapes = {shape: (c.steps, c.switches) for shape, c in by_shape.items()}
        if shape_rows:
            rt.pipeline.extend("step_shapes", shape_rows)
        if band_rows:
            rt.pipeline.extend("band_positions", band_rows)
        if per_request:
            self._drain_slices(rt, per_request, batch)
        for run_id, per_step in sampled_of.items():  # after the slices: a request's mode is known at its first step
            counted = runs[run_id].count()
            if counted is not None:
                try:
                    self._drain_phases(rt, run_id, counted, per_step, batch)
                except Exception as exc:
                    rt.count_error("drain.phases", exc)
        for run_id, ts, finished in ended:
            self._end_requests(rt, run_id, ts, finished)

    def _drain_phases(self, rt, run_id: str, counted: "columns.Counted", per_step: list, batch: RunBatch) -> None:
        """``thinking_phases``: the flush's request-steps by the phase (reasoning / answer) each was drafted in,
        read off the tokens every row of the earlier steps emitted against the reasoning parser's think markers
        (``thinking.PhaseTracker``); to the judge, whose ``THINKING_MODE_GAP`` compares the phases. Tokens of a
        step in which no request drafted (a batch of prefills) are not seen here."""
        markers = self.config_of(run_id).think()
        if markers is None:
            return
        tracker = self.phases.get(run_id)
        if tracker is None:
            tracker = self.phases[run_id] = thinking.PhaseTracker(*markers, limit=MAX_ACTIVE_SLICES)
        at_step: dict[int, list[tuple[str, int, int]]] = defaultdict(list)
        for req_id, step, drafted, accepted in zip(counted.ids, counted.step_of.tolist(), counted.drafted.tolist(),
                                                   counted.accepted.tolist()):
            at_step[step].append((req_id, drafted, accepted))
        steps = []
        state = tracker.state
        mode = self._mode_of  # read for a request the tracker does not follow yet
        for step, sampled in enumerate(per_step):
            for req_id, drafted, accepted in at_step.get(step, ()):
                steps.append((tracker.phase(req_id, None if req_id in state else mode(req_id)), drafted, accepted))
            if sampled is not None:
                req_ids, sampled_ids = sampled
                for req_id, tokens in zip(req_ids, sampled_ids):
                    if tokens:
                        tracker.feed(req_id, None if req_id in state else mode(req_id), tokens)
        if not steps:
            return
        by_phase = thinking.phase_counts(steps)
        batch.run(run_id).phases = by_phase
        common = rt.common(ENGINE, run_id=run_id)
        now = time.time_ns()
        rt.pipeline.extend("thinking_phases", [
            {**common, "ts": now, "phase": phase, "request_steps": n, "drafted": drafted, "accepted": accepted}
            for phase, (n, drafted, accepted) in sorted(by_phase.items())])

    def _mode_of(self, req_id: str) -> str | None:
        """A request's thinking mode: its slice's, else its note's (not read into a slice yet)."""
        labels = self.slice_of.get(req_id)
        if labels is not None:
            return labels.get("thinking_mode")
        note = self.requests.get(req_id)
        if note is None:
            return None
        if type(note) is ReadRequest:
            return note.params.get("thinking_mode")
        if note.think_markers is not None and note.prompt_token_ids is not None:
            return thinking.mode_from_prompt_tail(note.prompt_token_ids, *note.think_markers)
        return None

    def _end_requests(self, rt, run_id: str | None, ts: int, finished: list[str]) -> None:
        """Requests that finished in a step: the span of each that verified drafts (its totals leave)."""
        tracker = self.phases.get(run_id)
        if tracker is not None:
            for req_id in finished:
                tracker.finish(req_id)
        for req_id in finished:
            request = self.request_totals.pop(req_id, None)
            if request is not None:
                self._request_span(rt, run_id, req_id, request, ts)

    def _request_span(self, rt, run_id: str | None, req_id: str, request: "RequestTotals", end_ns: int) -> None:
        """One finished request as a span: vLLM's per-request speculative metrics under its own leaf names
        (``spectrace.spec_decode.*``, as ``RequestSpecDecodeMetrics.to_dict`` names them), and what it emitted."""
        k = rt.run_k(run_id) or len(request.histogram) - 1
        histogram = request.histogram + [0] * max(k + 1 - len(request.histogram), 0)
        prefix = "spectrace.spec_decode."
        attributes = {
            "spectrace.request.id": req_id,
            prefix + "num_spec_tokens": int(k),
            prefix + "acceptance_histogram": histogram,
            prefix + "num_spec_steps": request.steps,
            prefix + "num_accepted_draft_tokens": request.accepted,
            prefix + "num_draft_tokens": request.drafted,
            prefix + "mean_acceptance_length": 1 + request.accepted / request.steps if request.steps else 1.0,
            prefix + "draft_acceptance_rate": request.accepted / request.drafted if request.drafted else 0.0,
            prefix + "emitted_tokens": request.emitted,
        }
        span = rt.start_span("spectrace.request", role=ENGINE, run=rt.run_by_id(run_id), start_time=request.first_ts,
                             links=self._links([req_id]), attributes=attributes)
        span.end(end_time=max(end_ns, request.first_ts))

    def _steps(self, rt, run_id: str, counted: "columns.Counted", seen: RunObservation):
        """Per step of the run that counted something: its mark (the collapse onset), its batch band and k (the
        step shapes and k switches: ``seen.transitions``), a sampled span."""
        marks: list[acceptance.StepMark] = []
        step_bands: list[tuple[str, int]] = []
        by_shape: dict[tuple[str, int], ShapeCounts] = {}
        last_k = self.last_k.get(run_id)
        transitions = seen.transitions
        n_at, drafted_at, accepted_at, pos0_at = (a.tolist() for a in counted.per_step)
        for i, (ts, step_no, n, drafted, accepted, pos0, context, k) in enumerate(zip(
                counted.ts.tolist(), counted.step_no.tolist(), n_at, drafted_at, accepted_at, pos0_at,
                counted.ctx_max.tolist(), counted.k.tolist())):
            if not n:
                continue
            mark = acceptance.StepMark(step_no, ts, context, drafted, accepted, n, pos0, k)
            band = acceptance.batch_band(n)
            shape = by_shape.get((band, k))
            if shape is None:
                shape = by_shape[(band, k)] = ShapeCounts()
            switched = last_k is not None and last_k != k
            if switched:
                transitions[(last_k, k)] = transitions.get((last_k, k), 0) + 1
            last_k = k
            shape.add(mark, switched)
            step_bands.append((band, n))
            marks.append(mark)
            self._maybe_step_span(rt, ts, step_no, run_id, counted, i)
        if last_k is not None:
            _remember(self.last_k, run_id, last_k)
        return marks, step_bands, by_shape

    def _verify_rows(self, rt, common: dict, run_id: str, counted: "columns.Counted") -> None:
        """``verify_steps``: the run's request-steps (all, or the ``SPECTRACE_STEP_SAMPLE`` share), as columns."""
        drafted, accepted, emitted, context = counted.drafted, counted.accepted, counted.emitted, counted.context
        n = len(drafted)
        step_ts, step_no = counted.ts[counted.step_of], counted.step_no[counted.step_of]
        ids, starts, lengths = counted.ids, counted.starts, counted.lengths
        sample = rt.settings.step_sample
        if sample < 1.0:
            keep = self._sampler.random(n) < sample
            if not keep.any():
                return
            ids = list(compress(ids, keep))
            drafted, accepted, emitted, context, step_ts, step_no, starts, lengths = (
                a[keep] for a in (drafted, accepted, emitted, context, step_ts, step_no, starts, lengths))
            n = len(ids)
        draft_ids = None
        if rt.settings.record_tokens:
            tokens = counted.tokens.tolist()
            draft_ids = [json.dumps(tokens[s:s + length]) for s, length in zip(starts.tolist(), lengths.tolist())]
        flags = self.source.request_flags
        pairs = list(map(flags.get, ids, repeat(NO_FLAGS)))
        greedy, structured = list(map(_FIRST, pairs)), list(map(_SECOND, pairs))
        rt.pipeline.extend_columns("verify_steps", {
            **common,
            "run_id": run_id,
            "ts": step_ts,
            "step": step_no,
            "request_id": ids,
            "context_len": pa.array(context, mask=context < 0, type=pa.int64()),
            "num_drafted": drafted,
            "num_accepted": accepted,
            "num_emitted": emitted,
            "greedy": greedy,
            "structured_output": structured,
            "draft_token_ids": draft_ids,
        }, n)

    def _drain_worker(self, rt, steps: list[tuple], batch: RunBatch) -> dict[tuple[str, int | None], tuple[int, int]]:
        """Counts the worker's steps (as columns); per (run, rank): (draft rows, tokens yielded) for the cross-check."""
        per_key: dict[tuple[str, int | None], columns.WorkerColumns] = {}
        for ts, run_id, rank, drafts, valid_lens, row_of in steps:  # WorkerStep
            key = (run_id, rank)
            worker = per_key.get(key)
            if worker is None:
                worker = per_key[key] = columns.WorkerColumns()
            worker.add(drafts, valid_lens, row_of)
        yielded = {}
        for (run_id, rank), worker in per_key.items():
            counted = worker.count()
            if counted is None:
                continue
            drafted, accepted = counted
            self._count(rt, WORKER, run_id, rank, np.column_stack((drafted, accepted, np.full(len(drafted), -1))),
                        batch.run(run_id))
            yielded[(run_id, rank)] = (len(drafted), int(accepted.sum()) + len(drafted))
        return yielded

    def _count(
        self, rt, source: str, run_id: str, rank: int | None, batch: np.ndarray, seen: RunObservation,
        marks: list | None = None
    ) -> dict[tuple[str, int], tuple[int, int]]:
        """The flush's counts as rows, and into ``seen`` for the judge; returns them per (context range, position)."""
        arr = np.asarray(batch, dtype=np.int64)
        drafted, accepted, ctx = arr[:, 0], arr[:, 1], arr[:, 2]
        k = int(drafted.max())
        engine = source == ENGINE
        edges = self._context(rt, run_id, seen) if engine else acceptance.range_edges()
        labels = acceptance.range_labels(edges)
        bounds = acceptance.range_bounds(edges)
        ranges = acceptance.range_indices(edges, np.maximum(ctx, 0))
        now = time.time_ns()
        common = rt.common(source, rank, run_id=run_id)
        rows = []
        strata: dict[tuple[str, int], tuple[int, int]] = {}
        for r in np.unique(ranges):
            mask = ranges == r
            d_at, a_at = acceptance.position_counts(drafted[mask], accepted[mask], k)
            low = bounds[int(r)][0]
            if engine:
                seen.by_range.append((bounds[int(r)], int(d_at.sum()), int(a_at.sum())))
            for position in range(k):
                if d_at[position] == 0 and a_at[position] == 0:
                    continue
                strata[(labels[int(r)], position)] = (int(d_at[position]), int(a_at[position]))
                rows.append(
                    {
                        **common,
                        "ts": now,
                        "source": source,
                        "position": position,
                        "context_bucket": acceptance.context_bucket(low) if source == ENGINE else None,
                        "context_range": labels[int(r)] if source == ENGINE else None,
                        "drafted": int(d_at[position]),
                        "accepted": int(a_at[position]),
                    }
                )
        lengths = np.bincount(accepted + 1)
        length_rows = [
            {**common, "ts": now, "source": source, "length": length, "count": int(count)}
            for length, count in enumerate(lengths)
            if count
        ]
        rt.pipeline.extend("verify_counts", rows)
        rt.pipeline.extend("acceptance_lengths", length_rows)
        seen.totals.append((source, rank, int(drafted.sum()), int(accepted.sum())))
        d_all, a_all = acceptance.position_counts(drafted, accepted, k)
        if engine:
            seen.positions = Positions(d_all, a_all, marks)
        else:  # what k pays: the worker's counts beside its step times
            self.step_times.accepted(run_id, rank, a_all, len(batch))
        return strata

    def _links(self, request_ids: list[str]) -> list:
        """Span links to the ``llm_request`` traces of these requests (when vLLM traces)."""
        if not self.source.request_traces:
            return []
        from opentelemetry import trace as trace_api
        from opentelemetry.trace import Link
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        propagator = TraceContextTextMapPropagator()
        links = []
        for req_id in request_ids:
            headers = self.source.request_traces.get(req_id)
            if not headers:
                continue
            context = trace_api.get_current_span(propagator.extract(headers)).get_span_context()
            if context.is_valid:
                links.append(Link(context, {"vllm.request_id": req_id}))
        return links

    def _maybe_step_span(self, rt, ts: int, step_no: int, run_id: str, counted: "columns.Counted", step: int) -> None:
        every = rt.settings.span_every_steps
        if every <= 0:
            return
        if self._span_countdown > 0:
            self._span_countdown -= 1
            return
        self._span_countdown = every - 1
        rows = counted.step_slice(step)
        drafted, accepted, ids = counted.drafted[rows], counted.accepted[rows], counted.ids[rows]
        d_at, a_at = acceptance.position_counts(drafted, accepted, int(drafted.max()))
        with rt.span(
            "spectrace.verify.step",
            role=ENGINE,
            run=rt.run_by_id(run_id),
            start_time=ts,
            links=self._links(ids),
            attributes={
                "spectrace.step": step_no,
                "spectrace.batch_size": len(ids),
                "spectrace.drafted_by_position": [int(x) for x in d_at],
                "spectrace.accepted_by_position": [int(x) for x in a_at],
            },
        ):
            pass

    # -- the run's acceptance curve: context ranges, cliffs, dummy drafts --------------

    def config_of(self, run_id: str | None) -> "RunConfig":
        """What the drain reads of the run's VllmConfig (the source's: read in the engine's process)."""
        return self.source.config_of(run_id)

    def _context(self, rt, run_id: str, seen: RunObservation) -> list:
        """The run's curve context (its configs judged once: boundaries, root causes, method, parallel drafting)
        into ``seen``; returns the context range edges its boundaries set. ``context_boundaries`` on first read."""
        known = self.contexts.get(run_id)
        if known is None:
            context = judging.run_context(self.config_of(run_id))
            known = (context, acceptance.range_edges([b.tokens for b in context[0]]))
            _remember(self.contexts, run_id, known)
            if context[0]:
                common = rt.common(ENGINE, run_id=run_id)
                rt.pipeline.extend("context_boundaries", [{**common, "ts": time.time_ns(), **b.as_dict()} for b in context[0]])
        seen.context = known[0]
        return known[1]

    # -- request slices: the parameters the drafter never sees ----------------------

    def _drain_slices(self, rt, per_request: dict[tuple[str, str], tuple], batch: RunBatch) -> None:
        """``request_counts`` per request; ``request_slices`` once per request, at its first verified step; each
        run's slices, new requests and prefix-cache hits into the batch."""
        now = time.time_ns()
        count_rows, slice_rows = [], []
        by_slice: dict[str, dict[tuple[str, str], tuple[int, int]]] = defaultdict(dict)  # this flush, for the metrics
        commons: dict[str, dict] = {}
        for (run_id, req_id), (steps, drafted, accepted, emitted, histogram) in per_request.items():
            common = commons.get(run_id)
            if common is None:
                common = commons[run_id] = rt.common(ENGINE, run_id=run_id)
            count_rows.append({**common, "ts": now, "request_id": req_id, "request_steps": steps,
                               "drafted": drafted, "accepted": accepted, "emitted": emitted,
                               "histogram": _int_list(histogram)})
            seen = batch.run(run_id)
            if req_id in self.slice_of:
                labels, new = self.slice_of[req_id], False
            else:
                labels, new = self._read_slice(run_id, req_id, common, now, slice_rows, seen), True
                seen.new_requests += 1
            if labels is not None:
                seen.slices.append((labels, new, drafted, accepted))
                if rt.metered:
                    flush_counts = by_slice[run_id]  # (dimension, value) -> (drafted, accepted) of this flush
                    for item in labels.items():
                        before_drafted, before_accepted = flush_counts.get(item, (0, 0))
                        flush_counts[item] = (before_drafted + drafted, before_accepted + accepted)
        for run_id, counts in by_slice.items():  # value records, for the metrics sink
            rt.pipeline.note(SliceCounts(run_id, counts))
        rt.pipeline.extend("request_slices", slice_rows)
        rt.pipeline.extend("request_counts", count_rows)

    def _read_slice(self, run_id: str, req_id: str, common: dict, now: int, rows: list,
                    seen: RunObservation) -> dict[str, str] | None:
        note = self.requests.pop(req_id, None)
        labels = None
        if note is not None:
            params = note.params if type(note) is ReadRequest else request_parameters(
                note.sampling_params, note.lora_request, note.prefill_stats, note.prompt_token_ids, note.think_markers)
            labels = slices.request_slice(params)
            facts = self.config_of(run_id)  # each part read once per run (RunConfig), off the engine's threads
            defaults, prefix = facts.defaults(), facts.prefix()
            seen.defaults, seen.prefix = defaults, prefix
            prefix = prefix or {}
            rows.append({**common, "ts": now, "request_id": req_id, **params,
                         "generation_defaults": json.dumps(defaults_in_force(params, defaults)),
                         "slice": json.dumps(labels), "block_size": prefix.get("block_size"),
                         "eagle_block_drop": prefix.get("eagle_block_drop")})
            if params["prompt_tokens"]:
                hits = seen.prefix_hits or PrefixHits(0, 0, 0)
                seen.prefix_hits = PrefixHits(hits.prompt_tokens + params["prompt_tokens"],
                                              hits.cached_tokens + params["cached_tokens"],
                                              hits.requests_hit + (params["cached_tokens"] > 0))
        if len(self.slice_of) >= MAX_ACTIVE_SLICES:
            self.slice_of.pop(next(iter(self.slice_of)))
        self.slice_of[req_id] = labels
        return labels

    # -- the token budget: drafts proposed vs drafts verified ------------------------

    def _drain_budget(self, rt, proposals: list, engine: list, batch: RunBatch) -> None:
        """``draft_budget`` per run and flush, once the run's drafter proposals are seen (asynchronous scheduling,
        or the hook off: none, so nothing to compare); into the batch for DRAFTS_UNVERIFIED."""
        proposed: dict[str | None, int] = defaultdict(int)
        verified: dict[str | None, list[int]] = defaultdict(lambda: [0, 0])
        for run_id, drafts in proposals:  # Proposal (as shipped: their total)
            proposed[run_id] += drafts if type(drafts) is int else sum(map(len, drafts))
        for step in engine:
            counts = verified[step.run_id]
            counts[0] += drafts_total(step.drafts)
            counts[1] += 1
        now = time.time_ns()
        for run_id in proposed.keys() | verified.keys():
            seen = batch.run(run_id)
            v, steps = verified.get(run_id, (0, 0))
            seen.budget = Budget(proposed.get(run_id, 0), v)
            if proposed.get(run_id):
                _remember(self.proposing, run_id, None)
            if run_id not in self.proposing:
                continue
            rt.pipeline.append("draft_budget", {**rt.common(ENGINE, run_id=run_id), "ts": now, "proposed": proposed.get(run_id, 0),
                                                "verified": v, "steps": steps, "new_requests": seen.new_requests})

    # -- agreement ---------------------------------------------------------------

    def check_agreement(self, rt, *, exclude: str | None = None) -> None:
        """VERIFY_DISAGREEMENT for finished runs where this process saw both sides.

        Checked once per run, when the run is over (a new run starts, or the
        process exits), so a step in flight between worker and engine core
        never counts as a disagreement.
        """
        self.drain(rt, closing=True, running=exclude)


def _band_positions(common: dict, run_id: str, arr: np.ndarray, steps: list[tuple[str, int]]) -> list[dict]:
    """``band_positions`` rows of one run's flush: drafted and accepted per position for each batch-size band, from
    the run's request-steps (``arr``: drafted, accepted, context; in step order) and each step's (band, request-steps)."""
    if not steps or not len(arr):
        return []
    bands = sorted({band for band, _ in steps})
    code = {band: i for i, band in enumerate(bands)}
    index = np.repeat(np.array([code[band] for band, _ in steps]), [n for _, n in steps])
    now = time.time_ns()
    rows = []
    for i, band in enumerate(bands):
        mine = arr[index == i]
        drafted_at, accepted_at = acceptance.position_counts(mine[:, 0], mine[:, 1], int(mine[:, 0].max()))
        rows += [{**common, "run_id": run_id, "ts": now, "batch_band": band, "position": p, "drafted": int(d),
                  "accepted": int(a)} for p, (d, a) in enumerate(zip(drafted_at, accepted_at))]
    return rows


NO_FLAGS = (None, None)
_FIRST, _SECOND = itemgetter(0), itemgetter(1)  # (greedy, structured output) of a request the hook never saw added


MAX_RUNS = 64  # runs the drain keeps per-run reads of (a long-lived server starts one per engine start)


def _remember(per_run: dict, run_id, value) -> None:
    """``per_run[run_id] = value``, forgetting the oldest run past :data:`MAX_RUNS`."""
    if run_id not in per_run and len(per_run) >= MAX_RUNS:
        per_run.pop(next(iter(per_run)))
    per_run[run_id] = value


def _method(rt, run_id: str | None) -> str | None:
    run = rt.run_by_id(run_id)
    return run.info.get("method") if run is not None else None


def _int_list(values: list[int]) -> str:
    """A list of ints as JSON text (``json.dumps``'s, at a fifth of its cost: one a request a flush)."""
    return "[" + ", ".join(map(str, values)) + "]"


class ShapeCounts:
    """One (run, batch band, k)'s verified steps of a flush: steps, request-steps, drafted, accepted, k switches."""

    __slots__ = ("steps", "request_steps", "drafted", "accepted", "switches")

    def __init__(self) -> None:
        self.steps = self.request_steps = self.drafted = self.accepted = self.switches = 0

    def add(self, mark: acceptance.StepMark, switched: bool) -> None:
        self.steps += 1
        self.request_steps += mark.pos0_drafted
        self.drafted += mark.drafted
        self.accepted += mark.accepted
        self.switches += switched



class RequestTotals:
    """One request's verify steps so far (engine core), until it finishes: its span's numbers."""

    __slots__ = ("first_ts", "steps", "drafted", "accepted", "emitted", "histogram")

    def __init__(self, first_ts: int) -> None:
        self.first_ts = first_ts
        self.steps = self.drafted = self.accepted = self.emitted = 0
        self.histogram: list[int] = []

    def add(self, steps: int, drafted: int, accepted: int, emitted: int, histogram: list[int]) -> None:
        self.steps += steps
        self.drafted += drafted
        self.accepted += accepted
        self.emitted += emitted
        if len(histogram) > len(self.histogram):
            self.histogram += [0] * (len(histogram) - len(self.histogram))
        for j, n in enumerate(histogram):
            self.histogram[j] += n
