"""The audit: pure functions that turn captured config and layout into findings.

Nothing here imports vLLM or touches a process: the live hooks
(``spectrace.tracer``) and ``spectrace doctor`` feed the same functions with
plain dicts, and the unit tests feed them hand-written ones.

Root causes and consequences: each root cause is one ``error`` (or ``warning``)
finding; what follows from it is reported as ``info`` findings whose
``caused_by`` names the root cause's code, so a user reads one error, not five.
Finding codes are stable and documented in README.md.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

SLIDING = "sliding"
FULL = "full"
# a layer with a recurrent state and no KV window: linear attention, Gated DeltaNet, Mamba, short conv
# (hybrid targets such as Qwen3-Next); never full attention
LINEAR = "linear"
UNSPECIFIED = "unspecified"

# Config fields whose value decides the attention layout or the pairing.
ATTENTION_FIELDS = (
    "layer_types",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "num_hidden_layers",
    "max_position_embeddings",
    "rope_scaling",
    "vocab_size",
    "draft_vocab_size",
    "target_hidden_size",
    "eagle_aux_hidden_state_layer_ids",
    "target_layer_ids",
    "num_nextn_predict_layers",
)
DFLASH_FIELDS = ("swa_window_size", "use_swa", "target_layer_ids", "layer_ids", "mask_token_id", "causal")

# Speculative methods whose drafter is not a model (no draft config.json, no draft layers).
MODEL_FREE_METHODS = frozenset({"ngram", "[ngram]", "ngram_gpu", "suffix", "custom_class", "extract_hidden_states"})

# Keys that transformers rewrites on every load without changing their meaning.
_BOOKKEEPING = {"transformers_version", "torch_dtype", "dtype", "_name_or_path", "architectures"}


@dataclass
class Finding:
    code: str
    severity: str  # error | warning | info
    component: str  # config | layout | method | vocab | context | load
    model_role: str | None
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str = ""
    caused_by: str | None = None

    def as_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["evidence"] = json.dumps(self.evidence, sort_keys=True, default=str)
        return row


@dataclass
class FieldDiff:
    model_role: str
    field: str
    declared: Any
    resolved: Any
    status: str  # ok | dropped | changed | defaulted

    def as_row(self) -> dict[str, Any]:
        return {
            "model_role": self.model_role,
            "field": self.field,
            "declared": json.dumps(self.declared, default=str),
            "resolved": json.dumps(self.resolved, default=str),
            "status": self.status,
        }


@dataclass
class LayerPlan:
    """One attention layer: what the config declared, resolved to, and what runs."""

    layer_index: int
    declared_type: str = UNSPECIFIED
    declared_window: int | None = None
    resolved_type: str | None = None
    resolved_window: int | None = None
    runtime_type: str | None = None
    runtime_window: int | None = None
    layer_name: str | None = None
    kv_cache_spec: str | None = None
    causal: bool | None = None

    def as_row(self) -> dict[str, Any]:
        """The ``attention_layout`` columns of this layer (the live store and doctor's JSON)."""
        return asdict(self)


_MISSING = object()


# -- reading config dicts ------------------------------------------------------------


def _get(config: dict[str, Any] | None, dotted: str, default: Any = _MISSING) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _dflash(config: dict[str, Any] | None) -> dict[str, Any]:
    value = _get(config, "dflash_config", None)
    return value if isinstance(value, dict) else {}


def _layer_kind(value: Any) -> str:
    text = str(value).lower()
    if "sliding" in text or text in ("swa", "local", "local_attention"):
        return SLIDING
    if any(word in text for word in ("linear", "mamba", "delta", "conv", "recurrent")):
        return LINEAR
    return FULL


def _num_layers(*configs: dict[str, Any] | None) -> int:
    for config in configs:
        n = _get(config, "num_hidden_layers", None)
        if isinstance(n, int):
            return n
        types = _get(config, "layer_types", None)
        if isinstance(types, list):
            return len(types)
    return 0


def architecture(config: dict[str, Any] | None) -> str:
    archs = _get(config, "architectures", None) or []
    return archs[0] if archs else ""


def declared_sliding_intent(declared: dict[str, Any] | None) -> bool:
    """Does ``config.json`` mean some layer to slide?"""
    if declared is None:
        return False
    types = _get(declared, "layer_types", None)
    if isinstance(types, list) and any(_layer_kind(t) == SLIDING for t in types):
        return True
    dflash = _dflash(declared)
    if dflash.get("use_swa"):
        return True
    window = _get(declared, "sliding_window", None)
    if window is not None and _get(declared, "use_sliding_window", None) is not False:
        return True
    return False


def _declared_window(declared: dict[str, Any] | None) -> int | None:
    dflash = _dflash(declared)
    if dflash.get("swa_window_size") is not None:
        return dflash["swa_window_size"]
    return _get(declared, "sliding_window", None)


def _resolved_window(resolved: dict[str, Any] | None) -> int | None:
    dflash = _dflash(resolved)
    if dflash.get("swa_window_size") is not None:
        return dflash["swa_window_size"]
    return _get(resolved, "sliding_window", None)


def layer_plans(declared: dict[str, Any] | None, resolved: dict[str, Any] | None) -> list[LayerPlan]:
    """Declared and resolved type/window for every layer (runtime filled in later)."""
    n = _num_layers(resolved, declared)
    declared_types = _get(declared, "layer_types", None)
    resolved_types = _get(resolved, "layer_types", None)
    dflash_resolved = _dflash(resolved)
    plans = []
    for i in range(n):
        plan = LayerPlan(layer_index=i)
        if isinstance(declared_types, list) and i < len(declared_types):
            plan.declared_type = _layer_kind(declared_types[i])
            plan.declared_window = _declared_window(declared) if plan.declared_type == SLIDING else None
        else:
            plan.declared_type = UNSPECIFIED
            plan.declared_window = _declared_window(declared) if declared_sliding_intent(declared) else None
        if resolved is not None:
            if isinstance(resolved_types, list) and i < len(resolved_types):
                kind = _layer_kind(resolved_types[i])
            elif dflash_resolved.get("use_swa"):
                kind = SLIDING
            else:
                kind = FULL
            window = _resolved_window(resolved) if kind == SLIDING else None
            plan.resolved_type = kind
            plan.resolved_window = window
        plans.append(plan)
    return plans


def _is_window(value: Any) -> bool:
    return isinstance(value, int) and value > 0


# -- config: declared vs resolved ----------------------------------------------------


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
        root = "SWA_DROPPED"
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
            Finding(
                code="SWA_DROPPED",
                severity="error",
                component="config",
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
                fix=(
                    'add "use_sliding_window": true and an explicit "layer_types" list to config.json, '
                    'or give the window as "dflash_config": {"swa_window_size": N}'
                ),
            )
        )
    if _get(declared, "layer_types", None) is None and _get(resolved, "layer_types", None) is not None and (intent or root):
        findings.append(
            Finding(
                code="LAYER_TYPES_DEFAULTED",
                severity="info" if root else "warning",
                component="config",
                model_role=role,
                message=f"{role} declares no layer_types; transformers derived {_summarise(_get(resolved, 'layer_types'))}",
                evidence={"resolved_layer_types": _get(resolved, "layer_types"), "max_window_layers": _get(resolved, "max_window_layers", None)},
                fix='declare "layer_types" explicitly in config.json',
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
        code = "FIELD_DROPPED" if diff.status == "dropped" else "FIELD_CHANGED"
        findings.append(
            Finding(
                code=code,
                severity="info" if caused else "warning",
                component="config",
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


# -- layout: runtime vs resolved vs declared ----------------------------------------


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
            findings = [f for f in findings if f.code not in ("FIELD_CHANGED", "FIELD_DROPPED")]
        diffs.extend(model_diffs)
        by_role.setdefault(role, []).extend(findings)
    target = next((m for m in models if m["model_role"] == "target"), None)
    draft = next((m for m in models if m["model_role"] == "draft"), None)
    if target is not None and draft is not None and "draft" in by_role:
        reapplied_window(by_role["draft"], method, target["transformers_resolved"], draft["declared"])
    return diffs, by_role


def draft_root_causes(declared: dict | None, resolved: dict | None) -> tuple[set[str], list[Finding]]:
    """The drafter's config findings, and the codes among them that are root causes."""
    _, findings = audit_config("draft", declared, resolved)
    return root_causes(findings), findings


def with_runtime(plans: list[LayerPlan], layers: list[dict[str, Any]]) -> list[LayerPlan]:
    """``plans`` with what each layer runs (``spectrace.read.layers`` rows, in build order).

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
    if vs_resolved and "SWA_DROPPED" in causes and all(_runs_as_declared(p, plans) for p in vs_resolved):
        # the window resolution dropped runs anyway (a draft_model drafter gets the target's
        # window): what runs is what config.json meant, a consequence of SWA_DROPPED, not an error
        findings.append(
            Finding(
                code="LAYOUT_MISMATCH",
                severity="info",
                component="layout",
                model_role=role,
                message=f"{role}: {len(vs_resolved)} layer(s) run the window config.json declared, not their resolved "
                "config (vLLM applied a window from elsewhere, e.g. the target's for a draft_model drafter): "
                + _layers_text(vs_resolved, "resolved"),
                evidence={"layers": [asdict(p) for p in vs_resolved]},
                caused_by="SWA_DROPPED",
            )
        )
        vs_resolved = []
    if vs_resolved:
        findings.append(
            Finding(
                code="LAYOUT_MISMATCH",
                severity="error",
                component="layout",
                model_role=role,
                message=f"{role}: {len(vs_resolved)} layer(s) run differently from their resolved config: "
                + _layers_text(vs_resolved, "resolved"),
                evidence={"layers": [asdict(p) for p in vs_resolved]},
                fix="vLLM does not apply this config's layer layout; check the vLLM version's support for it",
            )
        )
    if vs_declared:
        caused = "SWA_DROPPED" if "SWA_DROPPED" in causes else None
        findings.append(
            Finding(
                code="LAYOUT_MISMATCH",
                severity="info" if caused else "error",
                component="layout",
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


# -- the pair: method, vocabulary, context -------------------------------------------

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
    base = _get(config, "max_position_embeddings", None)
    if not isinstance(base, int):
        return None
    scaling = _get(config, "rope_scaling", None) or _get(config, "rope_parameters", None)
    if isinstance(scaling, dict):
        kind = scaling.get("rope_type") or scaling.get("type")
        factor = scaling.get("factor")
        if kind not in (None, "default") and isinstance(factor, (int, float)) and factor > 1:
            original = scaling.get("original_max_position_embeddings") or base
            return int(original * factor)
    return base


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
        mismatch = Finding(
            code="METHOD_MISMATCH",
            severity="error",
            component="method",
            model_role="draft",
            message=f"drafter architecture {architecture(draft)} is a {implied} drafter, but vLLM runs it as "
            f"method {method!r}" + (" (inferred from the path)" if not method_given else ""),
            evidence={"architecture": architecture(draft), "implied_method": implied, "method": method, "method_given": method_given, "draft_path": draft_path},
            fix=f'pass "method": "{implied}" in --speculative-config',
        )
        findings.append(mismatch)
    if not method_given and draft_path:
        findings.append(
            Finding(
                code="METHOD_INFERRED",
                severity="info" if mismatch else "warning",
                component="method",
                model_role="draft",
                message=f"no method was given; vLLM inferred {method!r} from the draft path {draft_path!r}",
                evidence={"method": method, "draft_path": draft_path},
                fix=f'pass "method": "{implied or method}" explicitly',
                caused_by="METHOD_MISMATCH" if mismatch else None,
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
        Finding(
            code="VOCAB_MISMATCH",
            severity="error",
            component="vocab",
            model_role="draft",
            message=f"draft vocabulary ({dv}) and target vocabulary ({tv}) cannot line up for method {method!r}",
            evidence={"target_vocab_size": tv, "draft_vocab_size": dv, "draft_reduced_vocab": draft_vocab},
            fix="use a drafter trained for this target's tokenizer",
        )
    ]


def _audit_context(method, target, draft, target_max_model_len) -> list[Finding]:
    if method not in ("eagle", "eagle3", "dflash", "draft_model", "mtp"):
        return []
    draft_ctx = effective_context(draft)
    target_ctx = target_max_model_len or effective_context(target)
    if draft_ctx is None or target_ctx is None or draft_ctx >= target_ctx:
        return []
    return [
        Finding(
            code="DRAFT_CONTEXT_SHORT",
            severity="warning",
            component="context",
            model_role="draft",
            message=f"the drafter's effective context ({draft_ctx}) is shorter than the target's ({target_ctx}); "
            "drafts beyond it come from positions the drafter never saw",
            evidence={
                "draft_max_position_embeddings": _get(draft, "max_position_embeddings", None),
                "draft_rope_scaling": _get(draft, "rope_scaling", None),
                "target_context": target_ctx,
                "target_rope_scaling": _get(target, "rope_scaling", None),
            },
            fix="give the drafter the target's rope scaling (e.g. the same YaRN factor) or cap --max-model-len",
        )
    ]


def explain_load_error(error: str, draft_findings: list[Finding]) -> Finding:
    """vLLM refused to build a model: say why in config terms when a finding explains it."""
    needs_runner = runner_refusal(error)
    if needs_runner is not None:
        return _runner_load_failed(error, needs_runner)
    causes = root_causes(draft_findings)
    caused = None
    lowered = error.lower()
    if "SWA_DROPPED" in causes and ("window" in lowered or "sliding" in lowered):
        caused = "SWA_DROPPED"
    elif "VOCAB_MISMATCH" in causes and ("vocab" in lowered or "size mismatch" in lowered or "shape" in lowered):
        caused = "VOCAB_MISMATCH"
    elif "METHOD_MISMATCH" in causes:
        caused = "METHOD_MISMATCH"
    explanation = ""
    if caused:
        root = next(f for f in draft_findings if f.code == caused)
        explanation = f" This follows from {caused}: {root.message}"
    return Finding(
        code="LOAD_FAILED",
        severity="info" if caused else "error",
        component="load",
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
    return Finding(
        code="LOAD_FAILED",
        severity="error",
        component="load",
        model_role="draft",
        message=f"vLLM refused to build the model: {error.rstrip('.')}. This pair needs the {needs.upper()} model runner; "
        f"the {other.upper()} runner refuses it.",
        evidence={"error": error, "needs_runner": needs},
        fix=fix,
        caused_by=None,
    )


# -- hidden-state taps -----------------------------------------------------------------
#
# vLLM's tap id k is the hidden state after target layer k-1 (id 0: the embeddings);
# HF's ``hidden_states[k]``. EAGLE3 checkpoints declare ids in that convention. DFlash
# (and DSpark, and speculators' ``target_layer_ids``) declare target layer ids, and the
# DFlash reference (z-lab/dflash ``extract_context_feature``) reads
# ``hidden_states[layer_id + 1]``: the vLLM id is the declared id + 1.

# (field, convention offset): where drafters declare their taps and how each field's ids
# map to vLLM ids, roughly in the order vLLM 0.32's resolvers look (V2:
# v1/worker/gpu/spec_decode/eagle/eagle3_utils.py::get_eagle3_aux_layers_from_config;
# V1: GPUModelRunner._get_eagle3_aux_layers_from_config, which also reads the nested
# eagle_config ids and ignores the top-level and *.layer_ids fields). Which ids a
# runner really taps is read from the loaded model (live) or from the runner's own
# function (doctor), never from this table.
TAP_FIELDS: tuple[tuple[str, int], ...] = (
    ("eagle_aux_hidden_state_layer_ids", 0),
    ("eagle_config.eagle_aux_hidden_state_layer_ids", 0),
    ("dflash_config.target_layer_ids", 1),
    ("dspark_target_layer_ids", 1),
    ("target_layer_ids", 1),
    ("dflash_config.layer_ids", 0),
    ("eagle_config.layer_ids", 0),
)


@dataclass
class TapAudit:
    declared_field: str | None
    declared_ids: list[int] | None
    expected_ids: list[int] | None
    tapped_ids: list[int] | None
    input_taps: int | None  # taps the drafter's input projection (fc) is sized for
    status: str  # ok | defaulted | mismatch | out_of_range | count_mismatch | unknown

    def as_row(self) -> dict[str, Any]:
        return {
            "declared_field": self.declared_field,
            "declared_ids": json.dumps(self.declared_ids),
            "expected_ids": json.dumps(self.expected_ids),
            "tapped_ids": json.dumps(self.tapped_ids),
            "input_taps": self.input_taps,
            "status": self.status,
        }


def declared_taps(draft: dict[str, Any] | None) -> tuple[str | None, list[int] | None, int]:
    """(field, ids, convention offset) the drafter declares its taps in, or (None, None, 0)."""
    for field_name, offset in TAP_FIELDS:
        ids = _get(draft, field_name, None)
        if isinstance(ids, (list, tuple)) and ids:
            return field_name, [int(i) for i in ids], offset
    return None, None, 0


def audit_taps(
    *,
    draft: dict[str, Any] | None,
    target_layers: int,
    tapped_ids: list[int] | None,
    input_taps: int | None,
    rule: str = "",
) -> tuple[TapAudit, list[Finding]]:
    """Which target layers the drafter was trained on vs which ones vLLM taps.

    ``tapped_ids``: what the loaded target really taps (live), or what vLLM's id
    resolution gives (doctor). ``input_taps``: how many taps the drafter's input
    projection takes. ``rule`` names the vLLM function behind ``tapped_ids``.
    """
    field_name, declared, offset = declared_taps(draft)
    expected = sorted({i + offset for i in declared}) if declared else None
    tapped = sorted(set(tapped_ids)) if tapped_ids is not None else None
    findings: list[Finding] = []
    status = "ok"
    evidence = {
        "declared_field": field_name,
        "declared_ids": declared,
        "expected_ids": expected,
        "tapped_ids": tapped,
        "input_taps": input_taps,
        "target_layers": target_layers,
        "vllm_rule": rule,
    }
    if expected is not None:
        outside = [i for i in expected if i < 0 or i > target_layers]
        if outside:
            status = "out_of_range"
            findings.append(
                Finding(
                    code="TAP_OUT_OF_RANGE",
                    severity="error",
                    component="taps",
                    model_role="draft",
                    message=f"{field_name} = {declared} asks for hidden state(s) {outside}, but the target has "
                    f"{target_layers} layers (valid vLLM ids 0..{target_layers})",
                    evidence=evidence,
                    fix="use a drafter trained for this target, or correct the declared layer ids",
                )
            )
    if tapped is not None and input_taps is not None and len(tapped) != input_taps:
        status = "count_mismatch" if status == "ok" else status
        findings.append(
            Finding(
                code="TAP_COUNT_MISMATCH",
                severity="error",
                component="taps",
                model_role="draft",
                message=f"vLLM taps {len(tapped)} target layer(s) {tapped}, but the drafter's input projection "
                f"takes {input_taps}",
                evidence=evidence,
                fix="declare the drafter's layer ids in a field this vLLM reads (see evidence.declared_field)",
            )
        )
    if expected is None:
        status = "defaulted" if status == "ok" else status
        findings.append(
            Finding(
                code="TAP_DEFAULTED",
                severity="warning",
                component="taps",
                model_role="draft",
                message=f"the drafter declares no hidden-state layer ids; vLLM uses its default taps {tapped} "
                "(right for some checkpoints, wrong for others)",
                evidence=evidence,
                fix="declare the ids the drafter was trained on (eagle_aux_hidden_state_layer_ids, or "
                "dflash_config.target_layer_ids for DFlash)",
            )
        )
    elif tapped is not None and tapped != expected and status not in ("out_of_range",):
        if status == "ok":
            status = "mismatch"
        same_count = len(tapped) == len(expected)
        caused = "TAP_COUNT_MISMATCH" if not same_count and status == "count_mismatch" else None
        findings.append(
            Finding(
                code="TAP_MISMATCH",
                severity="info" if caused else "error",
                component="taps",
                model_role="draft",
                message=f"the drafter was trained on hidden states {expected} ({field_name} = {declared}"
                + (f", +{offset} for the reference convention" if offset else "")
                + f"), but vLLM taps {tapped}"
                + (": same count, so nothing fails and drafts are silently rejected" if same_count else ""),
                evidence=evidence,
                fix="declare the ids in a field this vLLM reads for this model runner "
                "(eagle_aux_hidden_state_layer_ids holds vLLM ids verbatim), or upgrade vLLM",
                caused_by=caused,
            )
        )
    return TapAudit(field_name, declared, expected, tapped, input_taps, status), findings


# -- DFlash causality ------------------------------------------------------------------


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
    if _get(declared, "is_causal", None) is not None or _dflash(declared).get("causal") is not None:
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
        Finding(
            code="CAUSAL_INFERRED",
            severity="warning",
            component="layout",
            model_role=role,
            message=f"the DFlash drafter declares no causality (is_causal, dflash_config.causal); vLLM chose {text}, "
            "from layer_types (sliding layers causal, full layers not)",
            evidence={
                "causal_by_layer": chosen,
                "from": source,
                "resolved_layer_types": _get(resolved, "layer_types", None),
                "vllm_rule": "vllm.model_executor.models.qwen3_dflash._dflash_layer_causal",
            },
            fix='declare how the drafter was trained: "dflash_config": {"causal": true|false} (or "is_causal")',
        )
    ]


# -- judged by what runs: a draft_model drafter gets the target's window ------------------


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
        if finding.code == "SWA_DROPPED" and finding.model_role == "draft" and finding.severity == "error":
            finding.severity = "warning"
            finding.message += (
                f". vLLM runs it with a window of {window} anyway: a draft_model drafter gets the target's window, "
                "so the window comes from the target, not from this config (another target would lose it)"
            )
            finding.evidence["runtime_window_from"] = "target"
            finding.evidence["target_window"] = window
    return findings


# -- the acceptance curve: boundaries from the run's configs, cliffs, dummy drafts ----------


@dataclass
class ContextBoundary:
    """A context length where a model's behaviour changes, known from a config."""

    tokens: int
    model_role: str
    field: str  # where it comes from: sliding_window, max_position_embeddings, ...
    explained_by: tuple[str, ...] = ()  # config findings that would explain a cliff here

    def as_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "model_role": self.model_role, "field": self.field}


def context_boundaries(
    *,
    method: str | None,
    target_declared: dict[str, Any] | None,
    target_resolved: dict[str, Any] | None,
    draft_declared: dict[str, Any] | None,
    draft_resolved: dict[str, Any] | None,
    max_model_len: int | None = None,
) -> list[ContextBoundary]:
    """Each model's declared sliding window, the drafter's ``max_position_embeddings`` and
    its rope original length, and the target's window; below ``max_model_len`` only."""
    found: list[ContextBoundary] = []

    def add(tokens: Any, role: str, field_name: str, explained: tuple[str, ...] = ()) -> None:
        if not _is_window(tokens) or (max_model_len and tokens >= max_model_len):
            return
        if any(b.tokens == tokens and b.model_role == role for b in found):
            return
        found.append(ContextBoundary(int(tokens), role, field_name, explained))

    drafter_explains = ("SWA_DROPPED", "LAYOUT_MISMATCH", "DRAFT_CONTEXT_SHORT")
    add(_declared_window(target_declared), "target", "sliding_window (declared)")
    add(target_window(target_resolved), "target", "sliding_window")
    if draft_declared is not None and method not in MODEL_FREE_METHODS:
        add(_declared_window(draft_declared), "draft", "sliding_window (declared)", drafter_explains)
        add(_resolved_window(draft_resolved), "draft", "sliding_window", drafter_explains)
        add(_get(draft_declared, "max_position_embeddings", None), "draft", "max_position_embeddings", ("DRAFT_CONTEXT_SHORT",))
        scaling = _get(draft_declared, "rope_scaling", None) or _get(draft_declared, "rope_parameters", None)
        if isinstance(scaling, dict):
            add(scaling.get("original_max_position_embeddings"), "draft", "rope original_max_position_embeddings", ("DRAFT_CONTEXT_SHORT",))
    return sorted(found, key=lambda b: b.tokens)


def context_cliff_finding(boundary: ContextBoundary, cliff: Any, roots: set[str], rates_by_range: dict[str, Any]) -> Finding:
    """``CONTEXT_CLIFF`` at ``boundary`` (``cliff``: an ``acceptance.Cliff``)."""
    caused = next((code for code in boundary.explained_by if code in roots), None)
    return Finding(
        code="CONTEXT_CLIFF",
        severity="warning" if caused else "error",
        component="verification",
        model_role=boundary.model_role,
        message=f"acceptance falls from {cliff.before_rate:.1%} below context {boundary.tokens} to {cliff.after_rate:.1%} "
        f"past it; {boundary.tokens} is the {boundary.model_role}'s {boundary.field}"
        + (f" ({caused} explains it)" if caused else ""),
        evidence={
            "boundary": boundary.as_dict(),
            "before": {"drafted": cliff.before_drafted, "accepted": cliff.before_accepted, "rate": round(cliff.before_rate, 4)},
            "after": {"drafted": cliff.after_drafted, "accepted": cliff.after_accepted, "rate": round(cliff.after_rate, 4)},
            "rates_by_context": rates_by_range,
        },
        fix="give the drafter the target's context (its max_position_embeddings, rope scaling and window), "
        "or cap --max-model-len at the boundary",
        caused_by=caused,
    )


def position_cliff_finding(position: int, drafted_at: list[int], accepted_at: list[int], method: str | None, parallel: bool | None) -> Finding:
    rates = [round(a / d, 4) if d else None for a, d in zip(accepted_at, drafted_at)]
    hint = (
        "parallel drafting is on: a drafter not trained for it predicts only position 0"
        if parallel
        else "typical of wrong hidden-state taps (position 0 sees the target's states, later ones the drafter's own)"
        if method in ("eagle", "eagle3", "mtp")
        else "the drafter's later positions do not follow the target"
    )
    return Finding(
        code="POSITION_CLIFF",
        severity="error",
        component="verification",
        model_role="draft",
        message=f"position {position} accepts {rates[position]:.1%} of its drafts, position {position + 1} almost none of "
        f"what position {position} accepted ({accepted_at[position + 1]} of {accepted_at[position]}); {hint}",
        evidence={"position": position, "drafted_by_position": drafted_at, "accepted_by_position": accepted_at, "rates_by_position": rates, "parallel_drafting": parallel},
        fix="check the drafter's taps and its drafting mode (parallel_drafting), or lower num_speculative_tokens "
        f"to {position + 1} until it is fixed",
    )


def dummy_drafts_finding(
    rows: int, repeated: int, by_token: dict[int, int], *, length_gate: ContextBoundary | None = None, roots: set[str] = frozenset()
) -> Finding:
    """``DUMMY_DRAFTS``; ``length_gate``: the drafter's own length, when it is shorter than the run's.

    vLLM 0.32 (``GPUModelRunner._input_fits_in_drafter``) skips the drafter for the whole
    batch once the batch's longest context + k passes the drafter's max_model_len (its
    ``max_position_embeddings``) and sends token-0 drafts instead: then the short context
    (``DRAFT_CONTEXT_SHORT``) is the cause.
    """
    token, count = max(by_token.items(), key=lambda item: item[1])
    gated = length_gate is not None and token == 0
    caused = "DRAFT_CONTEXT_SHORT" if gated and "DRAFT_CONTEXT_SHORT" in roots else None
    reason = (
        f"; vLLM sends token-0 drafts for a whole batch once its longest context + k passes the drafter's "
        f"max_model_len ({length_gate.tokens}, its {length_gate.field})"
        if gated
        else "; the drafter emits placeholders, not predictions"
    )
    return Finding(
        code="DUMMY_DRAFTS",
        severity="warning" if caused else "error",
        component="verification",
        model_role="draft",
        message=f"{repeated / rows:.1%} of draft rows ({repeated} of {rows}) are one token id repeated "
        f"(most often {token}: {count} rows) and the target rejects them{reason}",
        evidence={"rows": rows, "repeated_rows": repeated, "share": round(repeated / rows, 4),
                  "by_token": {str(k): v for k, v in sorted(by_token.items())},
                  "length_gate": length_gate.as_dict() if gated else None,
                  "vllm_rule": "vllm.v1.worker.gpu_model_runner.GPUModelRunner._input_fits_in_drafter" if gated else None},
        fix="give the drafter the target's context length, or cap --max-model-len at it" if gated
        else "check the drafter's final norm and lm_head weights (a zero norm drafts token 0 everywhere)",
        caused_by=caused,
    )


def not_paying_finding(evidence: dict[str, Any]) -> Finding:
    return Finding(
        code="SPECULATION_NOT_PAYING",
        severity="warning",
        component="verification",
        model_role="draft",
        message=f"speculation costs more than it saves: estimated speed-up {evidence['speedup_estimate']:.2f}x over "
        f"{evidence['window_steps']} steps (mean acceptance length {evidence['mean_acceptance_length']:.2f}, "
        f"drafting {evidence['draft_ms_per_step']:.2f} ms and verifying {evidence['verify_ms_per_step']:.2f} ms per step, "
        f"{evidence.get('no_draft_ms_per_step', 0):.2f} ms without drafts)",
        evidence=evidence,
        fix="turn speculative decoding off for this traffic, lower num_speculative_tokens, or use a better drafter",
    )


# -- ranks of one engine ------------------------------------------------------------


def rank_disagreements(
    layouts: dict[int, list[tuple]], taps: dict[int, list[int] | None], counts: dict[int, tuple[int, int]]
) -> list[Finding]:
    """RANK_DISAGREEMENT where the ranks of one engine (tensor parallelism) differ.

    Every rank builds the whole model and verifies the same batch, so each one's
    ``layouts`` (per rank: ``(model_role, layer_index, runtime_type, runtime_window, causal)``
    rows), ``taps`` (tapped ids) and verified ``counts`` (drafted, accepted) must equal
    the lowest rank's. One finding per aspect that differs, naming the ranks.
    """
    findings = []
    for aspect, by_rank, what in (
        ("layout", {r: sorted(rows) for r, rows in layouts.items()}, "attention layout (type, window, causal per layer)"),
        ("taps", taps, "hidden-state taps"),
        ("counts", counts, "verified drafted / accepted tokens"),
    ):
        if len(by_rank) < 2:
            continue
        ranks = sorted(by_rank)
        reference = by_rank[ranks[0]]
        differ = [r for r in ranks[1:] if by_rank[r] != reference]
        if not differ:
            continue
        evidence: dict[str, Any] = {"aspect": aspect, "ranks": ranks, "differing_ranks": differ}
        if aspect == "layout":
            evidence["layers"] = {
                str(r): [row for row in by_rank[r] if row not in reference] for r in differ
            }
            evidence["reference_layers"] = [row for row in reference if any(row not in by_rank[r] for r in differ)]
        else:
            evidence["values"] = {str(r): by_rank[r] for r in ranks}
        findings.append(
            Finding(
                code="RANK_DISAGREEMENT",
                severity="error",
                component="ranks",
                model_role=None,
                message=f"rank(s) {differ} differ from rank {ranks[0]} in {what}",
                evidence=evidence,
                fix="every rank must build and verify the same model: check per-rank config overrides, "
                "the vLLM build on each device, and report to vLLM if the configs are identical",
            )
        )
    return findings
