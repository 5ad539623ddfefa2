"""RoPE: the rotary embedding a model runs with, and whether a drafter's agrees with its target's.

EAGLE, EAGLE3, DFlash and MTP drafters are fed the target's positions (and, for EAGLE3 and
DFlash, its hidden states, which carry the target's rotary phases): a drafter whose rotary base,
scaling or layout differs reads positions it was not trained on. Converted EAGLE3 drafters lose
``rope_scaling`` (speculators#574), bases get pinned to 10000, YaRN is read as another schedule,
NeoX and GPT-J layouts differ (TRT-LLM#19036); transformers 5 moved ``rope_theta`` into
``rope_parameters``, so converters and readers disagree on where it is. The symptom is acceptance
that falls with context, or is about 0 from the start.

An independent ``draft_model`` drafter has its own positions: a different RoPE is legitimate
there, and only named (info) as the first suspect should acceptance collapse or fall with context.
"""

from __future__ import annotations

import math

from dataclasses import asdict, dataclass
from typing import Any

from spectrace.audit import codes
from spectrace.config_dicts import _get
from spectrace.audit.findings import Finding

# Methods whose drafter reads the target's positions (and so must rotate them as the target does).
SHARED_POSITION_METHODS = ("eagle", "eagle3", "dflash", "mtp")
# Methods whose trainers build the drafter's RoPE from the target's config, so that a drafter declaring another one
# misstates its training (ROPE_MISMATCH, an error): speculators' DFlashDraftModel.from_training_args passes the
# verifier's config as transformer_layer_config (src/speculators/models/dflash/core.py, and the rotary embedding is
# built from it); SpecForge's DFlash configs copy the target's rope_theta (configs/qwen3-8b-dflash.json); an MTP
# drafter is the target's own layers. EAGLE and EAGLE-3 drafters get a base of their own: the EAGLE-3 reference
# builds the drafter's LlamaRotaryEmbedding with its default base 10000 whatever the target's
# (SafeAILab/EAGLE eagle/traineagle3/cnets.py, LlamaAttention._init_rope), SpecForge's llama3-8B-eagle3.json
# names no rope_theta; vLLM builds the drafter's rotary embedding from the drafter's config. A differing RoPE there is
# what training did as often as a misdeclaration: ROPE_DIFFERS (info), until acceptance says otherwise.
TARGET_ROPE_METHODS = ("dflash", "mtp")
OWN_ROPE_TRAINERS = {
    "eagle3": "the EAGLE-3 reference trains the drafter with a RoPE base of its own (SafeAILab/EAGLE "
              "eagle/traineagle3/cnets.py: LlamaRotaryEmbedding's default base 10000, whatever the target's)",
    "eagle": "EAGLE trains the drafter with the RoPE of its own config (SafeAILab/EAGLE eagle/model/cnets.py)",
}
DEFAULT_THETA = 10000.0  # vLLM's get_rope default when a config names no base
_LAYER_KEYS = ("full_attention", "sliding_attention", "chunked_attention", "linear_attention")
_TYPE_ALIASES = {"su": "longrope", "mrope": "default", None: "default"}


@dataclass(frozen=True)
class Rope:
    """One model's rotary embedding, resolved; ``None`` where neither config nor module says."""

    theta: float | None
    rope_type: str
    factor: float | None
    original_max_position_embeddings: int | None
    partial_rotary_factor: float
    neox_style: bool | None
    source: str  # where it was read: the config field(s), or "runtime" (the built rotary module)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def compared(self) -> dict[str, Any]:
        """The values two models must share: scaling details only where a scaling is on."""
        scaled = self.rope_type != "default"
        return {
            "theta": self.theta if self.theta is not None else DEFAULT_THETA,
            "rope_type": self.rope_type,
            "factor": self.factor if scaled else None,
            "original_max_position_embeddings": self.original_max_position_embeddings if scaled else None,
            "partial_rotary_factor": self.partial_rotary_factor,
            "neox_style": self.neox_style,
        }


