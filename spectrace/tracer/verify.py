"""Per-step draft verification, captured where vLLM already holds it on the host.

Engine core (vLLM 0.32, ``v1/core/sched/scheduler.py``)
    ``Scheduler.update_from_output(scheduler_output, model_runner_output)`` runs
    once per step for either model runner, with or without async scheduling.
    The hook appends one tuple per step to a buffer: references to the step's
    draft dict, its row index and cached-request data (new objects every step),
    plus the per-request sampled-token counts taken with one C-level
    ``map(len, ...)`` before vLLM trims anything. No device synchronisation, no
    per-request Python loop on the engine's thread.
    ``Scheduler.add_request`` notes once per request whether it is greedy and
    structured.

Worker (V1 model runner, ``v1/worker/gpu_model_runner.py``)
    ``GPUModelRunner._bookkeeping_sync`` returns the rejection sampler's host
    output (``valid_sampled_token_ids``) on synchronous scheduling; the hook
    keeps its lengths. Dummy and profiling runs never pass through it; prefill
    steps have no drafts and are skipped.

Everything else (per-request accepted counts, positions, context buckets,
rows, spans, the collapse detector) happens in the store's background flush.

Counting rules follow vLLM's ``Scheduler.update_from_output`` /
``make_spec_decoding_stats``: accepted = max(sampled - num_sampled_per_step, 0),
drafted minus grammar-invalidated drafts, request-steps with no sampled output
skipped. Unlike vLLM, requests aborted while their step ran are still counted
(the device did verify them).
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import defaultdict, deque

import numpy as np

from spectrace import acceptance
from spectrace.audit import Finding
from spectrace.read.steps import bookkeeping_sampled
from spectrace.tracer import audit_live, runtime
from spectrace.tracer.hooks import Hook

log = logging.getLogger("vllm.spectrace")

ENGINE = "engine_core"
WORKER = "worker"

_MAX_REQUEST_FLAGS = 100_000


class VerifyCapture:
    """The per-process buffer the hot path appends to, and its background drain.

    One per :class:`~spectrace.tracer.runtime.Runtime` (``rt.verify``): a forked child
    builds its own, with fresh locks and queues.
    """

    def __init__(self) -> None:
        # deques: the engine thread appends while the flush thread pops, and neither
        # ever loses the other's item (a list swapped under the appender could).
        self.engine_steps: deque[tuple] = deque()
        self.worker_steps: deque[tuple] = deque()
        self.dropped_steps = 0  # steps not buffered because the flush fell behind
        self.engine_step_no = 0
        self.request_flags: dict[str, tuple[bool, bool]] = {}
        self.request_traces: dict[str, dict[str, str]] = {}  # request id -> W3C trace headers
        self.detectors: dict[str, acceptance.CollapseDetector] = {}
        self.totals: dict[tuple[str, str, int | None], list[int]] = defaultdict(lambda: [0, 0])
        self._span_countdown = 0
        self._rng = random.Random(0)
        self._lock = threading.RLock()
        self._checked: set[str] = set()

    # -- background ------------------------------------------------------------

    def drain(self, rt: "runtime.Runtime") -> None:
        with self._lock:
            engine = _take(self.engine_steps)
            worker = _take(self.worker_steps)
            if self.dropped_steps:
                rt.writer.dropped += self.dropped_steps
                self.dropped_steps = 0
            if engine:
                self._drain_engine(rt, engine)
            if worker:
                self._drain_worker(rt, worker)

    def _drain_engine(self, rt, steps: list[tuple]) -> None:
        settings = rt.settings
        sample_all = settings.step_sample >= 1.0
        record_tokens = settings.record_tokens
        ts_col: list[int] = []  # verify_steps rows as columns: ts, step, run, the rest as tuples
        step_col: list[int] = []
        run_col: list[str] = []
        kept: list[tuple] = []
        per_run: dict[str, list[tuple[int, int, int]]] = defaultdict(list)  # (drafted, accepted, ctx)
        for ts, step_no, run_id, drafts, sampled_lens, row_of, cached, invalid, num_sampled in steps:
            context = dict(zip(cached.req_ids, cached.num_computed_tokens)) if cached is not None else {}
            step_rows = []
            batch: list[tuple[int, int, int]] = []
            batch_ids: list[str] = []
            for req_id, draft_ids in drafts.items():
                index = row_of.get(req_id)
                if index is None or not draft_ids:
                    continue
                generated = sampled_lens[index] if sampled_lens is not None and index < len(sampled_lens) else 0
                if not generated and num_sampled != 0:
                    continue
                drafted = len(draft_ids) - (invalid.get(req_id, 0) if invalid else 0)
                accepted = max(generated - num_sampled, 0)
                ctx = int(context.get(req_id, -1))
                batch.append((drafted, accepted, ctx))
                batch_ids.append(req_id)
                if sample_all or self._rng.random() < settings.step_sample:
                    # a tuple, not a dict per row; without token ids it holds only ints and a str,
                    # so the garbage collector stops tracking it (no full collections from the drain)
                    step_rows.append((req_id, drafted, accepted, ctx, draft_ids if record_tokens else None))
            if not batch:
                continue
            if step_rows:
                ts_col.extend([ts] * len(step_rows))
                step_col.extend([step_no] * len(step_rows))
                run_col.extend([run_id] * len(step_rows))
                kept.extend(step_rows)
            per_run[run_id].extend(batch)
            self._maybe_step_span(rt, ts, step_no, run_id, batch, batch_ids)
        common = rt.common(ENGINE)
        if kept:
            # handed to the writer as columns: no dict per request-step (see bench/, BENCHMARKS.md)
            req_ids, drafted, accepted, ctx, draft_ids = zip(*kept)
            flags = self.request_flags
            greedy, structured = zip(*[flags.get(req_id, (None, None)) for req_id in req_ids])
            columns = {
                **common,
                "run_id": run_col,  # rows carry their run_id
                "ts": ts_col,
                "step": step_col,
                "request_id": req_ids,
                "context_len": [c if c >= 0 else None for c in ctx],
                "num_drafted": drafted,
                "num_accepted": accepted,
                "greedy": greedy,
                "structured_output": structured,
                "draft_token_ids": [json.dumps(list(d)) for d in draft_ids] if record_tokens else None,
            }
            rt.writer.extend_columns("verify_steps", columns, len(kept))
        for run_id, batch in per_run.items():
            self._count(rt, ENGINE, run_id, None, batch)

    def _drain_worker(self, rt, steps: list[tuple]) -> None:
        per_key: dict[tuple[str, int | None], list[tuple[int, int, int]]] = defaultdict(list)
        for ts, run_id, rank, drafts, valid_lens, row_of in steps:
            if row_of is None:  # V2 model runner: drafts per row, aligned with the sampled rows
                pairs = zip(drafts, valid_lens)
            else:  # V1: request id -> draft token ids, and request id -> row
                pairs = (
                    (len(draft_ids), valid_lens[row_of[req_id]])
                    for req_id, draft_ids in drafts.items()
                    if row_of.get(req_id) is not None and row_of[req_id] < len(valid_lens)
                )
            for drafted, generated in pairs:
                if drafted and generated:
                    per_key[(run_id, rank)].append((int(drafted), max(generated - 1, 0), -1))
        for (run_id, rank), batch in per_key.items():
            self._count(rt, WORKER, run_id, rank, batch)

    def _count(self, rt, source: str, run_id: str, rank: int | None, batch: list[tuple[int, int, int]]) -> None:
        arr = np.asarray(batch, dtype=np.int64)
        drafted, accepted, ctx = arr[:, 0], arr[:, 1], arr[:, 2]
        k = int(drafted.max())
        buckets = acceptance.bucket_indices(np.maximum(ctx, 0))
        now = time.time_ns()
        common = rt.common(source, rank, run_id=run_id)
        rows = []
        for b in np.unique(buckets):
            mask = buckets == b
            d_at, a_at = acceptance.position_counts(drafted[mask], accepted[mask], k)
            for position in range(k):
                if d_at[position] == 0 and a_at[position] == 0:
                    continue
                rows.append(
                    {
                        **common,
                        "ts": now,
                        "source": source,
                        "position": position,
                        "context_bucket": acceptance.CONTEXT_BUCKETS[int(b)] if source == ENGINE else None,
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
        rt.writer.extend("verify_counts", rows)
        rt.writer.extend("acceptance_lengths", length_rows)
        if rt.metrics is not None:
            labels = rt.labels(run_id)
            if source == ENGINE:
                rt.metrics.verify_counts(rows, labels)
                rt.metrics.acceptance_lengths(
                    [r["length"] for r in length_rows],
                    [r["count"] for r in length_rows],
                    int(rt.run_by_id(run_id).info.get("num_speculative_tokens") or k),
                    labels,
                )
            else:
                rt.metrics.worker_counts(int(drafted.sum()), int(accepted.sum()), rank, labels)
        totals = self.totals[(source, run_id, rank)]
        totals[0] += int(drafted.sum())
        totals[1] += int(accepted.sum())
        if source == ENGINE:
            d_all, a_all = acceptance.position_counts(drafted, accepted, k)
            self._detect(rt, run_id, d_all, a_all)

    def _detect(self, rt, run_id: str, drafted_at: np.ndarray, accepted_at: np.ndarray) -> None:
        settings = rt.settings
        detector = self.detectors.get(run_id)
        if detector is None:
            detector = self.detectors[run_id] = acceptance.CollapseDetector(
                threshold=settings.collapse_threshold,
                window=settings.collapse_window_tokens,
                min_tokens=settings.collapse_min_tokens,
            )
        event = detector.observe(drafted_at, accepted_at)
        if event is None:
            return
        collapse = event.code == "ACCEPTANCE_COLLAPSE"
        ev = event.evidence
        finding = Finding(
            code=event.code,
            severity="error" if collapse else "info",
            component="verification",
            model_role="draft",
            message=(
                f"acceptance {'collapsed' if collapse else 'recovered'}: position 0 {ev['position_0_rate']:.1%}, "
                f"overall {ev['overall_rate']:.1%} over the last {ev['window_drafted_tokens']} drafted tokens "
                f"(threshold {ev['threshold']:.0%})"
            ),
            evidence=ev,
            fix=(
                "check the run's findings (spectrace report): a dropped sliding window, wrong hidden-state taps "
                "or a mismatched drafter all look like this"
                if collapse
                else ""
            ),
            caused_by=None if collapse else "ACCEPTANCE_COLLAPSE",
        )
        run = rt.run_by_id(run_id)
        with rt.span("spectrace.verify.acceptance", role=ENGINE, run=run, attributes={"spectrace.event": event.code}) as span:
            audit_live.emit_findings(rt, [finding], role=ENGINE, span=span, run=run)

    def _links(self, request_ids: list[str]) -> list:
        """Span links to the ``llm_request`` traces of these requests (when vLLM traces)."""
        if not self.request_traces:
            return []
        from opentelemetry import trace as trace_api
        from opentelemetry.trace import Link
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        propagator = TraceContextTextMapPropagator()
        links = []
        for req_id in request_ids:
            headers = self.request_traces.get(req_id)
            if not headers:
                continue
            context = trace_api.get_current_span(propagator.extract(headers)).get_span_context()
            if context.is_valid:
                links.append(Link(context, {"vllm.request_id": req_id}))
        return links

    def _maybe_step_span(
        self, rt, ts: int, step_no: int, run_id: str, batch: list[tuple[int, int, int]], request_ids: list[str]
    ) -> None:
        every = rt.settings.span_every_steps
        if every <= 0:
            return
        if self._span_countdown > 0:
            self._span_countdown -= 1
            return
        self._span_countdown = every - 1
        arr = np.asarray(batch, dtype=np.int64)
        k = int(arr[:, 0].max())
        d_at, a_at = acceptance.position_counts(arr[:, 0], arr[:, 1], k)
        with rt.span(
            "spectrace.verify.step",
            role=ENGINE,
            run=rt.run_by_id(run_id),
            start_time=ts,
            links=self._links(request_ids),
            attributes={
                "spectrace.step": step_no,
                "spectrace.batch_size": len(batch),
                "spectrace.drafted_by_position": [int(x) for x in d_at],
                "spectrace.accepted_by_position": [int(x) for x in a_at],
            },
        ):
            pass

    # -- agreement ---------------------------------------------------------------

    def check_agreement(self, rt, *, exclude: str | None = None) -> None:
        """VERIFY_DISAGREEMENT for finished runs where this process saw both sides.

        Checked once per run, when the run is over (a new run starts, or the
        process exits), so a step in flight between worker and engine core
        never counts as a disagreement.
        """
        self.drain(rt)
        with self._lock:
            runs = {run for source, run, _ in self.totals if run != exclude and run not in self._checked}
            for run_id in runs:
                self._checked.add(run_id)
                findings = self._agreement(run_id)
                if findings:
                    audit_live.emit_findings(rt, findings, role=ENGINE, run=rt.run_by_id(run_id))

    def _agreement(self, run_id: str) -> list[Finding]:
        findings = []
        engine = self.totals.get((ENGINE, run_id, None))
        if engine is None:
            return findings
        for (source, run, rank), worker in list(self.totals.items()):
            if source != WORKER or run != run_id or worker == engine:
                continue
            findings.append(
                Finding(
                    code="VERIFY_DISAGREEMENT",
                    severity="error",
                    component="verification",
                    model_role="draft",
                    message=f"engine core counted {engine[0]} drafted / {engine[1]} accepted, "
                    f"worker rank {rank} verified {worker[0]} / {worker[1]}",
                    evidence={"engine_core": engine, "worker": worker, "rank": rank, "run_id": run_id},
                    fix="the numbers vLLM reports are not what the device verified; report to vLLM",
                )
            )
        return findings


def _take(queue: deque) -> list:
    return [queue.popleft() for _ in range(len(queue))]


MAX_BUFFERED_STEPS = 100_000


# -- hooks (hot path: appends references and ints, nothing else) ----------------------


def wrap_update_from_output(original, hook: str):
    def update_from_output(self, scheduler_output, model_runner_output, *args, **kwargs):
        drafts = scheduler_output.scheduled_spec_decode_tokens
        if drafts:
            try:
                rt = runtime._runtime or runtime.get()  # get(): only in a freshly forked child
                if rt is not None:
                    if hook in rt.settings.inject_fault:
                        raise runtime.InjectedFault(hook)
                    capture = rt.verify
                    sampled = model_runner_output.sampled_token_ids
                    capture.engine_step_no += 1
                    if len(capture.engine_steps) >= MAX_BUFFERED_STEPS:
                        capture.dropped_steps += 1
                    else:
                        capture.engine_steps.append(
                            (
                                time.time_ns(),
                                capture.engine_step_no,
                                rt.run.run_id if rt.run is not None else None,
                                drafts,
                                list(map(len, sampled)) if sampled else None,
                                model_runner_output.req_id_to_index,
                                scheduler_output.scheduled_cached_reqs,
                                scheduler_output.num_invalid_spec_tokens,
                                self.num_sampled_tokens_per_step,
                            )
                        )
            except Exception as exc:
                runtime.count_hook_error(hook, exc)
        return original(self, scheduler_output, model_runner_output, *args, **kwargs)

    return update_from_output


def wrap_add_request(original, hook: str):
    def add_request(self, request, *args, **kwargs):
        try:
            rt = runtime._runtime or runtime.get()
            if rt is not None:
                if hook in rt.settings.inject_fault:
                    raise runtime.InjectedFault(hook)
                capture = rt.verify
                flags = capture.request_flags
                if len(flags) >= _MAX_REQUEST_FLAGS:
                    flags.pop(next(iter(flags)))
                params = request.sampling_params
                flags[request.request_id] = (
                    bool(params is not None and params.temperature == 0),
                    bool(request.use_structured_output),
                )
                headers = getattr(request, "trace_headers", None)
                if headers:  # vLLM's own tracing is on: remember the request's llm_request trace
                    contexts = capture.request_traces
                    if len(contexts) >= _MAX_REQUEST_FLAGS:
                        contexts.pop(next(iter(contexts)))
                    contexts[request.request_id] = dict(headers)
        except Exception as exc:
            runtime.count_hook_error(hook, exc)
        return original(self, request, *args, **kwargs)

    return add_request


def wrap_bookkeeping_sync(original, hook: str):
    def _bookkeeping_sync(self, scheduler_output, *args, **kwargs):
        result = original(self, scheduler_output, *args, **kwargs)
        drafts = scheduler_output.scheduled_spec_decode_tokens
        if drafts:
            try:
                rt = runtime._runtime or runtime.get()
                if rt is not None:
                    if hook in rt.settings.inject_fault:
                        raise runtime.InjectedFault(hook)
                    valid, row_of = bookkeeping_sampled(result)
                    capture = rt.verify
                    if valid and len(capture.worker_steps) < MAX_BUFFERED_STEPS:
                        capture.worker_steps.append(
                            (time.time_ns(), rt.run.run_id if rt.run is not None else None, rt.ranks.get(WORKER), drafts, list(map(len, valid)), row_of)
                        )
            except Exception as exc:
                runtime.count_hook_error(hook, exc)
        return result

    return _bookkeeping_sync


HOOKS = [
    Hook("engine_core.verify", "vllm.v1.core.sched.scheduler:Scheduler.update_from_output", wrap_update_from_output),
    Hook("engine_core.add_request", "vllm.v1.core.sched.scheduler:Scheduler.add_request", wrap_add_request),
    Hook("worker.verify", "vllm.v1.worker.gpu_model_runner:GPUModelRunner._bookkeeping_sync", wrap_bookkeeping_sync),
]
