"""The pair: method, vocabulary, context of target + drafter together."""

from __future__ import annotations

import math
from typing import Any

from spectrace.audit import codes
from spectrace.config_dicts import MODEL_FREE_METHODS, _get, architecture
from spectrace.audit.findings import Finding


_METHOD_BY_ARCH = (
    ("dflash", "dflash"),
    ("eagle3", "eagle3"),
    ("eagle", "eagle"),
    ("mtp", "mtp"),
)


def architecture_method(draft: dict[str, Any] | None) -> str | None:
    """The speculative method a drafter's architecture implies, if any."""
    arch = architecture(draft).lower()
    for needle, method in _METHOD_BY_ARCH:
        if needle in arch:
            return method
    if _get(draft, "dflash_config", None) is not None:
        return "dflash"
    return None


def effective_context(config: dict[str, Any] | None) -> int | None:
    """The context the config's RoPE scaling stretches ``max_position_embeddings`` to, or None when the
    config does not say (or says a number that is not one: a factor of 1e308 is no context length)."""
    base = _get(config, "max_position_embeddings", None)
    if not _count(base):
        return None
    scaling = _get(config, "rope_scaling", None) or _get(config, "rope_parameters", None)
    if isinstance(scaling, dict):
        kind = scaling.get("rope_type") or scaling.get("type")
        factor = scaling.get("factor")
        if kind not in (None, "default") and isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor > 1:
            original = scaling.get("original_max_position_embeddings")
            stretched = (original if _count(original) else base) * factor
            return int(stretched) if math.isfinite(stretched) and stretched < 2**63 else None
    return base


def _count(value: Any) -> bool:
    """A positive whole number (not a bool, a float or a string)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def audit_pair(
    *,
    method: str | None,
    method_given: bool,
    draft_path: str | None,
    target: dict[str, Any] | None,
    draft: dict[str, Any] | None,
    target_max_model_len: int | None = None,
) -> list[Finding]:
    """Findings about target + drafter together."""
    findings: list[Finding] = []
    if draft is None or method is None or method in MODEL_FREE_METHODS:
        return findings
    implied = architecture_method(draft)
    mismatch = None
    if implied is not None and method is not None and implied != method and not (implied == "eagle" and method == "eagle3"):
        mismatch = codes.finding(
            codes.METHOD_MISMATCH,
            severity="error",
            model_role="draft",
            message=f"drafter architecture {architecture(draft)} is a {implied} drafter, but vLLM runs it as "
            f"method {method!r}" + (" (inferred from the path)" if not method_given else ""),
            evidence={"architecture": architecture(draft), "implied_method": implied, "method": method, "method_given": method_given, "draft_path": draft_path},
            fix=f'pass "method": "{implied}" in --speculative-config',
        )
        findings.append(mismatch)
    if not method_given and draft_path:
        findings.append(
            codes.finding(
                codes.METHOD_INFERRED,
                severity="info" if mismatch else "warning",
                model_role="draft",
                message=f"no method was given; vLLM inferred {method!r} from the draft path {draft_path!r}",
                evidence={"method": method, "draft_path": draft_path},
                fix=f'pass "method": "{implied or method}" explicitly',
                caused_by=codes.METHOD_MISMATCH if mismatch else None,
            )
        )
    findings.extend(_audit_vocab(method, target, draft))
    findings.extend(_audit_context(method, target, draft, target_max_model_len))
    return findings


def _audit_vocab(method: str | None, target: dict[str, Any] | None, draft: dict[str, Any] | None) -> list[Finding]:
    tv = _get(target, "vocab_size", None)
    dv = _get(draft, "vocab_size", None)
    if not isinstance(tv, int) or not isinstance(dv, int):
        return []
    draft_vocab = _get(draft, "draft_vocab_size", None)
    if method == "eagle3" and isinstance(draft_vocab, int) and draft_vocab <= tv and dv == tv:
        return []  # a reduced draft vocabulary with its d2t mapping
    if dv == tv:
        return []
    return [
        codes.finding(
            codes.VOCAB_MISMATCH,
            severity="error",
            model_role="draft",
            message=f"draft vocabulary ({dv}) and target vocabulary ({tv}) cannot line up for method {method!r}",
            evidence={"target_vocab_size": tv, "draft_vocab_size": dv, "draft_reduced_vocab": draft_vocab},
        )
    ]


# methods whose drafter vLLM runs up to the target's context whatever its config says (see _audit_context)
RAISED_CONTEXT_METHODS = ("eagle", "eagle3")


def _audit_context(method, target, draft, target_max_model_len) -> list[Finding]:
    if method not in ("eagle", "eagle3", "dflash", "draft_model", "mtp"):
        return []
    draft_ctx = effective_context(draft)
    target_ctx = target_max_model_len or effective_context(target)
    if draft_ctx is None or target_ctx is None or draft_ctx >= target_ctx:
        return []
    # vLLM raises an EAGLE / EAGLE-3 drafter's max_position_embeddings to the target's context on purpose
    # (SpeculativeConfig._maybe_override_draft_max_position_embeddings, vllm#48894: the drafter shares the target's
    # positions): the drafter is run past the context its config names, as its trainers' published drafters are
    # (the EAGLE-3 reference's names 2048). Whether it holds up there is for acceptance by context range to say.
    raised = method in RAISED_CONTEXT_METHODS
    return [
        codes.finding(
            codes.DRAFT_CONTEXT_SHORT,
            severity="info" if raised else "warning",
            model_role="draft",
            message=f"the drafter's effective context ({draft_ctx}) is shorter than the target's ({target_ctx}); "
            + ("vLLM raises its max_position_embeddings to the target's on purpose (SpeculativeConfig."
               "_maybe_override_draft_max_position_embeddings), so it drafts there from positions its config does not "
               "name; fine if it was trained or generalises so, which the configs cannot tell: acceptance by context "
               "range (spectrace report) settles it" if raised else
               "drafts beyond it come from positions the drafter never saw"),
            fix="" if raised else None,
            evidence={
                **({"vllm_rule": "vllm.config.speculative.SpeculativeConfig._maybe_override_draft_max_position_embeddings",
                    "settled_by": "acceptance by context range in a run"} if raised else {}),
                "draft_max_position_embeddings": _get(draft, "max_position_embeddings", None),
                "draft_rope_scaling": _get(draft, "rope_scaling", None),
                "target_context": target_ctx,
                "target_rope_scaling": _get(target, "rope_scaling", None),
            },
        )
    ]
