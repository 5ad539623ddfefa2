"""Judged by what runs: a draft_model drafter gets the target's window."""

from __future__ import annotations

from typing import Any

from spectrace.audit import codes
from spectrace.config_dicts import SLIDING, _declared_window, _is_window, layer_plans
from spectrace.audit.findings import Finding


def target_window(resolved_target: dict[str, Any] | None) -> int | None:
    """The window the target's sliding layers use after resolution (None: no sliding layer)."""
    plans = layer_plans(resolved_target, resolved_target)
    windows = [p.resolved_window for p in plans if p.resolved_type == SLIDING and _is_window(p.resolved_window)]
    return windows[0] if windows else None


def reapplied_window(findings: list[Finding], method: str | None, target_resolved: dict[str, Any] | None, draft_declared: dict[str, Any] | None) -> list[Finding]:
    """A drafter's dropped window that vLLM re-applies: at most a warning naming why.

    vLLM 0.32 builds a ``draft_model`` drafter's attention with the target's sliding
    window (measured on CPU; the drafter's own resolved window is not used). When the
    window the drafter's config.json declared is the target's, what runs is what the
    config meant: ``SWA_DROPPED`` becomes a warning (the window comes from the target,
    not from this config), and its consequences stay info.
    """
    if method != "draft_model":
        return findings
    window = target_window(target_resolved)
    declared = _declared_window(draft_declared)
    if window is None or declared != window:
        return findings
    for finding in findings:
        if finding.code == codes.SWA_DROPPED and finding.model_role == "draft" and finding.severity == "error":
            finding.severity = "warning"
            finding.message += (
                f". vLLM runs it with a window of {window} anyway: a draft_model drafter gets the target's window, "
                "so the window comes from the target, not from this config (another target would lose it)"
            )
            finding.evidence["runtime_window_from"] = "target"
            finding.evidence["target_window"] = window
    return findings
