"""What the frontend's config resolution hands the collector to judge (``spectrace.load_facts.RESOLUTION``).

The static judge (``audit.judge``, in ``spectrace.collector.judging``) reads the facts of one run's configs: the
models as declared and resolved, the method, the scheduler and speculation settings, the dtypes each model runs in
and its checkpoint holds, the drafter's resolution steps and its vocabulary maps. They are read here, in the
frontend, where vLLM's objects are; nothing here judges.
"""

from __future__ import annotations

from typing import Any

from spectrace.vllm_objects.configs import (
    drafter_stages, hf_override_facts, model_configs, scheduler_facts, speculation_facts,
)
from spectrace.vllm_objects.weights import read_manifest, read_vocab_maps


def resolution_facts(info: dict[str, Any], models: list[dict[str, Any]], vllm_config: Any, error: str | None) -> dict[str, Any]:
    """``audit.RunFacts``' keywords for one run's resolution (the frontend builds no model, so no runtime layers:
    the layout is judged from the worker's reading)."""
    return {
        "models": models,
        "method": info.get("method"),
        "method_given": not info.get("method_inferred"),
        "draft_path": info.get("draft_model"),
        "max_model_len": getattr(getattr(vllm_config, "model_config", None), "max_model_len", None),
        "load_error": error,
        "scheduler": scheduler_facts(vllm_config) if vllm_config is not None else None,
        "runs_in": runs_in(vllm_config),
        "checkpoint_dtypes": checkpoint_dtypes(models),
        "drafter_stages": stages_of(models),
        "vocab_maps": vocab_maps_of(models),
        "draft_settings": {"method": info.get("method"), "hf_overrides": hf_override_facts(vllm_config)},
        "speculation": speculation_facts(vllm_config) if vllm_config is not None else None,
    }


def runs_in(vllm_config: Any) -> dict[str, str | None] | None:
    """The dtype vLLM builds each model with (``ModelConfig.dtype``, as text; the drafter's is the target's)."""
    if vllm_config is None:
        return None
    return {role: _text(getattr(config, "dtype", None)) for role, config in model_configs(vllm_config).items()}


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def checkpoint_dtypes(models: list[dict[str, Any]]) -> dict[str, str | None]:
    """The dtype most of each checkpoint's tensors hold, from its safetensors headers (headers only: no tensor data
    is read). What training wrote, and so what the dtype audit reads before a config's often stale dtype, as doctor
    does."""
    return {model["model_role"]: read_manifest(model["model"]).main_dtype() for model in models if model.get("model")}


def _draft(models: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((m for m in models if m.get("model_role") == "draft"), None)


def stages_of(models: list[dict[str, Any]]) -> list[Any] | None:
    """The drafter's config through vLLM's resolution steps (declared → … → ``vllm_resolved``)."""
    draft = _draft(models)
    if draft is None or draft.get("declared") is None:
        return None
    return drafter_stages(draft["declared"], draft.get("transformers_resolved"), draft.get("vllm_resolved"),
                          draft.get("transformers_class"))


def vocab_maps_of(models: list[dict[str, Any]]) -> tuple[bool, dict[str, Any]] | None:
    """The drafter checkpoint's d2t / t2d (small tensors, values read), or None without a drafter."""
    draft = _draft(models)
    if draft is None or not draft.get("model"):
        return None
    return read_vocab_maps(draft["model"])
