"""The per-step verification hooks (V1 model runner and the engine core's scheduler).

Hot path: each hook appends one record (``spectrace.recorder.verify.capture``) of references
and ints vLLM already holds on the host; no device synchronisation, no per-request Python
loop on the engine's thread. Everything else happens in the drain, on the flush thread or in
the pipeline process. Each per-step hook call also drops one record the shipper sent or the
drain counted (``Capture.release_one``; ``update_from_output`` two, as it appends two), so that
a step's objects are freed on vLLM's thread, among its allocations, as without tracing.

Engine core (vLLM 0.32, ``v1/core/sched/scheduler.py``)
    ``Scheduler.update_from_output(scheduler_output, model_runner_output)`` runs once per
    step for either model runner, with or without async scheduling: one ``EngineStep``
    (the step's draft dict, the output's request ids and cached-request data — new objects every step —
    plus the per-request sampled-token counts taken with one C-level ``map(len, ...)``
    before vLLM trims anything). ``Scheduler.add_request`` notes once per request whether
    it is greedy and structured, and keeps references to its sampling parameters, LoRA request
    and prefill statistics (``RequestNote``: its slice, read in the drain).
    ``Scheduler.update_draft_token_ids`` (synchronous scheduling) hands over the drafts the worker
    proposed after a step: one ``Proposal`` (the list of draft lists); the drain compares what was
    proposed with what the following steps verified (trimmed by the token budget, or dropped).

Worker (V1 model runner, ``v1/worker/gpu_model_runner.py``)
    ``GPUModelRunner._bookkeeping_sync`` returns the rejection sampler's host output
    (``valid_sampled_token_ids``) on synchronous scheduling: one ``WorkerStep`` with its
    lengths. Dummy and profiling runs never pass through it; prefill steps have no drafts.
    (The V2 model runner's hooks: ``hooks_v2``.)

Worker host times (V1): ``execute_model`` (the target forward), ``sample_tokens``
(verification, drafting, bookkeeping) and ``propose_draft_token_ids`` (drafting) are timed
with the host clock around the call: one ``perf_counter_ns`` pair per call into a
``StepTiming``. On CPU the host clock is the compute time; on CUDA the V1 runner's
bookkeeping copies to the host inside ``sample_tokens``, so a step's whole time is right
while its drafting share reads as launch time.

Error boundary: in every hook only the wrapped call stands outside the ``try``; every read
of a vLLM object is inside it, so a vLLM that changed shape costs a counted hook error,
never vLLM's result (tests/test_hook_boundary.py).
"""

from __future__ import annotations

import time

from spectrace.recorder import runtime
from spectrace.recorder.hooks import Hook
from spectrace.recorder.verify.capture import (
    ENGINE,
    FRONTEND,
    MAX_BUFFERED_STEPS,
    MAX_REQUEST_FLAGS,
    WORKER,
    EngineStep,
    HostStep,
    Proposal,
    RequestNote,
    StepTiming,
)
from spectrace.vllm_objects.steps import bookkeeping_sampled
from spectrace.vllm_objects.requests import think_markers

_UNREAD = object()


def wrap_update_from_output(original, hook: str):
    def update_from_output(self, scheduler_output, model_runner_output, *args, **kwargs):
        step = rt = None
        finished = 0
        try:
            rt = runtime.active(hook)
            drafts = scheduler_output.scheduled_spec_decode_tokens if rt is not None else None
            if rt is not None:
                finished = len(getattr(self, "finished_req_ids", ()))
            if drafts:
                sampled = model_runner_output.sampled_token_ids
                step = (rt, sampled, finished, (
                    time.time_ns(),
                    rt.run.run_id if rt.run is not None else None,
                    drafts,
                    list(map(len, sampled)) if sampled else None,
                    model_runner_output.req_ids,
                    scheduler_output.scheduled_cached_reqs,
                    scheduler_output.num_invalid_spec_tokens,
                    self.num_sampled_tokens_per_step,
                ))
        except Exception as exc:
            rt = None
            runtime.count_hook_error(hook, exc)
        started = time.perf_counter_ns()
        outputs = original(self, scheduler_output, model_runner_output, *args, **kwargs)
        elapsed = time.perf_counter_ns() - started
        if rt is not None:
            try:
                _host_step(rt, elapsed, step, self, model_runner_output, finished)
                if rt.verify is not None:
                    rt.verify.release_one()  # a record already shipped or counted: its step's objects freed here
            except Exception as exc:
                runtime.count_hook_error(hook, exc)
        if step is not None:
            try:
                rt, sampled, finished, (ts, run_id, drafts, sampled_lens, req_ids, cached, invalid, num_sampled) = step
                # a request that finished in this step (EOS, max_tokens, a stop token) kept only the tokens up to its
                # stop: vLLM trimmed its sampled list in place; the lengths now are what the step emitted
                done = getattr(self, "finished_req_ids", ())
                ended = list(done) if len(done) > finished else None
                emitted = list(map(len, sampled)) if sampled and ended else None
                capture = rt.verify
                capture.engine_step_no += 1
                if len(capture.engine_steps) >= MAX_BUFFERED_STEPS:
                    capture.dropped_steps += 1
                else:
                    capture.engine_steps.append(EngineStep(
                        ts, capture.engine_step_no, run_id, drafts, sampled_lens, req_ids, cached, invalid, num_sampled,
                        emitted, ended, sampled if capture.keep_sampled else None))
                    capture.release_one()
            except Exception as exc:
                runtime.count_hook_error(hook, exc)
        return outputs

    return update_from_output


