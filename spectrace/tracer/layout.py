"""Runtime attention layout: what each attention layer will really execute.

Read on the worker right after ``load_model`` (vLLM 0.32):
- layers: ``vllm_config.compilation_config.static_forward_context`` (layer name ->
  ``AttentionLayerBase``), split into target and drafter by module membership
  (``model_runner.get_model()`` and ``model_runner.drafter.model``);
- window: the backend implementation's ``impl.sliding_window`` (the CPU backend
  stores -1 for "no window"), else the layer's ``sliding_window``;
- KV-cache spec: ``layer.get_kv_cache_spec(vllm_config)`` class name, kept apart
  from the attention type (vLLM may promote sliding specs to full);
- causal: the owning module's ``causal`` flag where the model has one (DFlash).
"""

from __future__ import annotations

import re
from typing import Any

from spectrace import audit
from spectrace.tracer import audit_live
from spectrace.configs import config_to_dict, read_declared

_INDEX = re.compile(r"layers\.(\d+)\.")


def _window(layer: Any) -> int | None:
    """The window the layer's attention backend will apply (None: full attention).

    Backends store it differently: the CPU backend an int (-1 for none), FlashAttention
    and FlashInfer a (left, right) pair with left = window - 1 (-1 for none). Layers
    without a backend implementation fall back to the module's own ``sliding_window``.
    """
    impl = getattr(layer, "impl", None)
    if impl is not None and hasattr(impl, "sliding_window"):
        value = impl.sliding_window
        if isinstance(value, (tuple, list)):
            left = value[0] if value else None
            return left + 1 if isinstance(left, int) and left >= 0 else None
        if isinstance(value, int):
            return value if value > 0 else None
        if value is None:
            return None
    value = getattr(layer, "sliding_window", None)
    return value if isinstance(value, int) and value > 0 else None


def _draft_model(runner: Any) -> Any:
    for name in ("drafter", "speculator"):
        proposer = getattr(runner, name, None)
        model = getattr(proposer, "model", None)
        if model is not None:
            return model
    return None


def _target_model(runner: Any) -> Any:
    try:
        return runner.get_model()
    except Exception:
        return getattr(runner, "model", None)


def runtime_layers(worker: Any) -> dict[str, list[dict[str, Any]]]:
    """Per model role, the attention layers in build order with what they execute."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    vllm_config = worker.vllm_config
    context = vllm_config.compilation_config.static_forward_context
    by_id = {id(layer): name for name, layer in context.items() if isinstance(layer, AttentionLayerBase)}
    runner = worker.model_runner
    found: dict[str, list[dict[str, Any]]] = {}
    seen: set[int] = set()
    for role, model in (("target", _target_model(runner)), ("draft", _draft_model(runner))):
        if model is None:
            continue
        causal_of: dict[int, bool] = {}
        for module in model.modules():
            attn = getattr(module, "attn", None)
            if attn is not None and isinstance(getattr(module, "causal", None), bool):
                causal_of[id(attn)] = module.causal
        layers = []
        for module in model.modules():
            if id(module) not in by_id or id(module) in seen:
                continue
            seen.add(id(module))
            name = by_id[id(module)]
            window = _window(module)
            try:
                spec = type(module.get_kv_cache_spec(vllm_config)).__name__
            except Exception:
                spec = None
            match = _INDEX.search(name)
            layers.append(
                {
                    "layer_name": name,
                    "global_index": int(match.group(1)) if match else None,
                    "runtime_type": audit.SLIDING if window else audit.FULL,
                    "runtime_window": window,
                    "kv_cache_spec": spec,
                    "causal": causal_of.get(id(module)),
                }
            )
        found[role] = layers
    return found


def _model_configs(vllm_config: Any) -> dict[str, Any]:
    configs = {"target": vllm_config.model_config}
    spec = vllm_config.speculative_config
    draft = getattr(spec, "draft_model_config", None) if spec is not None else None
    if draft is not None:
        configs["draft"] = draft
    return configs


def record_runtime_layout(rt, worker: Any, role: str, rank: int | None, span: Any = None) -> None:
    """attention_layout rows for target and drafter, and LAYOUT_MISMATCH findings."""
    vllm_config = worker.vllm_config
    runtime = runtime_layers(worker)
    configs = _model_configs(vllm_config)
    rows = []
    findings = []
    for model_role, layers in runtime.items():
        model_config = configs.get(model_role)
        if model_config is None or not layers:
            continue
        declared = read_declared(model_config.model)
        resolved = config_to_dict(model_config.hf_config)
        plans = audit.layer_plans(declared, resolved)
        for i, layer in enumerate(layers):
            plan = plans[i] if i < len(plans) else audit.LayerPlan(layer_index=i)
            plan.layer_index = i
            plan.layer_name = layer["layer_name"]
            plan.runtime_type = layer["runtime_type"]
            plan.runtime_window = layer["runtime_window"]
            plan.kv_cache_spec = layer["kv_cache_spec"]
            plan.causal = layer["causal"]
            rows.append(
                {
                    "model_role": model_role,
                    "layer_index": i,
                    "layer_name": plan.layer_name,
                    "declared_type": plan.declared_type,
                    "declared_window": plan.declared_window,
                    "resolved_type": plan.resolved_type,
                    "resolved_window": plan.resolved_window,
                    "runtime_type": plan.runtime_type,
                    "runtime_window": plan.runtime_window,
                    "kv_cache_spec": plan.kv_cache_spec,
                    "causal": plan.causal,
                    "process": role,
                }
            )
        causes, _ = audit_live.draft_root_causes(declared, resolved)
        findings += audit.audit_layout(model_role, plans[: len(layers)], causes)
    rt.records("attention_layout", rows, role=role, rank=rank)
    if rt.metrics is not None:
        rt.metrics.layout(rows, rt.labels())
    audit_live.emit_findings(rt, findings, role=role, span=span, rank=rank)
    rt.flush()


def record_load_error(rt, worker: Any, error: BaseException, role: str, rank: int | None, span: Any = None) -> None:
    """vLLM refused to build the model: a LOAD_FAILED finding in config terms."""
    configs = _model_configs(worker.vllm_config)
    draft = configs.get("draft")
    findings: list[audit.Finding] = []
    if draft is not None:
        _, findings = audit_live.draft_root_causes(read_declared(draft.model), config_to_dict(draft.hf_config))
    finding = audit.explain_load_error(f"{type(error).__name__}: {error}", findings)
    audit_live.emit_findings(rt, [finding], role=role, span=span, rank=rank)
    rt.flush()


def record_kv_cache_specs(rt, engine_core: Any, vllm_config: Any, role: str) -> None:
    """Nothing beyond the span yet: the per-layer spec is read on the worker."""
    return None
