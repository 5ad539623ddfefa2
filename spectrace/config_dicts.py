"""Reading config dicts: layer kinds, windows, and each layer's declared and resolved plan."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

SLIDING = "sliding"
FULL = "full"
# a layer with a recurrent state and no KV window: linear attention, Gated DeltaNet, Mamba, short conv
# (hybrid targets such as Qwen3-Next); never full attention
LINEAR = "linear"
UNSPECIFIED = "unspecified"

# Config fields whose value decides the attention layout or the pairing.
ATTENTION_FIELDS = (
    "layer_types",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "num_hidden_layers",
    "max_position_embeddings",
    "rope_scaling",
    "vocab_size",
    "draft_vocab_size",
    "target_hidden_size",
    "eagle_aux_hidden_state_layer_ids",
    "target_layer_ids",
    "num_nextn_predict_layers",
)
DFLASH_FIELDS = ("swa_window_size", "use_swa", "target_layer_ids", "layer_ids", "mask_token_id", "causal")

# Speculative methods whose drafter is not a model (no draft config.json, no draft layers).
MODEL_FREE_METHODS = frozenset({"ngram", "[ngram]", "ngram_gpu", "suffix", "custom_class", "extract_hidden_states"})

# Keys that transformers rewrites on every load without changing their meaning.
_BOOKKEEPING = {"transformers_version", "torch_dtype", "dtype", "_name_or_path", "architectures"}


@dataclass
class LayerPlan:
    """One attention layer: what the config declared, resolved to, and what runs."""

    layer_index: int
    declared_type: str = UNSPECIFIED
    declared_window: int | None = None
    resolved_type: str | None = None
    resolved_window: int | None = None
    runtime_type: str | None = None
    runtime_window: int | None = None
    layer_name: str | None = None
    kv_cache_spec: str | None = None
    causal: bool | None = None

    def as_row(self) -> dict[str, Any]:
        """The ``attention_layout`` columns of this layer (the live store and doctor's JSON)."""
        return asdict(self)


_MISSING = object()

def _get(config: dict[str, Any] | None, dotted: str, default: Any = _MISSING) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _dflash(config: dict[str, Any] | None) -> dict[str, Any]:
    value = _get(config, "dflash_config", None)
    return value if isinstance(value, dict) else {}


def _layer_kind(value: Any) -> str:
    text = str(value).lower()
    if "sliding" in text or text in ("swa", "local", "local_attention"):
        return SLIDING
    if any(word in text for word in ("linear", "mamba", "delta", "conv", "recurrent")):
        return LINEAR
    return FULL


def _num_layers(*configs: dict[str, Any] | None) -> int:
    for config in configs:
        n = _get(config, "num_hidden_layers", None)
        if isinstance(n, int):
            return n
        types = _get(config, "layer_types", None)
        if isinstance(types, list):
            return len(types)
    return 0


def architecture(config: dict[str, Any] | None) -> str:
    archs = _get(config, "architectures", None) or []
    return archs[0] if archs else ""


def declared_sliding_intent(declared: dict[str, Any] | None) -> bool:
    """Does ``config.json`` mean some layer to slide?"""
    if declared is None:
        return False
    types = _get(declared, "layer_types", None)
    if isinstance(types, list) and any(_layer_kind(t) == SLIDING for t in types):
        return True
    dflash = _dflash(declared)
    if dflash.get("use_swa"):
        return True
    window = _get(declared, "sliding_window", None)
    if window is not None and _get(declared, "use_sliding_window", None) is not False:
        return True
    return False


def _declared_window(declared: dict[str, Any] | None) -> int | None:
    dflash = _dflash(declared)
    if dflash.get("swa_window_size") is not None:
        return dflash["swa_window_size"]
    return _get(declared, "sliding_window", None)


def _resolved_window(resolved: dict[str, Any] | None) -> int | None:
    dflash = _dflash(resolved)
    if dflash.get("swa_window_size") is not None:
        return dflash["swa_window_size"]
    return _get(resolved, "sliding_window", None)


def layer_plans(declared: dict[str, Any] | None, resolved: dict[str, Any] | None) -> list[LayerPlan]:
    """Declared and resolved type/window for every layer (runtime filled in later)."""
    n = _num_layers(resolved, declared)
    declared_types = _get(declared, "layer_types", None)
    resolved_types = _get(resolved, "layer_types", None)
    dflash_resolved = _dflash(resolved)
    plans = []
    for i in range(n):
        plan = LayerPlan(layer_index=i)
        if isinstance(declared_types, list) and i < len(declared_types):
            plan.declared_type = _layer_kind(declared_types[i])
            plan.declared_window = _declared_window(declared) if plan.declared_type == SLIDING else None
        else:
            plan.declared_type = UNSPECIFIED
            plan.declared_window = _declared_window(declared) if declared_sliding_intent(declared) else None
        if resolved is not None:
            if isinstance(resolved_types, list) and i < len(resolved_types):
                kind = _layer_kind(resolved_types[i])
            elif dflash_resolved.get("use_swa"):
                kind = SLIDING
            else:
                kind = FULL
            window = _resolved_window(resolved) if kind == SLIDING else None
            plan.resolved_type = kind
            plan.resolved_window = window
        plans.append(plan)
    return plans


def _is_window(value: Any) -> bool:
    return isinstance(value, int) and value > 0
