"""The load-time judge: what the recorder's load-time hooks read (``spectrace.load_facts.LoadFacts``), judged.

The recorder reads, this module judges, in the flush that takes the reading (``Collector.facts``): in the pipeline
process, or in the traced process in the thread shape. Each kind has one function here (:data:`JUDGES`) that makes
what the hook once made itself: the rows (``config_fields``, ``attention_layout``, ``hidden_state_taps``,
``model_weights``), the value records for ``/metrics`` (``LayoutVerdicts``, ``Taps``) and the findings
(``spectrace.collector.findings``), the same calls ``spectrace doctor`` makes on meta-built models. The findings hang
on a span of their own, ``spectrace.audit`` (the taps' on ``spectrace.hidden_states.taps``), the child of the span
the hook read in (the frontend's run span, the worker's ``spectrace.worker.load_model``).

:func:`run_context` is the static judge's part the drain needs of a run (``RunConfig``'s context facts).
"""

from __future__ import annotations

import json
from typing import Any, Callable

from spectrace import audit, load_facts
from spectrace.audit.draft_settings import audit_draft_settings
from spectrace.audit.dtype import declared_dtype, dtype_name
from spectrace.audit.rope import audit_rope, rope_of, runtime_rope
from spectrace.audit.weights import audit_head, audit_weights, target_head_shape, unloaded_parameters, unused_tensors
from spectrace.collector import findings as findings_out
from spectrace.console import EVIDENCE_ITEMS
from spectrace.values import LayoutVerdicts, Taps

TAPS_RULE = "EagleModelMixin.aux_hidden_state_layers of the loaded target (set by the model runner)"


def judge(rt, facts: load_facts.LoadFacts) -> None:
    """One reading judged into ``rt``'s pipeline (rows, values, findings) under its reader's role, rank and run."""
    JUDGES[facts.kind](rt, facts, **facts.facts)


# -- the spans and rows of a reading -------------------------------------------------------------------------


def _parent(facts: load_facts.LoadFacts):
    """The OpenTelemetry context of the span the hook read in (None: the run's)."""
    if facts.parent is None:
        return None
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    trace_id, span_id = facts.parent
    context = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(context))


def _emit(rt, facts: load_facts.LoadFacts, findings: list, name: str = "spectrace.audit",
          attributes: dict[str, Any] | None = None) -> None:
    """``findings`` written, on a span ``name`` under the hook's (opened only where there are findings, or
    ``attributes`` to say)."""
    if not findings and attributes is None:
        return
    run = rt.run_by_id(facts.run_id)
    span = rt.start_span(name, role=facts.role, rank=facts.rank, run=run, parent=_parent(facts),
                         attributes={"spectrace.audit.kind": facts.kind, **(attributes or {})})
    try:
        findings_out.emit(rt, findings, role=facts.role, span=span, rank=facts.rank, run=run)
    finally:
        span.end()


def _dtypes(by_role: dict | None) -> dict | None:
    """Each role's dtype as the audit names it (``dtype_name``: the readers ship vLLM's and the headers' text)."""
    return {role: dtype_name(value) for role, value in by_role.items()} if by_role is not None else None


def _rows(rt, facts: load_facts.LoadFacts, table: str, rows: list[dict[str, Any]]) -> None:
    common = rt.common(facts.role, facts.rank, run_id=facts.run_id)
    rt.pipeline.extend(table, [{**common, **row} for row in rows])


# -- the frontend's config resolution ---------------------------------------------------------------------------


def _resolution(rt, facts, *, runs_in: dict | None, checkpoint_dtypes: dict, **run_facts: Any) -> None:
    """``audit.judge`` on what the frontend knows (it builds no model: the layout is judged at the worker's)."""
    judged = audit.judge(audit.RunFacts(
        runs_in=_dtypes(runs_in), checkpoint_dtypes=_dtypes(checkpoint_dtypes),
        **run_facts))
    _rows(rt, facts, "config_fields", [d.as_row() for d in judged.diffs])
    _emit(rt, facts, judged.findings)


