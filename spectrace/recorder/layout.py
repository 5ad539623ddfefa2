"""Reads the runtime attention layout of the loaded models (worker, after ``load_model``).

What each layer executes is read by ``spectrace.vllm_objects.layers``, with each model's declared and resolved
config; the collector judges it (``spectrace.collector.judging``: the plans, ``attention_layout`` and
``LAYOUT_MISMATCH``, the same two calls ``spectrace doctor`` makes on models built on the meta device).
"""

from __future__ import annotations

from typing import Any

from spectrace.load_facts import BUILD_ERROR, LAYOUT
from spectrace.vllm_objects import layers as read_layers
from spectrace.vllm_objects.configs import config_to_dict, model_configs, read_declared


def record_runtime_layout(rt, worker: Any, role: str, rank: int | None, span: Any = None) -> None:
    """What target and drafter run, per layer, for the layout judge."""
    vllm_config = worker.vllm_config
    runtime = read_layers.runtime_layers(read_layers.loaded_models(worker.model_runner), vllm_config)
    configs = model_configs(vllm_config)
    spec = vllm_config.speculative_config
    models = [
        {"model_role": model_role, "declared": read_declared(configs[model_role].model),
         "resolved": config_to_dict(configs[model_role].hf_config), "layers": layers}
        for model_role, layers in runtime.items() if configs.get(model_role) is not None and layers
    ]
    if rt.verify is not None:
        rt.verify.note_layout(runtime)  # the engine core's run context, when it runs in this process
    rt.facts(LAYOUT, {"models": models, "method": spec.method if spec is not None else None}, role=role, rank=rank,
             span=span)
    rt.flush()


def record_load_error(rt, worker: Any, error: BaseException, role: str, rank: int | None, span: Any = None) -> None:
    """vLLM refused to build the model: its error with the drafter's configs, for LOAD_FAILED in config terms."""
    draft = model_configs(worker.vllm_config).get("draft")
    rt.facts(BUILD_ERROR, {
        "error": f"{type(error).__name__}: {error}",
        "declared": read_declared(draft.model) if draft is not None else None,
        "resolved": config_to_dict(draft.hf_config) if draft is not None else None,
    }, role=role, rank=rank, span=span)
    rt.flush()
