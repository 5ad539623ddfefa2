"""LOAD_FAILED: vLLM refused to build a model, explained in config terms or by the model runner."""

from __future__ import annotations

from spectrace.audit import codes
from spectrace.audit.findings import Finding
from spectrace.audit.resolution import draft_root_causes, root_causes


def explain_load_error(error: str, draft_findings: list[Finding]) -> Finding:
    """vLLM refused to build a model: say why in config terms when a finding explains it."""
    needs_runner = runner_refusal(error)
    if needs_runner is not None:
        return _runner_load_failed(error, needs_runner)
    causes = root_causes(draft_findings)
    caused = None
    lowered = error.lower()
    if codes.SWA_DROPPED in causes and ("window" in lowered or "sliding" in lowered):
        caused = codes.SWA_DROPPED
    elif codes.VOCAB_MISMATCH in causes and ("vocab" in lowered or "size mismatch" in lowered or "shape" in lowered):
        caused = codes.VOCAB_MISMATCH
    elif codes.METHOD_MISMATCH in causes:
        caused = codes.METHOD_MISMATCH
    explanation = ""
    if caused:
        root = next(f for f in draft_findings if f.code == caused)
        explanation = f" This follows from {caused}: {root.message}"
    return codes.finding(
        codes.LOAD_FAILED,
        severity="info" if caused else "error",
        model_role="draft",
        message=f"vLLM refused to build the model: {error.rstrip('.')}.{explanation}",
        evidence={"error": error},
        fix="" if caused else "see the error; vLLM did not start",
        caused_by=caused,
    )


# -- model-runner refusals (used by explain_load_error) -----------------------------

_NEEDS_V2 = (
    "model runner v1 does not support",  # VllmConfig._validate_v1_model_runner
    "require the v2 model runner",  # qwen3_dflash._resolve_layer_attention (mixed sliding/full)
    "requires the v2 model runner",
    "requires model runner v2",
)
_NEEDS_V1 = ("model runner v2 does not yet support",)  # VllmConfig._validate_v2_model_runner


def explain_build_error(error: str, draft_declared: dict | None, draft_resolved: dict | None) -> Finding:
    """LOAD_FAILED for a model vLLM refused to build, explained by the drafter's config findings."""
    draft_findings = draft_root_causes(draft_declared, draft_resolved)[1] if draft_declared or draft_resolved else []
    return explain_load_error(error, draft_findings)


def runner_refusal(error: str) -> str | None:
    """``"v2"`` / ``"v1"`` when ``error`` is vLLM refusing the pair on one model runner.

    Such a refusal is a root cause of its own: no config fix of the drafter removes it
    (a correct mixed sliding/full DFlash drafter is refused by V1 just the same), so it
    is never attributed to another finding even when its text says "sliding".
    """
    lowered = error.lower()
    if any(needle in lowered for needle in _NEEDS_V2):
        return "v2"
    if any(needle in lowered for needle in _NEEDS_V1):
        return "v1"
    return None


def _runner_load_failed(error: str, needs: str) -> Finding:
    other = "v1" if needs == "v2" else "v2"
    if needs == "v2":
        fix = (
            "serve the pair on vLLM's V2 model runner (the default on CUDA in vLLM 0.32; "
            "VLLM_USE_V2_MODEL_RUNNER=1); the V1 runner (the CPU build's) cannot run it"
        )
    else:
        fix = "serve the pair on vLLM's V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0)"
    return codes.finding(
        codes.LOAD_FAILED,
        severity="error",
        model_role="draft",
        message=f"vLLM refused to build the model: {error.rstrip('.')}. This pair needs the {needs.upper()} model runner; "
        f"the {other.upper()} runner refuses it.",
        evidence={"error": error, "needs_runner": needs},
        fix=fix,
        caused_by=None,
    )
