"""Layout: what each layer runs vs its resolved config vs config.json (LAYOUT_MISMATCH)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from spectrace.audit import codes
from spectrace.audit.causality import audit_causality
from spectrace.audit.pair import RAISED_CONTEXT_METHODS
from spectrace.config_dicts import FULL, SLIDING, UNSPECIFIED, LayerPlan, _is_window, layer_plans
from spectrace.audit.findings import Finding
from spectrace.audit.resolution import FieldDiff, audit_config, draft_root_causes
from spectrace.audit.window import reapplied_window


def config_findings(
    models: list[dict[str, Any]], method: str | None = None
) -> tuple[list[FieldDiff], dict[str, list[Finding]]]:
    """``audit_config`` of each model of one engine (``model_role``, ``declared``,
    ``transformers_resolved``): field diffs, and findings per role."""
    diffs: list[FieldDiff] = []
    by_role: dict[str, list[Finding]] = {}
    for model in models:
        role = model["model_role"]
        model_diffs, findings = audit_config(role, model["declared"], model["transformers_resolved"])
        if role == "draft" and method == "mtp":
            # vLLM re-reads the target checkpoint for MTP and rewrites its fields through
            # SpeculativeConfig.hf_config_override by design: not a finding.
            findings = [f for f in findings if f.code not in (codes.FIELD_CHANGED, codes.FIELD_DROPPED)]
        if role == "draft" and method in RAISED_CONTEXT_METHODS:
            # SpeculativeConfig._maybe_override_draft_max_position_embeddings raises an EAGLE drafter's
            # max_position_embeddings to the target's context on purpose (vllm#48894), on the config object
            # transformers returned (so it reads as transformers' change): DRAFT_CONTEXT_SHORT says what it means
            findings = [f for f in findings if not (
                f.code == codes.FIELD_CHANGED and f.evidence.get("field") == "max_position_embeddings"
                and isinstance(f.evidence.get("declared"), int) and isinstance(f.evidence.get("resolved"), int)
                and f.evidence["resolved"] > f.evidence["declared"])]
        diffs.extend(model_diffs)
        by_role.setdefault(role, []).extend(findings)
    target = next((m for m in models if m["model_role"] == "target"), None)
    draft = next((m for m in models if m["model_role"] == "draft"), None)
    if target is not None and draft is not None and "draft" in by_role:
        reapplied_window(by_role["draft"], method, target["transformers_resolved"], draft["declared"])
    return diffs, by_role


def with_runtime(plans: list[LayerPlan], layers: list[dict[str, Any]]) -> list[LayerPlan]:
    """``plans`` with what each layer runs (``spectrace.vllm_objects.layers`` rows, in build order).

    Layer i of the build is layer i of the config; layers the config does not know get
    a plan of their own, and plans beyond the built layers are dropped.
    """
    merged = []
    for i, layer in enumerate(layers):
        plan = plans[i] if i < len(plans) else LayerPlan(layer_index=i)
        plan.layer_index = i
        plan.layer_name = layer.get("layer_name")
        plan.runtime_type = layer.get("runtime_type")
        plan.runtime_window = layer.get("runtime_window")
        plan.kv_cache_spec = layer.get("kv_cache_spec")
        plan.causal = layer.get("causal")
        merged.append(plan)
    return merged


def mismatched_layers(plans: list[LayerPlan]) -> tuple[list[LayerPlan], list[LayerPlan]]:
    """The layers that run differently from their resolved config, and from config.json.

    The one rule behind ``LAYOUT_MISMATCH`` and the report's "!" on a layer.
    """
    vs_resolved = []
    vs_declared = []
    # Without declared layer_types a window says "some layers slide" (which ones is the
    # model's own pattern, e.g. Gemma 3's sliding_window_pattern): met when any layer
    # runs with it, and then a layer that runs full as resolved is no mismatch.
    window_met = any(
        p.declared_type == UNSPECIFIED and p.runtime_type == SLIDING and p.runtime_window == p.declared_window
        for p in plans
    )
    for p in plans:
        if p.runtime_type is None:
            continue
        if p.resolved_type is not None and (
            p.runtime_type != p.resolved_type or (p.runtime_type == SLIDING and p.runtime_window != p.resolved_window)
        ):
            vs_resolved.append(p)
        elif p.declared_type != UNSPECIFIED and (
            p.runtime_type != p.declared_type or (p.runtime_type == SLIDING and p.runtime_window != p.declared_window)
        ):
            vs_declared.append(p)
        elif (
            p.declared_type == UNSPECIFIED
            and _is_window(p.declared_window)
            and p.runtime_window != p.declared_window
            and not window_met
        ):
            vs_declared.append(p)
    return vs_resolved, vs_declared


def audit_model_layout(
    role: str,
    declared: dict[str, Any] | None,
    resolved: dict[str, Any] | None,
    layers: list[dict[str, Any]] | None,
    *,
    method: str | None = None,
) -> tuple[list[LayerPlan], list[Finding]]:
    """One model's layer plans and LAYOUT_MISMATCH findings (no runtime ``layers``: plans only)."""
    if role == "draft" and method == "mtp":
        # an MTP drafter is the target's own checkpoint: its layer_types describe the target's
        # decoder (e.g. Qwen3-Next's linear-attention pattern), not the MTP layers
        declared, resolved = _without_layer_types(declared), _without_layer_types(resolved)
    plans = layer_plans(declared, resolved)
    if layers is None:
        return plans, []
    plans = with_runtime(plans, layers)
    causes, _ = draft_root_causes(declared, resolved)
    return plans, audit_layout(role, plans, causes) + audit_causality(role, declared, resolved, plans)


