"""What a hidden-state tap captures, read from vLLM 0.32's model code for the architectures it taps (#58).

``spectrace.vllm_objects.taps.capture_point`` classifies what the target decoder's ``forward`` appends to its
auxiliary hidden states; doctor's taps section and the live ``hidden_state_taps`` row carry it
(tests/test_doctor_taps.py, tests/test_conventions_live.py)."""

from __future__ import annotations

import importlib

import pytest

from spectrace.vllm_objects.taps import CAPTURE_RESIDUAL, CAPTURE_RETURNED, _capture_of_class

pytestmark = pytest.mark.vllm  # imports vLLM's model modules

CASES = {
    # _maybe_add_hidden_state(aux, idx + 1, hidden_states, residual) after each layer: hidden_states + residual
    ("llama", "LlamaModel"): (CAPTURE_RESIDUAL, "llama.LlamaModel.forward"),
    ("qwen2", "Qwen2Model"): (CAPTURE_RESIDUAL, "qwen2.Qwen2Model.forward"),
    ("qwen3", "Qwen3Model"): (CAPTURE_RESIDUAL, "qwen2.Qwen2Model.forward"),  # inherited
    ("qwen3_moe", "Qwen3MoeModel"): (CAPTURE_RESIDUAL, "qwen3_moe.Qwen3MoeModel.forward"),
    ("gpt_oss", "GptOssModel"): (CAPTURE_RESIDUAL, "gpt_oss.GptOssModel.forward"),
    # its own loop: aux_hidden_state = hidden_states + residual before layer idx
    ("deepseek_v2", "DeepseekV2Model"): (CAPTURE_RESIDUAL, "deepseek_v2.DeepseekV2Model.forward"),
    # aux_hidden_states.append(hidden_states): what its parallel-residual layers return
    ("cohere2_moe", "Cohere2MoeModel"): (CAPTURE_RETURNED, "cohere2_moe.Cohere2MoeModel.forward"),
}


@pytest.mark.parametrize("module,name", sorted(CASES))
def test_the_capture_point_is_read_from_the_model_code(module, name):
    cls = getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), name)
    point, rule = _capture_of_class(cls)
    expected, where = CASES[module, name]
    assert (point, rule) == (expected, f"vllm.model_executor.models.{where}")


def test_a_forward_that_appends_nothing_recognised_is_unknown_never_guessed():
    class Decoder:
        def forward(self, x):
            return x

    assert _capture_of_class(Decoder)[0] is None