# -- the worker's built models ------------------------------------------------------------------------------------


def _layout(rt, facts, *, models: list[dict[str, Any]], method: str | None) -> None:
    """``attention_layout`` rows for target and drafter, their verdicts for ``/metrics``, LAYOUT_MISMATCH."""
    rows, statuses, findings = [], [], []
    for model in models:
        plans, model_findings = audit.audit_model_layout(model["model_role"], model["declared"], model["resolved"],
                                                         model["layers"], method=method)
        rows += [{"model_role": model["model_role"], **plan.as_row(), "process": facts.role} for plan in plans]
        statuses += audit.layout_status(plans, model_findings)
        findings += model_findings
    _rows(rt, facts, "attention_layout", rows)
    if rt.metered:
        rt.pipeline.note(LayoutVerdicts(facts.run_id, [{**row, "status": status} for row, status in zip(rows, statuses)]))
    _emit(rt, facts, findings)


def _build_error(rt, facts, *, error: str, declared: dict | None, resolved: dict | None) -> None:
    """vLLM refused to build the model: LOAD_FAILED in config terms."""
    _emit(rt, facts, [audit.explain_build_error(error, declared, resolved)])


def _taps(rt, facts, **tap_facts: Any) -> None:
    """The loaded target's taps: a ``hidden_state_taps`` row, its span with the TAP_* findings, the ``/metrics``
    taps."""
    tap, findings = audit.audit_taps(**tap_facts, rule=TAPS_RULE)
    _rows(rt, facts, "hidden_state_taps", [{"model_role": "draft", **tap.as_row()}])
    named = (("declared_ids", tap.declared_ids), ("expected_ids", tap.expected_ids), ("tapped_ids", tap.tapped_ids))
    _emit(rt, facts, findings, "spectrace.hidden_states.taps", {
        "spectrace.taps.declared_field": tap.declared_field or "",
        # at most EVIDENCE_ITEMS ids each (a list from someone's config can be millions long), and how many in all
        **{f"spectrace.taps.{name}": list((ids or [])[:EVIDENCE_ITEMS]) for name, ids in named},
        **{f"spectrace.taps.{name}_count": len(ids) for name, ids in named if ids is not None and len(ids) > EVIDENCE_ITEMS},
        "spectrace.taps.status": tap.status,
    })
    if rt.metered and tap.tapped_ids is not None:
        expected = tap.expected_ids or []
        rt.pipeline.note(Taps(facts.run_id, [
            {"expected_id": expected[i] if i < len(expected) else "none", "tapped_id": tapped}
            for i, tapped in enumerate(tap.tapped_ids)
        ]))