def _host_step(rt, elapsed: int, step, scheduler, model_runner_output, finished: int) -> None:
    """The engine core's host time of one step: its ``schedule`` (timed by ``wrap_schedule``) and
    ``update_from_output``, with the tokens the step sampled (the rows' lengths where it verified drafts); and, for a
    step without drafts, the requests that finished in it (``finished``: how many had before), for their spans."""
    capture = rt.verify
    if capture is None:
        return
    if step is None:
        done = getattr(scheduler, "finished_req_ids", ())
        if len(done) > finished and len(capture.finished) < MAX_BUFFERED_STEPS:
            capture.finished.append((rt.run.run_id if rt.run is not None else None, time.time_ns(), list(done)))
    ns, capture.schedule_ns = capture.schedule_ns + elapsed, 0
    if len(capture.host_steps) < MAX_BUFFERED_STEPS:
        if step is not None and step[3][3] is not None:
            tokens = step[3][3]  # sampled_lens, already taken
        else:
            sampled = model_runner_output.sampled_token_ids
            tokens = len(sampled) if sampled else 0
        capture.host_steps.append(HostStep(step[3][1] if step is not None else (rt.run.run_id if rt.run is not None else None),
                                           ENGINE, ns, tokens))


def wrap_schedule(original, hook: str):
    """``Scheduler.schedule``: its host time, added to the step's ``update_from_output`` (``_host_step``; with async
    scheduling the next step's schedule may run first: the sum over steps is still whole)."""

    def schedule(self, *args, **kwargs):
        started = time.perf_counter_ns()
        result = original(self, *args, **kwargs)
        elapsed = time.perf_counter_ns() - started
        try:
            rt = runtime.active(hook)
            if rt is not None and rt.verify is not None:
                rt.verify.schedule_ns += elapsed
        except Exception as exc:
            runtime.count_hook_error(hook, exc)
        return result

    return schedule


def wrap_process_outputs(original, hook: str):
    """The frontend's ``OutputProcessor.process_outputs`` (detokenizing, stop strings, request outputs): its host
    time per call with the outputs it processed (their tokens counted in the drain). AsyncLLM processes one engine
    step's outputs in chunks; ``engine_core_timestamp`` (the step's) joins them into one step in the drain."""

    def process_outputs(self, engine_core_outputs, *args, **kwargs):
        started = time.perf_counter_ns()
        result = original(self, engine_core_outputs, *args, **kwargs)
        elapsed = time.perf_counter_ns() - started
        try:
            rt = runtime.active(hook)
            capture = rt.verify if rt is not None else None
            if capture is not None and engine_core_outputs and len(capture.host_steps) < MAX_BUFFERED_STEPS:
                stamp = args[0] if args else kwargs.get("engine_core_timestamp")
                capture.host_steps.append(HostStep(rt.run.run_id if rt.run is not None else None, FRONTEND, elapsed,
                                                   engine_core_outputs, stamp))
            if capture is not None:
                capture.release_one()
        except Exception as exc:
            runtime.count_hook_error(hook, exc)
        return result

    return process_outputs


def wrap_add_request(original, hook: str):
    markers_of: dict[int, object] = {}

    def add_request(self, request, *args, **kwargs):
        try:
            rt = runtime.active(hook)
            if rt is not None:
                capture = rt.verify
                flags = capture.request_flags
                if len(flags) >= MAX_REQUEST_FLAGS:
                    flags.pop(next(iter(flags)))
                params = request.sampling_params
                flags[request.request_id] = (
                    bool(params is not None and params.temperature == 0),
                    bool(request.use_structured_output),
                )
                if len(capture.new_requests) < MAX_REQUEST_FLAGS:  # the request's slice, read in the drain
                    markers = markers_of.get(id(self), _UNREAD)
                    if markers is _UNREAD:  # once per scheduler: the reasoning parser's think token ids
                        markers = markers_of[id(self)] = think_markers(getattr(self, "vllm_config", None))
                        capture.keep_sampled = capture.keep_sampled or markers is not None  # each step's phase
                    capture.new_requests.append(RequestNote(
                        rt.run.run_id if rt.run is not None else None, request.request_id, params,
                        request.lora_request, getattr(request, "prefill_stats", None),
                        getattr(request, "prompt_token_ids", None) if markers is not None else None, markers,
                    ))
                headers = getattr(request, "trace_headers", None)
                if headers:  # vLLM's own tracing is on: remember the request's llm_request trace
                    contexts = capture.request_traces
                    if len(contexts) >= MAX_REQUEST_FLAGS:
                        contexts.pop(next(iter(contexts)))
                    contexts[request.request_id] = dict(headers)
        except Exception as exc:
            runtime.count_hook_error(hook, exc)
        return original(self, request, *args, **kwargs)

    return add_request


