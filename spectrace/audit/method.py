"""The method chain: the algorithm a drafter declares → the architecture and model class vLLM builds → the method it
runs; and the rejection sampler it verifies with (a synthetic one makes every acceptance number fake).

Facts (``vllm_objects.configs.speculation_facts``) in, findings out; the same for the frontend and ``doctor``.
"""

from __future__ import annotations

from typing import Any

from spectrace.audit import codes
from spectrace.config_dicts import _get, architecture
from spectrace.audit.findings import Finding

RULE_EAGLE_CONFIG = "vllm.transformers_utils.configs.eagle.EAGLEConfig.__init__ (architecture by method)"
RULE_SPECULATORS = "vllm.transformers_utils.configs.speculators.algos (the speculators_model_type's updater)"
RULE_SYNTHETIC = "vllm.config.speculative.SpeculativeConfig._resolve_synthetic_acceptance_rates"


def declared_algorithm(draft: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """(algorithm, where it is declared): speculators' ``speculators_model_type`` / ``speculators_config.algorithm``,
    else what the architecture names (``DFlash2DraftModel``, ``...Eagle3...``)."""
    if not isinstance(draft, dict):
        return None, None
    for field in ("speculators_model_type", "speculators_config.algorithm"):
        value = _get(draft, field, None)
        if isinstance(value, str) and value:
            return value.lower(), field
    arch = architecture(draft)
    lowered = arch.lower()
    if "dflash2" in lowered:
        return "dflash2", "architectures"
    if "eagle3" in lowered:
        return "eagle3", "architectures"
    return None, None


# (declared algorithm, method it runs) -> what the method skips of the drafter, where vLLM builds it anyway
_EAGLE3_AS_EAGLE = (
    "method eagle feeds the drafter the target's last hidden state only (no auxiliary taps), so its fc, trained to "
    "fuse three target layers, never runs: acceptance near zero, about 1.00 tokens a step (sglang#21272)"
)
_DFLASH2_AS_DFLASH = (
    "the DFlash runtime picks its speculator by the architecture (DFlash2DraftModel: DFlash2Speculator), so a "
    "DFlash2 drafter built as DFlashDraftModel drafts without its candidate selector (vllm#52816)"
)


def audit_method_chain(draft: dict[str, Any] | None, speculation: dict[str, Any] | None) -> list[Finding]:
    """``METHOD_DOWNGRADED`` where vLLM builds the drafter but runs a lesser method than its algorithm."""
    if not speculation or draft is None:
        return []
    algorithm, where = declared_algorithm(draft)
    method = speculation.get("method")
    built = list(speculation.get("architectures") or [])
    model_class = speculation.get("model_class")
    evidence = {"declared_algorithm": algorithm, "declared_in": where, "declared_architecture": architecture(draft),
                "built_architecture": built[0] if built else None, "model_class": model_class, "method": method,
                "vllm_rule": RULE_SPECULATORS if where and where.startswith("speculators") else RULE_EAGLE_CONFIG}
    if algorithm in ("eagle3", "peagle") and method == "eagle" and model_class and "eagle3" in model_class.lower():
        return [codes.finding(
            codes.METHOD_DOWNGRADED, "error", model_role="draft",
            message=f"an EAGLE-3 drafter ({where} = {algorithm if where != 'architectures' else architecture(draft)}) "
            f"runs as method 'eagle': vLLM builds {model_class} ({built[0] if built else '?'}) and {_EAGLE3_AS_EAGLE}",
            evidence={**evidence, "skipped": "fc (the auxiliary hidden-state fusion)"},
            fix='pass "method": "eagle3" in --speculative-config',
        )]
    if algorithm == "dflash2" and method == "dflash" and built and "DFlash2DraftModel" not in built:
        return [codes.finding(
            codes.METHOD_DOWNGRADED, "error", model_role="draft",
            message=f"a DFlash2 drafter ({where} = {algorithm if where != 'architectures' else architecture(draft)}) is "
            f"built as {built[0]} ({model_class or '?'}): {_DFLASH2_AS_DFLASH}",
            evidence={**evidence, "skipped": "the candidate selector"},
            fix='declare "architectures": ["DFlash2DraftModel"] (speculators: "speculators_model_type": "dflash2"), '
            "or use a vLLM whose speculators updater keeps it",
        )]
    return []


def audit_rejection(speculation: dict[str, Any] | None) -> list[Finding]:
    """``SYNTHETIC_ACCEPTANCE`` when vLLM verifies with its synthetic sampler: acceptance is drawn, not measured."""
    if not speculation or speculation.get("rejection_sample_method") != "synthetic":
        return []
    length = speculation.get("synthetic_acceptance_length")
    rates = speculation.get("synthetic_acceptance_rates")
    asked = (f"synthetic_acceptance_length = {length}" if length is not None else
             f"synthetic_acceptance_rates = {rates}" if rates is not None else "its calibration")
    return [codes.finding(
        codes.SYNTHETIC_ACCEPTANCE, "warning", model_role="draft",
        message="rejection_sample_method is 'synthetic': vLLM accepts each draft with a probability calibrated to "
        f"{asked} (vllm#38045), whatever the drafter proposes, so every acceptance number of this run (per position, "
        "length, slices, speed-up) is the sampler's, not the drafter's; acceptance alerts are held off for it",
        evidence={"rejection_sample_method": "synthetic", "synthetic_acceptance_length": length,
                  "synthetic_acceptance_rates": rates, "vllm_rule": RULE_SYNTHETIC},
    )]
