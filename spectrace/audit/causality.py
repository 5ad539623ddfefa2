"""DFlash causality: CAUSAL_INFERRED for a DFlash drafter that declares none.

Info: vLLM's fallback (sliding layers causal, full layers bidirectional) is the published drafters' convention, so the
config alone cannot say it is wrong. A speculators-format drafter always has one: ``update_dflash`` sets
``dflash_config.causal`` from ``sliding_window_non_causal``, so it is read from the config vLLM builds from too.
"""

from __future__ import annotations

from typing import Any

from spectrace.audit import codes
from spectrace.config_dicts import SLIDING, LayerPlan, _dflash, _get, _layer_kind, _num_layers
from spectrace.audit.findings import Finding
from spectrace.audit.pair import architecture_method


def audit_causality(
    role: str, declared: dict[str, Any] | None, resolved: dict[str, Any] | None, plans: list[LayerPlan] | None = None
) -> list[Finding]:
    """``CAUSAL_INFERRED`` for a DFlash drafter that declares no causality.

    vLLM 0.32 (``qwen3_dflash._dflash_layer_causal``) takes ``is_causal``, else
    ``dflash_config.causal``, else makes exactly the sliding layers of ``layer_types``
    causal (no ``layer_types``: none). ``plans`` with runtime ``causal`` (what the
    built layers say) are preferred to the rule when present.
    """
    if role != "draft" or declared is None or architecture_method(declared) != "dflash":
        return []
    for config in (declared, resolved):  # declared, or set by vLLM's updater (update_dflash: dflash_config.causal)
        if _get(config, "is_causal", None) is not None or _dflash(config).get("causal") is not None:
            return []
    source = "runtime"
    chosen = [p.causal for p in plans or [] if p.causal is not None]
    if plans and not chosen and any(p.runtime_type is not None for p in plans):
        return []  # built, and no layer is a DFlash layer: vLLM runs it as another method (METHOD_MISMATCH)
    if not chosen:
        source = "rule"
        types = _get(resolved, "layer_types", None)
        n = _num_layers(resolved, declared)
        chosen = [isinstance(types, list) and i < len(types) and _layer_kind(types[i]) == SLIDING for i in range(n)]
    causal = [i for i, c in enumerate(chosen) if c]
    text = (
        "every layer causal" if len(causal) == len(chosen)
        else "no layer causal (bidirectional within the block)" if not causal
        else f"layers {causal} causal, the others not"
    )
    return [
        codes.finding(
            codes.CAUSAL_INFERRED,
            severity="info",
            model_role=role,
            message=f"the DFlash drafter declares no causality (is_causal, dflash_config.causal); vLLM chose {text}, "
            "from layer_types (sliding layers causal, full layers not), the convention of the published DFlash "
            "drafters (z-lab's train bidirectionally within the block); a drafter trained otherwise would accept "
            "well at position 0 and collapse after it: declaring dflash_config.causal, or the acceptance by position "
            "of a run (spectrace report), settles it",
            evidence={
                "causal_by_layer": chosen,
                "from": source,
                "resolved_layer_types": _get(resolved, "layer_types", None),
                "vllm_rule": "vllm.model_executor.models.qwen3_dflash._dflash_layer_causal",
                "settled_by": "dflash_config.causal declared, or acceptance by position in a run",
            },
        )
    ]
