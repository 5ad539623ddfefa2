"""Worker-side verification and step times on the V2 model runner (vLLM's CUDA default in 0.32, the only runner
from 0.34, where the CPU runner ``v1/worker/cpu/model_runner.py`` subclasses it).

vLLM 0.32 and 0.34 sites (``v1/worker/gpu/model_runner.py``, ``v1/worker/gpu/async_utils.py``):

- ``GPUModelRunner.execute_model`` runs the target forward of a step (its host time opens the step's
  ``StepTiming``, as on V1); vLLM's own dummy and profiling runs (``dummy_run=True``) are left alone.

- ``GPUModelRunner.sample_tokens`` verifies the drafts of the batch that
  ``execute_model`` prepared (``execute_model_state.input_batch``, whose
  ``num_draft_tokens_per_req`` is a host array: what the device verifies per row, after
  any adaptive trimming of the draft budget) and returns an ``AsyncOutput`` whose copy
  to the host is still in flight. The hook keeps a reference to that host array on
  the ``AsyncOutput``; it reads nothing from the device. Its host time (sampling, the
  drafter's proposal, bookkeeping) closes the step's ``StepTiming``; V2 drafts inside it
  (``speculator.propose``, one class per method), so the drafting share of the step is
  not timed apart on V2 (``draft_ns`` stays 0).
- ``AsyncOutput.get_output`` waits for that copy (vLLM's own wait) and trims each
  row's sampled tokens to what was accepted + 1. After it returns, the hook appends
  the row lengths to the same worker buffer the V1 hook uses; the background drain
  counts them with the V1 rules (accepted = sampled - 1, rows without drafts or
  without output skipped) and the engine core's count is checked against them
  (``VERIFY_DISAGREEMENT``).

No device synchronisation is added: both reads are of host objects vLLM already holds.
"""

from __future__ import annotations

import time

from spectrace.recorder import runtime
from spectrace.recorder.hooks import Hook
from spectrace.recorder.verify.hooks import worker_step, wrap_execute_model

_DRAFTS = "_spectrace_drafts"  # set on an AsyncOutput: its rows' draft counts


def wrap_execute_model_v2(original, hook: str):
    """V2's ``execute_model``: timed as V1's (``wrap_execute_model``), but for vLLM's dummy runs (warm-up, profiling,
    data-parallel padding: ``dummy_run=True``), which no ``sample_tokens`` follows."""
    timed = wrap_execute_model(original, hook)

    def execute_model(self, scheduler_output, *args, **kwargs):
        if kwargs.get("dummy_run") or (len(args) > 1 and args[1] is True):
            return original(self, scheduler_output, *args, **kwargs)
        return timed(self, scheduler_output, *args, **kwargs)

    return execute_model


def wrap_sample_tokens(original, hook: str):
    def sample_tokens(self, *args, **kwargs):
        drafts = None
        rt = None
        try:
            rt = runtime.active(hook)
            if rt is not None:
                state = self.execute_model_state
                batch = state.input_batch if state is not None else None
                if batch is not None and batch.num_draft_tokens:
                    drafts = batch.num_draft_tokens_per_req
        except Exception as exc:
            runtime.count_hook_error(hook, exc)
        started = time.perf_counter_ns()
        output = original(self, *args, **kwargs)
        elapsed = time.perf_counter_ns() - started
        try:
            if drafts is not None and hasattr(output, "get_output"):  # AsyncOutput: counted when vLLM reads it
                setattr(output, _DRAFTS, drafts)
            step = rt.verify.open_timing if rt is not None else None
            if step is not None and not step.done:  # the step execute_model opened: its sampling and drafting
                step.sample_ns += elapsed
                step.done = True
        except Exception as exc:
            runtime.count_hook_error(hook, exc)
        return output

    return sample_tokens


def wrap_get_output(original, hook: str):
    def get_output(self, *args, **kwargs):
        output = original(self, *args, **kwargs)
        try:
            drafts = self.__dict__.pop(_DRAFTS, None)
            rt = runtime.active(hook) if drafts is not None else None
            if rt is not None:  # rows aligned with the drafts per row: no request-id index
                worker_step(rt, drafts, output.sampled_token_ids, None)
        except Exception as exc:
            runtime.count_hook_error(hook, exc)
        return output

    return get_output


HOOKS = [
    Hook("worker.execute_model_v2", "vllm.v1.worker.gpu.model_runner:GPUModelRunner.execute_model", wrap_execute_model_v2),
    Hook("worker.verify_v2.sample", "vllm.v1.worker.gpu.model_runner:GPUModelRunner.sample_tokens", wrap_sample_tokens),
    Hook("worker.verify_v2", "vllm.v1.worker.gpu.async_utils:AsyncOutput.get_output", wrap_get_output),
]