def _number(value: Any) -> float | None:
    """A finite number from a config (an int too large for a float, NaN or Infinity is none)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _flat_parameters(params: Any) -> dict[str, Any] | None:
    """``rope_parameters`` as one dict: nested per layer type (Gemma-style), the full-attention entry."""
    if not isinstance(params, dict) or not params:
        return None
    if set(params) <= set(_LAYER_KEYS):
        nested = params.get("full_attention") or next((v for v in params.values() if isinstance(v, dict)), None)
        return nested if isinstance(nested, dict) else None
    return params


def rope_of(config: dict[str, Any] | None) -> Rope | None:
    """The RoPE a config declares, from ``rope_theta``, ``rope_scaling`` and ``rope_parameters``.

    Both spellings: transformers < 5 (``rope_theta`` top level, ``rope_scaling`` with ``type`` or
    ``rope_type``) and transformers 5 (``rope_parameters`` holding ``rope_theta`` and the scaling);
    a nested ``text_config`` is read where the top level names none. ``None`` for no config.
    """
    if not isinstance(config, dict):
        return None
    if not any(k in config for k in ("rope_theta", "rope_scaling", "rope_parameters")) and isinstance(
        config.get("text_config"), dict
    ):
        config = config["text_config"]
    params = _flat_parameters(config.get("rope_parameters"))
    scaling = config.get("rope_scaling") if isinstance(config.get("rope_scaling"), dict) else None
    sources = []
    theta = None
    for where, holder, key in (
        ("rope_parameters.rope_theta", params, "rope_theta"),
        ("rope_theta", config, "rope_theta"),
        ("rope_scaling.rope_theta", scaling, "rope_theta"),
    ):
        if holder is not None and _number(holder.get(key)) is not None:
            theta = _number(holder.get(key))
            sources.append(where)
            break
    schedule = None
    for where, holder in (("rope_parameters", params), ("rope_scaling", scaling)):
        if holder is not None and (holder.get("rope_type") or holder.get("type")) is not None:
            schedule = holder
            sources.append(where)
            break
    if schedule is None:
        schedule = params or scaling or {}
    kind = schedule.get("rope_type") or schedule.get("type")
    kind = _TYPE_ALIASES.get(kind, kind) if isinstance(kind, str) or kind is None else str(kind)
    original = schedule.get("original_max_position_embeddings")
    partial = _number(_get(config, "partial_rotary_factor", None))
    if partial is None and params is not None:
        partial = _number(params.get("partial_rotary_factor"))
    neox = None
    for key in ("rope_is_neox_style", "is_neox_style"):
        if isinstance(config.get(key), bool):
            neox = config[key]
    for key in ("rope_interleaved", "rotary_interleaved"):  # interleaved pairs: the GPT-J layout
        if isinstance(config.get(key), bool):
            neox = not config[key]
    return Rope(
        theta=theta,
        rope_type=kind or "default",
        factor=_number(schedule.get("factor")),
        original_max_position_embeddings=original if isinstance(original, int) and not isinstance(original, bool) else None,
        partial_rotary_factor=partial if partial is not None else 1.0,
        neox_style=neox,
        source=", ".join(sources) or "defaults",
    )


def runtime_rope(module: dict[str, Any] | None) -> Rope | None:
    """A built rotary module's facts (``spectrace.vllm_objects.rope`` reads them) as a :class:`Rope`."""
    if not module:
        return None
    head, rotary = module.get("head_size"), module.get("rotary_dim")
    partial = rotary / head if isinstance(head, int) and isinstance(rotary, int) and head else 1.0
    original = module.get("original_max_position_embeddings")
    return Rope(
        theta=_number(module.get("base")),
        rope_type=module.get("rope_type") or "default",
        factor=_number(module.get("factor")),
        original_max_position_embeddings=original if isinstance(original, int) else None,
        partial_rotary_factor=round(partial, 6),
        neox_style=module.get("neox_style") if isinstance(module.get("neox_style"), bool) else None,
        source="runtime",
    )