def _weights(rt, facts, *, models: list[dict[str, Any]], shared: dict[str, str | None], method: str | None,
             has_own_lm_head: bool | None, draft_settings: dict | None) -> None:
    """``model_weights`` rows for target and drafter, and the drafter's weight, head, runtime-RoPE and
    draft-settings findings (``spectrace.recorder.weights`` read them)."""
    rows, findings, manifests = [], [], {}
    by_role = {model["model_role"]: model for model in models}
    for model in models:
        role, manifest, loaded = model["model_role"], model["manifest"], model["loaded"]
        own = model["own_checkpoint"]
        own_shared = shared if role == "draft" else {}
        rope = rope_of(model["resolved"])
        rows.append({
            "model_role": role,
            "model": model["model"],
            "checkpoint_files": len(manifest.files),
            "checkpoint_tensors": len(manifest.tensors),
            "checkpoint_dtypes": json.dumps(manifest.dtypes()),
            "manifest_error": manifest.error,
            "manifest_ms": model["manifest_ms"],
            "quantization": model["quantization"],
            "parameters": len(model["parameters"]) if model["parameters"] is not None else None,
            "loaded": len(loaded) if loaded is not None else None,
            "unloaded": json.dumps(unloaded_parameters(model["parameters"], loaded, own_shared, model["inert"])
                                   if loaded is not None and model["parameters"] else None),
            "unused_tensors": json.dumps(unused_tensors(manifest.tensors, loaded) if loaded is not None and own else None),
            "embed_tokens": own_shared.get("embed_tokens"),
            "lm_head": own_shared.get("lm_head"),
            "declared_dtype": declared_dtype(model["declared"]),
            "runtime_dtype": model["runtime_dtype"],
            "declared_rope": json.dumps(rope.as_dict() if rope is not None else None),
            "runtime_rope": json.dumps(model["rotary"]),
        })
        manifests[role] = manifest if manifest.error is None and own else None
        if role == "draft":
            # a drafter in the target's checkpoint (MTP) leaves the target's tensors to the target
            findings += audit_weights("draft", tensors=manifest.tensors if manifest.error is None and own else None,
                                      parameters=model["parameters"], loaded=loaded, shared=shared,
                                      quantization=model["quantization"], inert=model["inert"])
    if "draft" in manifests:
        # the drafter's own head against the module it computes its logits with (after vLLM's sharing)
        target = manifests.get("target")
        findings += audit_head("draft", tensors=manifests["draft"].tensors if manifests["draft"] else None,
                               shared=shared, has_own_lm_head=has_own_lm_head,
                               target_shape=target_head_shape(target.tensors) if target else None)
    findings += _runtime_rope(method, by_role)
    # draft settings the loaded runner ignores (speculative max_model_len, draft TP): the runtime answers
    findings += audit_draft_settings(**draft_settings) if draft_settings else []
    _rows(rt, facts, "model_weights", rows)
    _emit(rt, facts, findings)


def _runtime_rope(method: str | None, models: dict[str, dict[str, Any]]) -> list:
    """The rotary modules' RoPE compared, when the configs agree (the config finding is the frontend's)."""
    if "draft" not in models or "target" not in models:
        return []
    target, draft = models["target"], models["draft"]
    if audit_rope(method, rope_of(target["resolved"]), rope_of(draft["resolved"])):
        return []
    return audit_rope(method, runtime_rope(target["rotary"]), runtime_rope(draft["rotary"]), where="built rotary modules")


def _failed_load(rt, facts, *, manifest, parameters, loaded, quantization, inert) -> None:
    """vLLM refused a load: the drafter's weight findings from what its loader filled before it raised."""
    _emit(rt, facts, audit_weights("draft", tensors=manifest.tensors if manifest.error is None else None,
                                   parameters=parameters, loaded=loaded, shared={}, quantization=quantization,
                                   inert=inert))


JUDGES: dict[str, Callable[..., None]] = {
    load_facts.RESOLUTION: _resolution,
    load_facts.LAYOUT: _layout,
    load_facts.BUILD_ERROR: _build_error,
    load_facts.TAPS: _taps,
    load_facts.WEIGHTS: _weights,
    load_facts.FAILED_LOAD: _failed_load,
}


# -- a run's context, for the drain ------------------------------------------------------------------------------


def run_context(config) -> tuple[list, set[str], str | None, bool | None]:
    """(boundaries, root-cause codes, method, parallel drafting) of one run (``RunConfig.context_facts``):
    ``audit.judge``'s. ``judged.roots`` holds the uncertain info suspects too (an EAGLE drafter's own RoPE:
    ROPE_DIFFERS), a collapse's likely causes."""
    read = config.context_facts()
    if read is None:
        return [], set(), None, None
    run_facts, parallel = dict(read[0]), read[1]
    runs_in = run_facts.pop("runs_in", None)
    facts = audit.RunFacts(runs_in=_dtypes(runs_in), **run_facts)
    judged = audit.judge(facts)
    return judged.boundaries, judged.roots, facts.method, parallel
