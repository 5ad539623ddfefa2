"""Hidden-state taps: which target layers the loaded model really feeds the drafter.

Read on the worker right after ``load_model``, from the model itself, so it is the
same for either model runner (vLLM 0.32):
- tapped ids: the target's ``EagleModelMixin.aux_hidden_state_layers`` (found the way
  ``SupportsEagle3.set_aux_hidden_state_layers`` finds it: language model, then ``.model``);
- input taps: the drafter's ``fc`` input width / the target's hidden size.
Never hooks compiled or graph-captured code.
"""

from __future__ import annotations

from typing import Any

from spectrace import audit
from spectrace.tracer import audit_live
from spectrace.configs import config_to_dict
from spectrace.tracer.layout import _draft_model, _target_model

AUX_METHODS = ("eagle3", "dflash", "dspark")


def _decoder(target: Any) -> Any:
    """The module that holds the target's layers and taps, found the way vLLM's
    ``SupportsEagle3.set_aux_hidden_state_layers`` finds it: language model, then ``.model``."""
    holder = target
    if hasattr(holder, "get_language_model"):
        try:
            holder = holder.get_language_model()
        except Exception:
            pass
    elif hasattr(holder, "language_model"):
        holder = holder.language_model
    return getattr(holder, "model", holder)


def tapped_ids(target: Any) -> list[int] | None:
    layers = getattr(_decoder(target), "aux_hidden_state_layers", None)
    return [int(i) for i in layers] if layers is not None else None


def target_layer_count(target: Any, vllm_config: Any) -> int:
    layers = getattr(_decoder(target), "layers", None)
    if layers is not None:
        return len(layers)
    return int(vllm_config.model_config.hf_text_config.num_hidden_layers)


def input_taps(draft: Any, target_hidden: int) -> int | None:
    if draft is None or not target_hidden:
        return None
    for name, module in draft.named_modules():
        if name.split(".")[-1] == "fc":
            width = getattr(module, "input_size", None) or getattr(module, "in_features", None)
            if isinstance(width, int) and width % target_hidden == 0:
                return width // target_hidden
    return None


def record_taps(rt, worker: Any, role: str, rank: int | None, span: Any = None) -> None:
    vllm_config = worker.vllm_config
    spec = vllm_config.speculative_config
    if spec is None or spec.method not in AUX_METHODS:
        return
    runner = worker.model_runner
    target = _target_model(runner)
    draft = _draft_model(runner)
    hidden = int(vllm_config.model_config.hf_text_config.hidden_size)
    declared = config_to_dict(spec.draft_model_config.hf_config)
    tap, findings = audit.audit_taps(
        draft=declared,
        target_layers=target_layer_count(target, vllm_config),
        tapped_ids=tapped_ids(target),
        input_taps=input_taps(draft, hidden),
        rule="EagleModelMixin.aux_hidden_state_layers of the loaded target (set by the model runner)",
    )
    row = {"model_role": "draft", **tap.as_row()}
    rt.record("hidden_state_taps", row, role=role, rank=rank)
    with rt.span(
        "spectrace.hidden_states.taps",
        role=role,
        rank=rank,
        attributes={
            "spectrace.taps.declared_field": tap.declared_field or "",
            "spectrace.taps.declared_ids": tap.declared_ids or [],
            "spectrace.taps.expected_ids": tap.expected_ids or [],
            "spectrace.taps.tapped_ids": tap.tapped_ids or [],
            "spectrace.taps.status": tap.status,
        },
    ) as taps_span:
        audit_live.emit_findings(rt, findings, role=role, span=taps_span, rank=rank)
    if rt.metrics is not None and tap.tapped_ids is not None:
        expected = tap.expected_ids or []
        rt.metrics.taps(
            [
                {"expected_id": expected[i] if i < len(expected) else "none", "tapped_id": tapped}
                for i, tapped in enumerate(tap.tapped_ids)
            ],
            rt.labels(),
        )
    rt.flush()
