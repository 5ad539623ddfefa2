"""Worker-side verification on the V2 model runner (vLLM's CUDA default in 0.32).

vLLM 0.32 sites (``v1/worker/gpu/model_runner.py``, ``v1/worker/gpu/async_utils.py``):

- ``GPUModelRunner.sample_tokens`` verifies the drafts of the batch that
  ``execute_model`` prepared (``execute_model_state.input_batch``, whose
  ``num_draft_tokens_per_req`` is a host array: what the device verifies per row, after
  any adaptive trimming of the draft budget) and returns an ``AsyncOutput`` whose copy
  to the host is still in flight. The hook keeps a reference to that host array on
  the ``AsyncOutput``; it reads nothing from the device.
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

from spectrace.tracer import runtime
from spectrace.tracer.hooks import Hook
from spectrace.tracer.verify.capture import WORKER

_DRAFTS = "_spectrace_drafts"  # set on an AsyncOutput: its rows' draft counts


def wrap_sample_tokens(original, hook: str):
    def sample_tokens(self, *args, **kwargs):
        drafts = None
        try:
            rt = runtime.active(hook)
            if rt is not None:
                state = self.execute_model_state
                batch = state.input_batch if state is not None else None
                if batch is not None and batch.num_draft_tokens:
                    drafts = batch.num_draft_tokens_per_req
        except Exception as exc:
            runtime.count_hook_error(hook, exc)
        output = original(self, *args, **kwargs)
        try:
            if drafts is not None and hasattr(output, "get_output"):  # AsyncOutput: counted when vLLM reads it
                setattr(output, _DRAFTS, drafts)
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
            if rt is not None:
                sampled = output.sampled_token_ids
                if sampled:  # rows aligned with the drafts per row: no request-id index
                    rt.verify.add_worker_step(rt.run.run_id if rt.run is not None else None, rt.ranks.get(WORKER),
                                              drafts, sampled, None)
                rt.verify.release_one()
        except Exception as exc:
            runtime.count_hook_error(hook, exc)
        return output

    return get_output


HOOKS = [
    Hook("worker.verify_v2.sample", "vllm.v1.worker.gpu.model_runner:GPUModelRunner.sample_tokens", wrap_sample_tokens),
    Hook("worker.verify_v2", "vllm.v1.worker.gpu.async_utils:AsyncOutput.get_output", wrap_get_output),
]