def _without_layer_types(config: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if config is None else {k: v for k, v in config.items() if k != "layer_types"}


def audit_layout(role: str, plans: list[LayerPlan], causes: set[str]) -> list[Finding]:
    """LAYOUT_MISMATCH where a layer runs differently from its config."""
    findings = []
    vs_resolved, vs_declared = mismatched_layers(plans)
    if vs_resolved and codes.SWA_DROPPED in causes and all(_runs_as_declared(p, plans) for p in vs_resolved):
        # the window resolution dropped runs anyway (a draft_model drafter gets the target's
        # window): what runs is what config.json meant, a consequence of SWA_DROPPED, not an error
        findings.append(
            codes.finding(
                codes.LAYOUT_MISMATCH,
                severity="info",
                model_role=role,
                message=f"{role}: {len(vs_resolved)} layer(s) run the window config.json declared, not their resolved "
                "config (vLLM applied a window from elsewhere, e.g. the target's for a draft_model drafter): "
                + _layers_text(vs_resolved, "resolved"),
                evidence={"layers": [asdict(p) for p in vs_resolved]},
                fix="",
                caused_by=codes.SWA_DROPPED,
            )
        )
        vs_resolved = []
    if vs_resolved:
        findings.append(
            codes.finding(
                codes.LAYOUT_MISMATCH,
                severity="error",
                model_role=role,
                message=f"{role}: {len(vs_resolved)} layer(s) run differently from their resolved config: "
                + _layers_text(vs_resolved, "resolved"),
                evidence={"layers": [asdict(p) for p in vs_resolved]},
                fix="vLLM does not apply this config's layer layout; check the vLLM version's support for it",
            )
        )
    if vs_declared:
        caused = codes.SWA_DROPPED if codes.SWA_DROPPED in causes else None
        findings.append(
            codes.finding(
                codes.LAYOUT_MISMATCH,
                severity="info" if caused else "error",
                model_role=role,
                message=f"{role}: {len(vs_declared)} layer(s) run differently from config.json: "
                + _layers_text(vs_declared, "declared"),
                evidence={"layers": [asdict(p) for p in vs_declared]},
                fix="" if caused else "the layout declared in config.json is not what runs",
                caused_by=caused,
            )
        )
    return findings


def _runs_as_declared(plan: LayerPlan, plans: list[LayerPlan]) -> bool:
    """Does ``plan`` run what config.json declared (type and window)?"""
    if plan.declared_type == UNSPECIFIED:
        if not _is_window(plan.declared_window):
            return plan.runtime_type == FULL
        return plan.runtime_type == SLIDING and plan.runtime_window == plan.declared_window
    if plan.runtime_type != plan.declared_type:
        return False
    return plan.runtime_type != SLIDING or plan.runtime_window == plan.declared_window


def _layers_text(plans: list[LayerPlan], against: str) -> str:
    parts = []
    for p in plans[:8]:
        want_type = p.resolved_type if against == "resolved" else p.declared_type
        want_window = p.resolved_window if against == "resolved" else p.declared_window
        parts.append(
            f"layer {p.layer_index} runs {p.runtime_type}"
            + (f"({p.runtime_window})" if p.runtime_type == SLIDING else "")
            + f", {against} {want_type}"
            + (f"({want_window})" if want_window else "")
        )
    if len(plans) > 8:
        parts.append(f"... {len(plans) - 8} more")
    return "; ".join(parts)


# The audit's verdict on each layer (the ``status`` label of the layout series, what Grafana shows).
MISMATCH = "MISMATCH"  # named by a LAYOUT_MISMATCH error
EXPLAINED = "explained"  # named by a LAYOUT_MISMATCH that another finding causes (info)
MATCH = "match"  # runs as its config says
UNDECLARED = "undeclared"  # config.json gives this layer no type, and nothing is wrong with it
LAYOUT_STATUSES = (MISMATCH, EXPLAINED, MATCH, UNDECLARED)


def layout_status(plans: list[LayerPlan], findings: list[Finding]) -> list[str]:
    """One verdict per plan, from the ``LAYOUT_MISMATCH`` findings that name its layer.

    The one rule: a layer is ``MISMATCH`` exactly when a ``LAYOUT_MISMATCH`` error names
    it, so a panel that filters on this status agrees with the findings.
    """
    named: dict[int, str] = {}
    for finding in findings:
        if finding.code != codes.LAYOUT_MISMATCH:
            continue
        verdict = MISMATCH if finding.severity == "error" else EXPLAINED
        for layer in finding.evidence.get("layers", []):
            index = layer["layer_index"]
            if named.get(index) != MISMATCH:
                named[index] = verdict
    return [
        named.get(p.layer_index, UNDECLARED if p.declared_type == UNSPECIFIED else MATCH)
        for p in plans
    ]
