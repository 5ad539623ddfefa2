"""The attention layers of a built model, and what each one will execute.

One rule for every caller: the live worker reads the loaded models right after
``load_model``; ``spectrace doctor`` reads models it built on the meta device.
vLLM 0.32:

- layers: ``vllm_config.compilation_config.static_forward_context`` (layer name ->
  ``AttentionLayerBase``), in the model's module order;
- window: the backend implementation's ``impl.sliding_window`` (the CPU backend
  stores an int, -1 for none; FlashAttention and FlashInfer a ``(left, right)`` pair
  with ``left = window - 1``), else the layer's own ``sliding_window``;
- KV-cache spec: ``layer.get_kv_cache_spec(vllm_config)`` class name, kept apart
  from the attention type (vLLM may promote sliding specs to full);
- causal: the owning module's ``causal`` flag where the model has one (DFlash);
- linear layers: a ``MambaBase`` module (linear attention, Gated DeltaNet, Mamba, short
  conv: a recurrent state, ``MambaSpec`` KV spec) is ``linear``, never full attention.
"""

from __future__ import annotations

import re
from typing import Any

from spectrace.config_dicts import FULL, LINEAR, SLIDING

_INDEX = re.compile(r"layers\.(\d+)\.")


def window(layer: Any) -> int | None:
    """The window the layer's attention will apply (None: full attention)."""
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


def attention_layers(model: Any, vllm_config: Any, *, seen: set[int] | None = None) -> list[dict[str, Any]]:
    """The attention layers of ``model`` in build order, with what each executes.

    ``seen`` (ids of layer modules) lets a caller read two models that share modules
    without listing a layer twice.
    """
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    try:
        from vllm.model_executor.layers.mamba.abstract import MambaBase
    except ImportError:  # a vLLM without hybrid models
        MambaBase = ()  # noqa: N806

    context = vllm_config.compilation_config.static_forward_context
    name_of = {id(layer): name for name, layer in context.items() if isinstance(layer, AttentionLayerBase)}
    seen = set() if seen is None else seen
    causal_of: dict[int, bool] = {}
    for module in model.modules():
        attn = getattr(module, "attn", None)
        if attn is not None and isinstance(getattr(module, "causal", None), bool):
            causal_of[id(attn)] = module.causal
    layers = []
    for module in model.modules():
        if id(module) not in name_of or id(module) in seen:
            continue
        seen.add(id(module))
        name = name_of[id(module)]
        linear = isinstance(module, MambaBase)
        w = None if linear else window(module)
        try:
            spec = type(module.get_kv_cache_spec(vllm_config)).__name__
        except Exception:
            spec = None
        match = _INDEX.search(name)
        layers.append(
            {
                "layer_name": name,
                "global_index": int(match.group(1)) if match else None,
                "runtime_type": LINEAR if linear else SLIDING if w else FULL,
                "runtime_window": w,
                "kv_cache_spec": spec,
                "causal": causal_of.get(id(module)),
            }
        )
    return layers


# -- the loaded models of a worker ------------------------------------------------------


def target_model(runner: Any) -> Any:
    """The target a model runner loaded."""
    try:
        return runner.get_model()
    except Exception:
        return getattr(runner, "model", None)


def draft_model(runner: Any) -> Any:
    """The drafter a model runner loaded (V1: ``drafter``, V2: ``speculator``), or None."""
    for name in ("drafter", "speculator"):
        proposer = getattr(runner, name, None)
        model = getattr(proposer, "model", None)
        if model is not None:
            return model
    return None


def loaded_models(runner: Any) -> dict[str, Any]:
    """Per role, the models a runner loaded."""
    models = {"target": target_model(runner), "draft": draft_model(runner)}
    return {role: model for role, model in models.items() if model is not None}


def runtime_layers(models: dict[str, Any], vllm_config: Any) -> dict[str, list[dict[str, Any]]]:
    """Per role, the attention layers of built models (a layer shared by two is the first's)."""
    seen: set[int] = set()
    return {role: attention_layers(model, vllm_config, seen=seen) for role, model in models.items()}
