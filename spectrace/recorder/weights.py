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

After ``Worker.load_model`` (``recorder.worker``), :func:`record_model_weights` writes one
``model_weights`` row per model and judges the drafter (``spectrace.audit``): parameters no tensor
reached, tensors nothing loaded, the RoPE its rotary modules run with against the target's. When
vLLM refuses the load, :func:`record_failed_load` judges what was captured until then.
"""

from __future__ import annotations

import json
import time
from typing import Any

from spectrace import audit
from spectrace.audit.draft_settings import audit_draft_settings
from spectrace.audit.dtype import declared_dtype
from spectrace.audit.rope import audit_rope, rope_of, runtime_rope
from spectrace.audit.weights import audit_head, audit_weights, target_head_shape, unloaded_parameters, unused_tensors
from spectrace.recorder import audit_live
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


def _model_facts(
    role: str, model_config: Any, model: Any, load: WeightLoad | None, shared: dict[str, str | None], own_checkpoint: bool
) -> tuple[dict[str, Any], Any, list[str] | None]:
    started = time.perf_counter()
    manifest = read_weights.read_manifest(model_config.model)
    manifest_ms = (time.perf_counter() - started) * 1000
    parameters = read_weights.parameter_names(model) if model is not None else None
    loaded = load.loaded if load is not None and load.model is model else None
    declared = read_declared(model_config.model)
    rotary = read_rope.model_rotary(model)
    rope = rope_of(config_to_dict(model_config.hf_config))
    row = {
        "model_role": role,
        "model": str(model_config.model),
        "checkpoint_files": len(manifest.files),
        "checkpoint_tensors": len(manifest.tensors),
        "checkpoint_dtypes": json.dumps(manifest.dtypes()),
        "manifest_error": manifest.error,
        "manifest_ms": round(manifest_ms, 3),
        "quantization": load.quantization if load is not None else None,
        "parameters": len(parameters) if parameters is not None else None,
        "loaded": len(loaded) if loaded is not None else None,
        "unloaded": json.dumps(
            unloaded_parameters(parameters, loaded, shared, read_weights.inert_parameters(model))
            if loaded is not None and parameters else None
        ),
        "unused_tensors": json.dumps(unused_tensors(manifest.tensors, loaded) if loaded is not None and own_checkpoint else None),
        "embed_tokens": shared.get("embed_tokens"),
        "lm_head": shared.get("lm_head"),
        "declared_dtype": declared_dtype(declared),
        "runtime_dtype": read_weights.model_dtype(model) if model is not None else None,
        "declared_rope": json.dumps(rope.as_dict() if rope is not None else None),
        "runtime_rope": json.dumps(rotary),
    }
    return row, manifest, parameters


def record_model_weights(rt, worker: Any, role: str, rank: int | None, span: Any = None) -> None:
    """``model_weights`` rows for target and drafter, and the drafter's weight and runtime-RoPE findings."""
    vllm_config = worker.vllm_config
    runner = worker.model_runner
    models = {"target": read_layers.target_model(runner), "draft": read_layers.draft_model(runner)}
    configs = model_configs(vllm_config)
    spec = vllm_config.speculative_config
    method = spec.method if spec is not None else None
    shared = read_weights.shared_with_target(models["draft"], models["target"])
    rows, findings, manifests = [], [], {}
    for model_role, model_config in configs.items():
        model = models.get(model_role)
        if model is None:
            continue
        load = rt.weight_loads.get(model_role)
        own_checkpoint = model_role == "target" or not same_model(str(model_config.model), str(configs["target"].model))
        row, manifest, parameters = _model_facts(
            model_role, model_config, model, load, shared if model_role == "draft" else {}, own_checkpoint
        )
        rows.append(row)
        manifests[model_role] = manifest if manifest.error is None and own_checkpoint else None
        if model_role == "draft":
            # a drafter in the target's checkpoint (MTP) leaves the target's tensors to the target
            findings += audit_weights(
                "draft",
                tensors=manifest.tensors if manifest.error is None and own_checkpoint else None,
                parameters=parameters,
                loaded=load.loaded if load is not None and load.model is model else None,
                shared=shared,
                quantization=row["quantization"],
                inert=read_weights.inert_parameters(model),
            )
    if models.get("draft") is not None and "draft" in manifests:
        # the drafter's own head against the module it computes its logits with (after vLLM's sharing)
        own = getattr(models["draft"], "has_own_lm_head", None)
        target = manifests.get("target")
        findings += audit_head("draft", tensors=manifests["draft"].tensors if manifests["draft"] else None,
                               shared=shared, has_own_lm_head=own if isinstance(own, bool) else None,
                               target_shape=target_head_shape(target.tensors) if target else None)
    findings += _runtime_rope(method, configs, models)
    # draft settings the loaded runner ignores (speculative max_model_len, draft TP): the runtime answers
    settings = draft_runtime(vllm_config, runner)
    findings += audit_draft_settings(**settings) if settings else []
    rt.weight_loads.clear()  # hold no model past its engine's load
    rt.records("model_weights", rows, role=role, rank=rank)
    audit_live.emit_findings(rt, findings, role=role, span=span, rank=rank)
    rt.flush()


def _runtime_rope(method: str | None, configs: dict[str, Any], models: dict[str, Any]) -> list[audit.Finding]:
    """The rotary modules' RoPE compared, when the configs agree (the config finding is the frontend's)."""
    if "draft" not in configs or models.get("draft") is None:
        return []
    from_config = audit_rope(
        method,
        rope_of(config_to_dict(configs["target"].hf_config)),
        rope_of(config_to_dict(configs["draft"].hf_config)),
    )
    if from_config:
        return []
    return audit_rope(
        method,
        runtime_rope(read_rope.model_rotary(models["target"])),
        runtime_rope(read_rope.model_rotary(models["draft"])),
        where="built rotary modules",
    )


def record_failed_load(rt, worker: Any, role: str, rank: int | None, span: Any = None) -> None:
    """vLLM refused a load: the drafter's weight findings from what its loader filled before it raised."""
    load = rt.weight_loads.get("draft")
    rt.weight_loads.clear()
    draft = model_configs(worker.vllm_config).get("draft")
    if load is None or load.loaded is None or draft is None:
        return
    manifest = read_weights.read_manifest(draft.model)
    findings = audit_weights(
        "draft",
        tensors=manifest.tensors if manifest.error is None else None,
        parameters=read_weights.parameter_names(load.model),
        loaded=load.loaded,
        shared={},
        quantization=load.quantization,
        inert=read_weights.inert_parameters(load.model),
    )
    audit_live.emit_findings(rt, findings, role=role, span=span, rank=rank)
    rt.flush()
