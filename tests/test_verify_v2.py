"""The V2 model runner's worker-side count, on CPU: vLLM's own ``AsyncOutput.get_output`` and
``ModelRunnerOutput`` (they import on CPU; only the CUDA copy event is stood in for, since
constructing one needs a GPU) run through spectrace's hooks, and the background drain counts
with the same rules as the V1 hook. The live V2 check is ``make gpu-check``."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from spectrace.vllm_objects.steps import BOOKKEEPING_FIELDS
from spectrace.settings import Settings
from spectrace.recorder import runtime, verify
from spectrace.recorder.verify import hooks_v2 as verify_v2

from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.worker.gpu.async_utils import AsyncOutput  # noqa: E402

pytestmark = pytest.mark.vllm  # vLLM's own classes, no engine

K = 3
REQ_IDS = ["a", "b", "c", "d"]
DRAFTS = np.array([3, 3, 0, 2], dtype=np.int32)  # c is a prefill row; d had its budget trimmed to 2
NUM_SAMPLED = np.array([4, 1, 1, 2], dtype=np.int32)  # a: all 3 accepted, b: none, d: 1 of 2
ACCEPTED = [3, 0, 1]  # rows a, b, d


class _CopyDone:
    """Stands in for the CUDA event AsyncOutput waits on (the copy is already done here)."""

    def synchronize(self) -> None:
        pass


def _async_output() -> AsyncOutput:
    """A real AsyncOutput in the state its constructor leaves on a GPU once the copy is done."""
    out = object.__new__(AsyncOutput)
    out.model_runner_output = ModelRunnerOutput(req_ids=list(REQ_IDS), req_id_to_index={r: i for i, r in enumerate(REQ_IDS)})
    out.copy_event = _CopyDone()
    out.sampled_token_ids = np.arange(len(REQ_IDS) * (K + 1)).reshape(len(REQ_IDS), K + 1)
    out.num_sampled_tokens_np = NUM_SAMPLED
    out.sampling_mask_tensors = None
    out.num_nans = None
    out.logprobs_tensors = None
    out.prompt_logprobs_dict = {}
    out.prompt_token_id_logprobs_dict = {}
    out.pending_aux_output = None
    out._has_fault = None
    return out


@pytest.fixture
def rt(tmp_path):
    rt = runtime.start(Settings(enabled=True, dir=tmp_path, exporters=("duckdb",), pipeline="thread"), hooks=[],
                       make_capture=verify.VerifyCapture)
    rt.set_run(runtime.Run(run_id="v2-run", traceparent=""))
    rt.ranks[verify.WORKER] = 0
    yield rt
    runtime.stop()


def _v2_step(rt) -> ModelRunnerOutput:
    batch = SimpleNamespace(num_draft_tokens=int(DRAFTS.sum()), num_draft_tokens_per_req=DRAFTS)
    runner = SimpleNamespace(execute_model_state=SimpleNamespace(input_batch=batch))
    sample_tokens = verify_v2.wrap_sample_tokens(lambda self, grammar_output: _async_output(), "worker.verify_v2.sample")
    get_output = verify_v2.wrap_get_output(AsyncOutput.get_output, "worker.verify_v2")
    pending = sample_tokens(runner, None)
    assert isinstance(pending, AsyncOutput) and not rt.verify.worker_steps  # nothing counted before the copy is read
    return get_output(pending)


def test_v2_worker_count_follows_vllms_trimmed_rows(rt):
    output = _v2_step(rt)
    assert [len(row) for row in output.sampled_token_ids] == NUM_SAMPLED.tolist()  # vLLM's own trimming ran
    rt.drain.drain(rt)
    drafted = int(DRAFTS[DRAFTS > 0].sum())
    assert rt.drain.judge.totals[(verify.WORKER, "v2-run", 0)] == [drafted, sum(ACCEPTED)]


def test_v1_and_v2_hooks_count_the_same_step_alike(rt):
    _v2_step(rt)
    # the same step as the V1 runner's _bookkeeping_sync hands it over (named fields, dict of drafts)
    result = [None] * len(BOOKKEEPING_FIELDS)
    result[BOOKKEEPING_FIELDS.index("valid_sampled_token_ids")] = [[0] * n for n in NUM_SAMPLED.tolist()]
    result[BOOKKEEPING_FIELDS.index("req_id_to_index_output_copy")] = {r: i for i, r in enumerate(REQ_IDS)}
    drafts = {r: [7] * int(n) for r, n in zip(REQ_IDS, DRAFTS) if n}
    scheduler_output = SimpleNamespace(scheduled_spec_decode_tokens=drafts)
    bookkeeping = verify.wrap_bookkeeping_sync(lambda self, so, *a: tuple(result), "worker.verify")
    rt.set_run(runtime.Run(run_id="v1-run", traceparent=""))
    bookkeeping(None, scheduler_output)
    rt.drain.drain(rt)
    assert rt.drain.judge.totals[(verify.WORKER, "v1-run", 0)] == rt.drain.judge.totals[(verify.WORKER, "v2-run", 0)]


def test_v2_hooks_never_raise_into_vllm(rt):
    broken = SimpleNamespace(execute_model_state=SimpleNamespace(input_batch=None))
    sample_tokens = verify_v2.wrap_sample_tokens(lambda self, g: "vllm's output", "worker.verify_v2.sample")
    assert sample_tokens(broken, None) == "vllm's output"
    odd = SimpleNamespace(execute_model_state=SimpleNamespace(input_batch=SimpleNamespace(num_draft_tokens="x")))
    assert sample_tokens(odd, None) == "vllm's output"
    assert rt.errors == {"worker.verify_v2.sample": 1}  # no batch: nothing to do; a malformed one: counted


@pytest.mark.parametrize("hook", ["worker.verify_v2.sample", "worker.verify_v2"])
def test_an_injected_fault_in_a_v2_hook_is_counted_and_vllms_output_unchanged(tmp_path, hook):
    rt = runtime.start(Settings(enabled=True, dir=tmp_path, exporters=("duckdb",), inject_fault=hook, pipeline="thread"), hooks=[],
                       make_capture=verify.VerifyCapture)
    try:
        output = _v2_step(rt)
        assert [len(row) for row in output.sampled_token_ids] == NUM_SAMPLED.tolist()
        rt.drain.drain(rt)
        assert rt.errors == {hook: 1}
        assert not any(source == verify.WORKER for source, _, _ in rt.drain.judge.totals)  # that step was not counted
    finally:
        runtime.stop()
