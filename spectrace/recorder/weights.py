"""What vLLM loaded into each model, and the drafter's model facts after load (worker).

vLLM 0.32 sites:

- ``model_executor/model_loader/default_loader.py::DefaultModelLoader.load_weights(model, model_config)``
  loads one model (the target from ``GPUModelRunner.load_model``, the drafter from the proposer's
  ``load_model`` -> ``get_model``; ``model_config.runner_type == "draft"`` for the drafter). Its
  hook opens a :class:`WeightLoad` for the call.
- ``model_executor/models/utils.py::AutoWeightsLoader.load_weights`` returns the names of the
  parameters it filled. Every model class that loads through it (Qwen3, Llama, EAGLE3, DFlash,
  ...) does so for the whole model; its hook copies that set when ``self.module`` is the model
  being loaded, before vLLM's own check (``track_weights_loading``) adds its exempt names to it.
  EAGLE3's and DFlash's ``load_weights`` return nothing to vLLM, so vLLM's check never sees them.

After ``Worker.load_model`` (``recorder.worker``), :func:`record_model_weights` reads what each model holds and
loaded (its checkpoint's headers, its parameters, the names filled, its rotary modules, what it shares with the
target) for the collector to judge (``spectrace.collector.judging``: one ``model_weights`` row per model, and the
drafter's parameters no tensor reached, tensors nothing loaded, the RoPE its rotary modules run with against the
target's). When vLLM refuses the load, :func:`record_failed_load` reads what was captured until then.
"""

from __future__ import annotations

import time
from typing import Any

from spectrace.load_facts import FAILED_LOAD, WEIGHTS
from spectrace.recorder.around import around
from spectrace.recorder.hooks import Hook
from spectrace.vllm_objects import layers as read_layers
from spectrace.vllm_objects import rope as read_rope
from spectrace.vllm_objects import weights as read_weights
from spectrace.vllm_objects.configs import config_to_dict, draft_runtime, model_configs, read_declared, same_model

ACTIVE = "active"  # rt.weight_loads key of the load in progress


class WeightLoad:
    """One ``DefaultModelLoader.load_weights`` call: the model, its role, the names vLLM filled."""

    __slots__ = ("role", "model", "quantization", "loaded")

    def __init__(self, role: str, model: Any, quantization: str | None) -> None:
        self.role = role
        self.model = model
        self.quantization = quantization
        self.loaded: set[str] | None = None


def _begin(rt, loader, model, model_config, *args, **kwargs) -> WeightLoad:
    role = "draft" if getattr(model_config, "runner_type", None) == "draft" else "target"
    quantization = getattr(model_config, "quantization", None)
    load = WeightLoad(role, model, str(quantization) if quantization is not None else None)
    rt.weight_loads[ACTIVE] = load
    return load


def _end(rt, load, result, *args, **kwargs) -> None:
    if load is not None:
        rt.weight_loads.pop(ACTIVE, None)
        rt.weight_loads[load.role] = load


def _failed(rt, load, exc, *args, **kwargs) -> None:
    _end(rt, load, None)


# DefaultModelLoader.load_weights: one model's load, opened and closed
wrap_load_weights = around(before=_begin, after=[(None, _end)], failed=_failed)


def _autoloaded(rt, state, result, loader, *args, **kwargs) -> None:
    load = rt.weight_loads.get(ACTIVE)
    if load is not None and getattr(loader, "module", None) is load.model and isinstance(result, (set, frozenset)):
        load.loaded = (load.loaded or set()) | set(result)  # a copy: vLLM's check adds to the set it returned


# AutoWeightsLoader.load_weights: the parameter names it filled
wrap_autoload = around(after=[(None, _autoloaded)])


HOOKS = [
    Hook("worker.load_weights", "vllm.model_executor.model_loader.default_loader:DefaultModelLoader.load_weights", wrap_load_weights),
    Hook("worker.weights_loaded", "vllm.model_executor.models.utils:AutoWeightsLoader.load_weights", wrap_autoload),
]


# -- after load ---------------------------------------------------------------------------


def _model_facts(role: str, model_config: Any, model: Any, load: WeightLoad | None, own_checkpoint: bool) -> dict[str, Any]:
    """What one built model holds and loaded, as plain values."""
    started = time.perf_counter()
    manifest = read_weights.read_manifest(model_config.model)
    manifest_ms = (time.perf_counter() - started) * 1000
    return {
        "model_role": role,
        "model": str(model_config.model),
        "manifest": manifest,
        "manifest_ms": round(manifest_ms, 3),
        "own_checkpoint": own_checkpoint,
        "quantization": load.quantization if load is not None else None,
        "parameters": read_weights.parameter_names(model),
        "loaded": set(load.loaded) if load is not None and load.model is model and load.loaded is not None else None,
        "inert": read_weights.inert_parameters(model),
        "declared": read_declared(model_config.model),
        "resolved": config_to_dict(model_config.hf_config),
        "runtime_dtype": read_weights.model_dtype(model),
        "rotary": read_rope.model_rotary(model),
    }


def record_model_weights(rt, worker: Any, role: str, rank: int | None, span: Any = None) -> None:
    """What target and drafter loaded, for the ``model_weights`` rows and the drafter's weight, head, runtime-RoPE
    and draft-settings audits."""
    vllm_config = worker.vllm_config
    runner = worker.model_runner
    models = {"target": read_layers.target_model(runner), "draft": read_layers.draft_model(runner)}
    configs = model_configs(vllm_config)
    spec = vllm_config.speculative_config
    read = []
    for model_role, model_config in configs.items():
        model = models.get(model_role)
        if model is None:
            continue
        # a drafter in the target's checkpoint (MTP) leaves the target's tensors to the target
        own_checkpoint = model_role == "target" or not same_model(str(model_config.model), str(configs["target"].model))
        read.append(_model_facts(model_role, model_config, model, rt.weight_loads.get(model_role), own_checkpoint))
    own = getattr(models["draft"], "has_own_lm_head", None) if models.get("draft") is not None else None
    rt.weight_loads.clear()  # hold no model past its engine's load
    rt.facts(WEIGHTS, {
        "models": read,
        "shared": read_weights.shared_with_target(models["draft"], models["target"]),
        "method": spec.method if spec is not None else None,
        "has_own_lm_head": own if isinstance(own, bool) else None,
        # draft settings the loaded runner ignores (speculative max_model_len, draft TP): the runtime answers
        "draft_settings": draft_runtime(vllm_config, runner),
    }, role=role, rank=rank, span=span)
    rt.flush()


def record_failed_load(rt, worker: Any, role: str, rank: int | None, span: Any = None) -> None:
    """vLLM refused a load: what the drafter's loader filled before it raised, for the weight audit."""
    load = rt.weight_loads.get("draft")
    rt.weight_loads.clear()
    draft = model_configs(worker.vllm_config).get("draft")
    if load is None or load.loaded is None or draft is None:
        return
    rt.facts(FAILED_LOAD, {
        "manifest": read_weights.read_manifest(draft.model),
        "parameters": read_weights.parameter_names(load.model),
        "loaded": set(load.loaded),
        "quantization": load.quantization,
        "inert": read_weights.inert_parameters(load.model),
    }, role=role, rank=rank, span=span)
    rt.flush()