def wrap_update_draft_token_ids(original, hook: str):
    def update_draft_token_ids(self, draft_token_ids, *args, **kwargs):
        try:
            rt = runtime.active(hook)
            if rt is not None:
                capture = rt.verify
                if len(capture.proposals) >= MAX_BUFFERED_STEPS:
                    capture.dropped_steps += 1
                else:
                    capture.proposals.append(Proposal(rt.run.run_id if rt.run is not None else None,
                                                      draft_token_ids.draft_token_ids))
                    capture.release_one()
        except Exception as exc:
            runtime.count_hook_error(hook, exc)
        return original(self, draft_token_ids, *args, **kwargs)

    return update_draft_token_ids


def wrap_bookkeeping_sync(original, hook: str):
    def _bookkeeping_sync(self, scheduler_output, *args, **kwargs):
        result = original(self, scheduler_output, *args, **kwargs)
        try:
            drafts = scheduler_output.scheduled_spec_decode_tokens
            rt = runtime.active(hook) if drafts else None
            if rt is not None:
                worker_step(rt, drafts, *bookkeeping_sampled(result))
        except Exception as exc:
            runtime.count_hook_error(hook, exc)
        return result

    return _bookkeeping_sync


def worker_step(rt, drafts, sampled, row_of) -> None:
    """One worker step (V1's and V2's hooks): its drafts and sampled rows, where it sampled any, under the run and
    rank; then one record let go (``Capture.release_one``)."""
    if sampled:
        rt.verify.add_worker_step(rt.run.run_id if rt.run is not None else None, rt.ranks.get(WORKER), drafts, sampled,
                                  row_of)
    rt.verify.release_one()


def wrap_execute_model(original, hook: str):
    def execute_model(self, scheduler_output, *args, **kwargs):
        started = time.perf_counter_ns()
        result = original(self, scheduler_output, *args, **kwargs)
        elapsed = time.perf_counter_ns() - started
        try:
            rt = runtime.active(hook)
            if rt is not None:
                capture = rt.verify
                step = StepTiming(
                    rt.run.run_id if rt.run is not None else None,
                    rt.ranks.get(WORKER),
                    bool(scheduler_output.scheduled_spec_decode_tokens),
                    elapsed,
                    result is not None,  # the output is here: no sample_tokens follows
                    scheduler_output.total_num_scheduled_tokens,
                    len(scheduler_output.num_scheduled_tokens),
                )
                capture.open_timing = step
                if len(capture.worker_timings) < MAX_BUFFERED_STEPS:
                    capture.worker_timings.append(step)
        except Exception as exc:
            runtime.count_hook_error(hook, exc)
        return result

    return execute_model


def _timed(field: str, done: bool):
    """A hook that adds the call's host time to the open step's ``field`` (and marks it done)."""

    def wrap(original, hook: str):
        def timed(self, *args, **kwargs):
            started = time.perf_counter_ns()
            result = original(self, *args, **kwargs)
            elapsed = time.perf_counter_ns() - started
            try:
                rt = runtime.active(hook)
                step = rt.verify.open_timing if rt is not None else None
                if step is not None:
                    setattr(step, field, getattr(step, field) + elapsed)
                    if done:
                        step.done = True
            except Exception as exc:
                runtime.count_hook_error(hook, exc)
            return result

        return timed

    return wrap


HOOKS = [
    Hook("worker.execute_model", "vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model", wrap_execute_model),
    Hook("worker.sample_tokens", "vllm.v1.worker.gpu_model_runner:GPUModelRunner.sample_tokens", _timed("sample_ns", True)),
    Hook("worker.propose_drafts", "vllm.v1.worker.gpu_model_runner:GPUModelRunner.propose_draft_token_ids", _timed("draft_ns", False)),
    Hook("engine_core.verify", "vllm.v1.core.sched.scheduler:Scheduler.update_from_output", wrap_update_from_output),
    Hook("engine_core.schedule", "vllm.v1.core.sched.scheduler:Scheduler.schedule", wrap_schedule),
    Hook("frontend.process_outputs", "vllm.v1.engine.output_processor:OutputProcessor.process_outputs", wrap_process_outputs),
    Hook("engine_core.add_request", "vllm.v1.core.sched.scheduler:Scheduler.add_request", wrap_add_request),
    Hook("engine_core.proposals", "vllm.v1.core.sched.scheduler:Scheduler.update_draft_token_ids", wrap_update_draft_token_ids),
    Hook("worker.verify", "vllm.v1.worker.gpu_model_runner:GPUModelRunner._bookkeeping_sync", wrap_bookkeeping_sync),
]
