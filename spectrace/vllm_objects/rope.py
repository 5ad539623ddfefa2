"""The rotary embedding a built model runs with, read from its rotary modules (vLLM 0.32
``model_executor/layers/rotary_embedding``: ``RotaryEmbedding`` and its scaled subclasses store
``head_size``, ``rotary_dim``, ``base``, ``is_neox_style``; the scaled ones their factor)."""

from __future__ import annotations

from typing import Any

# class name -> the rope_type of the schedule it implements
_TYPES = {
    "RotaryEmbedding": "default",
    "MRotaryEmbedding": "default",
    "LinearScalingRotaryEmbedding": "linear",
    "DynamicNTKScalingRotaryEmbedding": "dynamic",
    "YaRNScalingRotaryEmbedding": "yarn",
    "DeepseekScalingRotaryEmbedding": "deepseek_yarn",
    "Llama3RotaryEmbedding": "llama3",
    "Phi3LongRoPEScaledRotaryEmbedding": "longrope",
    "NTKScalingRotaryEmbedding": "ntk",
    "DynamicNTKAlphaRotaryEmbedding": "dynamic",
}


def _scalar(value: Any) -> Any:
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def rotary_facts(module: Any) -> dict[str, Any]:
    """One rotary module's facts (plain values; missing ones None)."""
    kind = type(module).__name__
    rope_type = _TYPES.get(kind, kind)
    original = None
    if rope_type in ("yarn", "deepseek_yarn"):
        original = getattr(module, "max_position_embeddings", None)  # YaRN is built with the original length
    elif rope_type == "llama3":
        original = getattr(module, "orig_max_position", None)
    factor = _scalar(getattr(module, "scaling_factor", None))
    if factor is None:
        factor = _scalar(getattr(module, "scaling_factors", None))
    return {
        "class": kind,
        "rope_type": rope_type,
        "base": _scalar(getattr(module, "base", None)),
        "head_size": getattr(module, "head_size", None),
        "rotary_dim": getattr(module, "rotary_dim", None),
        "neox_style": getattr(module, "is_neox_style", None),
        "factor": factor if rope_type != "default" else None,
        "original_max_position_embeddings": original if isinstance(original, int) else None,
    }


def model_rotary(model: Any) -> dict[str, Any] | None:
    """The first rotary module of a built model (its layers share one schedule), or None."""
    if model is None:
        return None
    try:
        for _, module in model.named_modules():
            if hasattr(module, "rotary_dim") and hasattr(module, "is_neox_style") and hasattr(module, "base"):
                return rotary_facts(module)
    except Exception:
        return None
    return None