def rope_differences(target: Rope, draft: Rope) -> list[str]:
    """The fields two RoPEs disagree on (a layout only when both are known)."""
    t, d = target.compared(), draft.compared()
    differs = []
    for key in t:
        if key == "neox_style" and (t[key] is None or d[key] is None):
            continue
        a, b = t[key], d[key]
        if isinstance(a, float) and isinstance(b, float):
            if abs(a - b) > 1e-6 * max(abs(a), abs(b), 1.0):
                differs.append(key)
        elif a != b:
            differs.append(key)
    return differs


def _fix(target: Rope, differs: list[str]) -> str:
    if differs == ["neox_style"]:
        style = "NeoX (rotate halves)" if target.neox_style else "GPT-J (interleaved pairs)"
        return f"use a drafter built with the target's rotary layout, {style}"
    params: dict[str, Any] = {"rope_type": target.rope_type, "rope_theta": target.theta or DEFAULT_THETA}
    if target.rope_type != "default":
        params.update({"factor": target.factor, "original_max_position_embeddings": target.original_max_position_embeddings})
    if target.partial_rotary_factor != 1.0:
        params["partial_rotary_factor"] = target.partial_rotary_factor
    shown = ", ".join(f'"{k}": {v!r}' if not isinstance(v, str) else f'"{k}": "{v}"' for k, v in params.items() if v is not None)
    return (
        f'give the drafter the target\'s RoPE in its config.json: "rope_parameters": {{{shown}}} '
        '(transformers >= 5; older readers take "rope_theta" and "rope_scaling" at the top level)'
    )


def audit_rope(method: str | None, target: Rope | None, draft: Rope | None, *, where: str = "config") -> list[Finding]:
    """``ROPE_MISMATCH`` (positions shared with the target) or ``ROPE_DIFFERS`` (``draft_model``)."""
    if target is None or draft is None or method is None:
        return []
    differs = rope_differences(target, draft)
    if not differs:
        return []
    evidence = {"target": target.as_dict(), "draft": draft.as_dict(), "differs": differs, "read_from": where, "method": method}
    shown = "; ".join(f"{k}: target {target.compared()[k]!r}, drafter {draft.compared()[k]!r}" for k in differs)
    if method in OWN_ROPE_TRAINERS:
        return [
            codes.finding(
                codes.ROPE_DIFFERS,
                severity="info",
                model_role="draft",
                message=f"the {method} drafter's RoPE differs from the target's ({shown}; read from the {where}); "
                f"vLLM builds it from the drafter's own config, and {OWN_ROPE_TRAINERS[method]}, so the configs cannot "
                "tell a drafter trained so from a misdeclared one: acceptance that collapses or falls with context "
                "(spectrace report, by context range) settles it",
                evidence={**evidence, "settled_by": "acceptance by context range in a run"},
                fix="only if acceptance collapses or falls with context: " + _fix(target, differs),
            )
        ]
    if method in TARGET_ROPE_METHODS:
        return [
            codes.finding(
                codes.ROPE_MISMATCH,
                severity="error",
                model_role="draft",
                message=f"the {method} drafter rotates the target's positions differently from the target ({shown}; "
                f"read from the {where}), where its trainers build the drafter's RoPE from the target's; what that costs depends on the drafter and the context length and cannot "
                "be read from the configs: compare the acceptance by context range (spectrace report)",
                evidence=evidence,
                fix=_fix(target, differs),
            )
        ]
    if method == "draft_model":
        return [
            codes.finding(
                codes.ROPE_DIFFERS,
                severity="info",
                model_role="draft",
                message=f"the independent drafter's RoPE differs from the target's ({shown}; read from the {where}); "
                "legitimate for a draft_model drafter, but the first suspect if acceptance collapses or falls with context",
                evidence=evidence,
                fix="if acceptance collapses or falls with context: " + _fix(target, differs),
            )
        ]
    return []
