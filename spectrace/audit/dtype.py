"""Dtype: the dtype a model was trained in (declared) against the one vLLM runs it in.

vLLM 0.32 builds the draft ``ModelConfig`` with the target's dtype
(``SpeculativeConfig.__post_init__`` passes ``dtype=self.target_model_config.dtype``), so a
drafter trained in bfloat16 next to a float16 target runs in float16: activations beyond
float16's range (65504) overflow to inf and acceptance goes to 0 (vllm#55250).
"""

from __future__ import annotations

from typing import Any

from spectrace.audit import codes
from spectrace.config_dicts import _get
from spectrace.audit.findings import Finding

_ALIASES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16", "torch.bfloat16": "bfloat16",
    "fp16": "float16", "float16": "float16", "half": "float16", "torch.float16": "float16", "f16": "float16",
    "fp32": "float32", "float32": "float32", "float": "float32", "torch.float32": "float32", "f32": "float32",
    # safetensors header spellings
    "BF16": "bfloat16", "F16": "float16", "F32": "float32",
}

# (trained in, runs in) -> severity, why. Widening (float16 -> float32) and the usual
# float32 -> bfloat16 serving cast lose nothing a drafter was trained to rely on.
LOSSY = {
    ("bfloat16", "float16"): ("error", "bfloat16 values beyond float16's range (65504) overflow to inf"),
    ("float32", "float16"): ("warning", "float32 values beyond float16's range (65504) overflow to inf"),
    ("float16", "bfloat16"): ("warning", "bfloat16 keeps 8 bits of mantissa where float16 kept 11"),
}


def dtype_name(value: Any) -> str | None:
    """``bfloat16`` / ``float16`` / ``float32`` (or the value as text) from a config, torch or header spelling."""
    if value is None:
        return None
    text = str(value)
    return _ALIASES.get(text, _ALIASES.get(text.lower(), text.removeprefix("torch.")))


def declared_dtype(config: dict[str, Any] | None) -> str | None:
    """The dtype ``config.json`` names: ``dtype`` (transformers 5) or ``torch_dtype``, text config included."""
    for key in ("dtype", "torch_dtype", "text_config.dtype", "text_config.torch_dtype"):
        value = _get(config, key, None)
        if isinstance(value, str) and value != "auto":
            return dtype_name(value)
    return None


def audit_dtype(
    role: str,
    *,
    declared: str | None,
    checkpoint: str | None,
    runs_in: str | None,
    target_runs_in: str | None = None,
) -> list[Finding]:
    """``DRAFT_DTYPE_LOSSY`` when the drafter runs in a dtype it was not trained in, lossily.

    ``declared``: config.json's dtype; ``checkpoint``: the dtype most of its safetensors tensors
    hold (the truth, read first: a config's dtype is often stale; from the config alone the finding is info);
    ``runs_in``: what vLLM built it with.
    """
    # the checkpoint's tensors are what training wrote; a config's torch_dtype is often stale (the EAGLE-3 reference's
    # and SpecForge's configs say float16 for drafters trained and saved in bfloat16), so from the config alone the
    # finding is only info, settled by the safetensors headers
    trained = dtype_name(checkpoint) or dtype_name(declared)
    runs = dtype_name(runs_in)
    if role != "draft" or trained is None or runs is None or (trained, runs) not in LOSSY:
        return []
    severity, why = LOSSY[(trained, runs)]
    from_config = dtype_name(checkpoint) is None
    if from_config:
        severity = "info"
        why += ("; only config.json says the drafter was trained so, and trainers leave it stale: the checkpoint's "
                "tensor dtypes (safetensors headers) settle it")
    follows_target = target_runs_in is not None and dtype_name(target_runs_in) == runs
    return [
        codes.finding(
            codes.DRAFT_DTYPE_LOSSY,
            severity=severity,
            model_role=role,
            message=f"the drafter was trained in {trained} but vLLM runs it in {runs}"
            + (" (the target's dtype: vLLM builds the draft config with it)" if follows_target else "")
            + f": {why}",
            evidence={
                "declared_dtype": dtype_name(declared),
                "checkpoint_dtype": dtype_name(checkpoint),
                "runs_in": runs,
                "target_runs_in": dtype_name(target_runs_in),
                "trained_from": "config" if from_config else "checkpoint",
                **({"settled_by": "the checkpoint's tensor dtypes"} if from_config else {}),
            },
            fix=f"run the target in {trained} (--dtype {trained}) so the drafter gets it too"
            if follows_target
            else f"run the drafter in {trained}",
        )
    ]
