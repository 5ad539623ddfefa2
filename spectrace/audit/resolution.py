"""Config: what transformers did to what config.json declared (declared vs resolved)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from spectrace.audit import codes
from spectrace.config_dicts import (
    _BOOKKEEPING,
    _MISSING,
    ATTENTION_FIELDS,
    DFLASH_FIELDS,
    _declared_window,
    _dflash,
    _get,
    _is_window,
    _layer_kind,
    declared_sliding_intent,
    layer_plans,
)
from spectrace.audit.findings import Finding
from spectrace.console import RECORDED_ITEMS, bounded


@dataclass
class FieldDiff:
    model_role: str
    field: str
    declared: Any
    resolved: Any
    status: str  # ok | moved (by vLLM's speculators updater, to evidence.resolved's keys) | dropped | changed | defaulted

    def as_row(self) -> dict[str, Any]:
        return {
            "model_role": self.model_role,
            "field": self.field,
            # a field's value as recorded: lists cut past RECORDED_ITEMS with a count (a config can hold millions)
            "declared": json.dumps(bounded(self.declared, RECORDED_ITEMS), default=str),
            "resolved": json.dumps(bounded(self.resolved, RECORDED_ITEMS), default=str),
            "status": self.status,
        }

def _normalise(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_normalise(v) for v in value]
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    return value


def field_diffs(role: str, declared: dict[str, Any] | None, resolved: dict[str, Any] | None) -> list[FieldDiff]:
    """Every attention-relevant field, and every declared key that changed or vanished."""
    if declared is None:
        return []
    resolved = resolved or {}
    names = [f for f in ATTENTION_FIELDS]
    names += [f"dflash_config.{f}" for f in DFLASH_FIELDS if f in _dflash(declared) or f in _dflash(resolved)]
    names += [k for k in declared if k not in names and k not in _BOOKKEEPING and k != "dflash_config"]
    diffs = []
    for name in names:
        d = _get(declared, name)
        r = _get(resolved, name)
        if d is _MISSING and r is _MISSING:
            continue
        if name == "rope_scaling" and d is not _MISSING and r is _MISSING:
            r = _get(resolved, "rope_parameters")  # transformers 5 moved it
            if isinstance(r, dict) and isinstance(d, dict):
                r = {k: v for k, v in r.items() if k in d}
            elif d is None and isinstance(r, dict) and r.get("rope_type", "default") == "default":
                r = None  # "rope_scaling": null is no scaling: the default rope type, not a change
        if name == "rope_theta" and r is _MISSING:
            r = _get(resolved, "rope_parameters.rope_theta")
        if d is _MISSING:
            status = "defaulted"
        elif r is _MISSING:
            status = "dropped"
        elif _normalise(d) != _normalise(r):
            status = "changed"
        else:
            status = "ok"
        diffs.append(
            FieldDiff(role, name, None if d is _MISSING else d, None if r is _MISSING else r, status)
        )
    return diffs


def audit_config(
    role: str,
    declared: dict[str, Any] | None,
    resolved: dict[str, Any] | None,
) -> tuple[list[FieldDiff], list[Finding]]:
    """Findings about one model's config: what transformers did to what was declared."""
    diffs = field_diffs(role, declared, resolved)
    findings: list[Finding] = []
    if declared is None or resolved is None:
        return diffs, findings
    plans = layer_plans(declared, resolved)
    intent = declared_sliding_intent(declared)
    any_resolved_window = any(_is_window(p.resolved_window) for p in plans)
    root: str | None = None
    if intent and not any_resolved_window:
        root = codes.SWA_DROPPED
        window = _declared_window(declared)
        reasons = []
        if _get(declared, "sliding_window", None) is not None and _get(resolved, "sliding_window", None) is None:
            use = _get(declared, "use_sliding_window", None)
            reasons.append(
                "use_sliding_window is "
                + ("absent (default false)" if use is None else json.dumps(use))
                + f", so transformers' {resolved.get('model_type', '')} config set sliding_window to None"
            )
        if _get(declared, "layer_types", None) is None and _get(resolved, "layer_types", None) is not None:
            reasons.append("layer_types was not declared, so transformers derived it: every layer full attention")
        findings.append(
            codes.finding(
                codes.SWA_DROPPED,
                severity="error",
                model_role=role,
                message=(
                    f"{role} declares sliding-window attention (window {window}) but no layer gets a window "
                    "after config resolution: " + ("; ".join(reasons) or "the window was lost on resolution")
                ),
                evidence={
                    "declared": {k: _get(declared, k, None) for k in ("layer_types", "sliding_window", "use_sliding_window", "max_window_layers")},
                    "declared_dflash_config": _dflash(declared) or None,
                    "resolved": {k: _get(resolved, k, None) for k in ("layer_types", "sliding_window", "use_sliding_window", "max_window_layers")},
                },
            )
        )
    if _get(declared, "layer_types", None) is None and _get(resolved, "layer_types", None) is not None and (intent or root):
        findings.append(
            codes.finding(
                codes.LAYER_TYPES_DEFAULTED,
                severity="info" if root else "warning",
                model_role=role,
                message=f"{role} declares no layer_types; transformers derived {_summarise(_get(resolved, 'layer_types'))}",
                evidence={"resolved_layer_types": _get(resolved, "layer_types"), "max_window_layers": _get(resolved, "max_window_layers", None)},
                caused_by=root,
            )
        )
    for diff in diffs:
        if diff.field not in ATTENTION_FIELDS and not diff.field.startswith("dflash_config."):
            continue
        if diff.status not in ("dropped", "changed"):
            continue
        if diff.field == "layer_types" and diff.declared is None:
            continue
        if diff.field == "sliding_window" and diff.resolved is None and _get(declared, "use_sliding_window", None) is False:
            continue  # declared off (Qwen2-style "use_sliding_window": false): nulling it is what was asked
        caused = root if root and diff.field in ("sliding_window", "layer_types", "use_sliding_window") else None
        code = codes.FIELD_DROPPED if diff.status == "dropped" else codes.FIELD_CHANGED
        findings.append(
            codes.finding(
                code,
                severity="info" if caused else "warning",
                model_role=role,
                message=f"{role} {diff.field}: declared {json.dumps(diff.declared, default=str)}, "
                f"resolved {json.dumps(diff.resolved, default=str)}",
                evidence={"field": diff.field, "declared": diff.declared, "resolved": diff.resolved},
                fix="" if caused else f"check why {diff.field} changes on load",
                caused_by=caused,
            )
        )
    return diffs, findings


def _summarise(types: Any) -> str:
    if not isinstance(types, list) or not types:
        return repr(types)
    kinds = [_layer_kind(t) for t in types]
    if len(set(kinds)) == 1:
        return f"all {len(kinds)} layers {kinds[0]} attention"
    return ", ".join(kinds)


def root_causes(findings: Iterable[Finding]) -> set[str]:
    return {f.code for f in findings if f.severity in ("error", "warning") and f.caused_by is None}


def draft_root_causes(declared: dict | None, resolved: dict | None) -> tuple[set[str], list[Finding]]:
    """The drafter's config findings, and the codes among them that are root causes."""
    _, findings = audit_config("draft", declared, resolved)
    return root_causes(findings), findings
