"""Draft settings that never apply (issue #35): what was asked for the drafter against what it runs with.

- ``speculative_config.max_model_len``: vLLM stores it on the draft's ``ModelConfig``, but the proposer
  of both model runners sizes itself from the run's (the target's) ``max_model_len`` (vllm#52258); the
  proposer's own ``max_model_len`` is read after load (``vllm_objects.configs.draft_runtime``);
- ``draft_tensor_parallel_size``: the built drafter's layers report the tensor-parallel size they were
  sharded for (vllm#31886);
- ``--hf-overrides``: a dict override reaches the target's config only (vllm#58080: an MTP drafter without
  the target's YaRN); the drafter's resolved config is compared with each overridden key.

Facts come in as data; this module only compares.
"""

from __future__ import annotations

import json
from typing import Any

from spectrace.audit import codes
from spectrace.audit.findings import Finding

# drafters that share the target's positions (an override of the target's RoPE is meant for them too)
SHARED_POSITIONS = ("eagle", "eagle3", "dflash", "mtp", "dspark")
_POSITIONAL = ("rope", "max_position_embeddings", "partial_rotary_factor")


def audit_draft_settings(
    *,
    method: str | None,
    max_model_len: tuple[Any, Any] | None = None,
    tensor_parallel_size: tuple[Any, Any] | None = None,
    hf_overrides: list[dict[str, Any]] | None = None,
    role: str = "draft",
) -> list[Finding]:
    """``DRAFT_SETTING_IGNORED`` per setting asked for the drafter that it does not run with.

    ``max_model_len`` / ``tensor_parallel_size``: (asked, runs with), either None where unknown;
    ``hf_overrides``: per overridden key ``{"key", "asked", "target", "draft"}`` (the resolved values).
    """
    findings: list[Finding] = []
    for name, pair, rule, severity in (
        ("speculative_config.max_model_len", max_model_len,
         "the proposer's max_model_len (model runner) is the run's, not the draft ModelConfig's", "warning"),
        ("draft_tensor_parallel_size", tensor_parallel_size,
         "the drafter's layers are sharded with the run's parallel config", "warning"),
    ):
        if pair is None or pair[0] is None or pair[1] is None or pair[0] == pair[1]:
            continue
        asked, runs = pair
        findings.append(codes.finding(
            codes.DRAFT_SETTING_IGNORED, severity,
            model_role=role,
            message=f"{name} = {asked} was accepted, but the drafter runs with {runs}: {rule}",
            evidence={"setting": name, "asked": asked, "runs_with": runs, "method": method},
        ))
    if method in SHARED_POSITIONS:
        for override in hf_overrides or []:
            key, asked, draft = override["key"], override["asked"], override.get("draft")
            if json.dumps(asked, sort_keys=True, default=str) == json.dumps(draft, sort_keys=True, default=str):
                continue
            positional = any(word in key for word in _POSITIONAL)
            findings.append(codes.finding(
                codes.DRAFT_SETTING_IGNORED, "error" if positional else "warning",
                model_role=role,
                message=f"--hf-overrides {key} = {json.dumps(asked, default=str)} reached the target only: the {method} "
                f"drafter runs with {json.dumps(draft, default=str)}"
                + (" and shares the target's positions, so it rotates them differently" if positional else ""),
                evidence={"setting": f"hf_overrides.{key}", "asked": asked, "runs_with": draft,
                          "target": override.get("target"), "method": method},
                fix=f"declare {key} in the drafter's config.json (a dict --hf-overrides is applied to the target's "
                "config only)",
            ))
    return findings
