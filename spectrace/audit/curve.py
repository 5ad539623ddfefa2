"""The acceptance curve: boundaries from the run's configs, cliffs, dummy drafts, speculation that does not pay."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Iterable

from spectrace.audit import codes
from spectrace.audit.rules import drift
from spectrace.audit.rules.speedup_figure import SPEEDUP_UNMEASURED
from spectrace.config_dicts import MODEL_FREE_METHODS, _declared_window, _get, _is_window, _resolved_window
from spectrace.audit.findings import Finding
from spectrace.audit.window import target_window
from spectrace.bands import band_bounds


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

    rope = (codes.ROPE_MISMATCH, codes.ROPE_DIFFERS)  # a drafter rotating positions otherwise falls with context
    drafter_explains = (codes.SWA_DROPPED, codes.LAYOUT_MISMATCH, codes.DRAFT_CONTEXT_SHORT, *rope)
    add(_declared_window(target_declared), "target", "sliding_window (declared)")
    add(target_window(target_resolved), "target", "sliding_window")
    if draft_declared is not None and method not in MODEL_FREE_METHODS:
        add(_declared_window(draft_declared), "draft", "sliding_window (declared)", drafter_explains)
        add(_resolved_window(draft_resolved), "draft", "sliding_window", drafter_explains)
        add(_get(draft_declared, "max_position_embeddings", None), "draft", "max_position_embeddings", (codes.DRAFT_CONTEXT_SHORT, *rope))
        scaling = _get(draft_declared, "rope_scaling", None) or _get(draft_declared, "rope_parameters", None)
        if isinstance(scaling, dict):
            add(scaling.get("original_max_position_embeddings"), "draft", "rope original_max_position_embeddings", (codes.DRAFT_CONTEXT_SHORT, *rope))
    return sorted(found, key=lambda b: b.tokens)


def context_cliff_finding(boundary: ContextBoundary, cliff: Any, roots: set[str], rates_by_range: dict[str, Any]) -> Finding:
    """``CONTEXT_CLIFF`` at ``boundary`` (``cliff``: an ``acceptance.Cliff``)."""
    caused = next((code for code in boundary.explained_by if code in roots), None)
    return codes.finding(
        codes.CONTEXT_CLIFF,
        severity="warning" if caused else "error",
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
    return codes.finding(
        codes.POSITION_CLIFF,
        severity="error",
        model_role="draft",
        message=f"position {position} accepts {rates[position]:.1%} of its drafts, position {position + 1} almost none of "
        f"what position {position} accepted ({accepted_at[position + 1]} of {accepted_at[position]}); {hint}",
        evidence={"position": position, "drafted_by_position": drafted_at, "accepted_by_position": accepted_at, "rates_by_position": rates, "parallel_drafting": parallel},
        fix="check the drafter's taps and its drafting mode (parallel_drafting), or lower num_speculative_tokens "
        f"to {position + 1} until it is fixed",
    )


# roots that make a drafter's drafts wrong ids without making them placeholders, named as the cause of DUMMY_DRAFTS
DUMMY_CAUSES = (codes.DRAFT_VOCAB_MAP_MISSING, codes.DRAFT_VOCAB_MAP_INVALID, codes.DRAFT_WEIGHTS_UNLOADED)


def dummy_drafts_finding(
    rows: int, repeated: int, by_token: dict[int, int], *, length_gate: ContextBoundary | None = None,
    roots: set[str] = frozenset(), kind: str = "placeholder_id",
) -> Finding:
    """``DUMMY_DRAFTS``; ``length_gate``: the drafter's own length, when it is shorter than the run's; ``kind``:
    ``acceptance.dummy_drafts``' reason (a placeholder id, or one id whatever the input).

    vLLM 0.32 (``GPUModelRunner._input_fits_in_drafter``) skips the drafter for the whole
    batch once the batch's longest context + k passes the drafter's max_model_len (its
    ``max_position_embeddings``) and sends token-0 drafts instead: then the short context
    (``DRAFT_CONTEXT_SHORT``) is the cause. A missing or wrong vocabulary map (or weights never
    loaded) makes the drafter's predictions land on wrong target ids: that finding is the cause.
    """
    token, count = max(by_token.items(), key=lambda item: item[1])
    gated = length_gate is not None and token == 0
    if gated and codes.DRAFT_CONTEXT_SHORT in roots:
        caused = codes.DRAFT_CONTEXT_SHORT
    else:
        caused = next((code for code in DUMMY_CAUSES if code in roots), None)
    if gated:
        reason = (f"; vLLM sends token-0 drafts for a whole batch once its longest context + k passes the drafter's "
                  f"max_model_len ({length_gate.tokens}, its {length_gate.field})")
    elif caused in (codes.DRAFT_VOCAB_MAP_MISSING, codes.DRAFT_VOCAB_MAP_INVALID):
        reason = (f"; the drafter's predictions land on the wrong target ids ({caused}: its vocabulary map), "
                  "so one draft id scored as a wrong target id repeats")
    elif caused == codes.DRAFT_WEIGHTS_UNLOADED:
        reason = f"; the drafter runs with parameters no checkpoint tensor reached ({caused})"
    elif kind == "constant":
        reason = "; the drafter drafts the same id whatever the request or its context: placeholders, not predictions"
    else:
        reason = "; token 0 at every position is what vLLM sends in place of drafts and what constant logits give: placeholders, not predictions"
    return codes.finding(
        codes.DUMMY_DRAFTS,
        severity="warning" if caused else "error",
        model_role="draft",
        message=f"{repeated / rows:.1%} of draft rows ({repeated} of {rows}) are one token id repeated "
        f"(most often {token}: {count} rows) and the target rejects them{reason}",
        evidence={"rows": rows, "repeated_rows": repeated, "share": round(repeated / rows, 4),
                  "by_token": {str(k): v for k, v in sorted(by_token.items())}, "kind": kind,
                  "length_gate": length_gate.as_dict() if gated else None,
                  "vllm_rule": "vllm.v1.worker.gpu_model_runner.GPUModelRunner._input_fits_in_drafter" if gated else None},
        fix="give the drafter the target's context length, or cap --max-model-len at it" if gated
        else "" if caused
        else "check the drafter's final norm and lm_head weights (a zero norm drafts token 0 everywhere)",
        caused_by=caused,
    )


def not_paying_finding(evidence: dict[str, Any]) -> Finding:
    """SPECULATION_NOT_PAYING: the speed-up (``spectrace.audit.rules.speedup_figure.SPEEDUP_DEFINITION``) with its window (the run's
    steps so far: how many) and its basis (fitted, not measured) beside it, as ``report`` and ``top`` print it."""
    return codes.finding(
        codes.SPECULATION_NOT_PAYING,
        severity="warning",
        model_role="draft",
        message=f"speculation costs more than it saves: speed-up {evidence['speedup_estimate']:.2f}x over the run's "
        f"first {evidence['window_steps']} steps that verified drafts ({SPEEDUP_UNMEASURED}; mean acceptance length "
        f"{evidence['mean_acceptance_length']:.2f}, drafting {evidence['draft_ms_per_step']:.2f} ms and verifying "
        f"{evidence['verify_ms_per_step']:.2f} ms per step, {evidence.get('no_draft_ms_per_step', 0):.2f} ms without drafts)",
        evidence=evidence,
    )


K_BETTER_MARGIN = 0.15  # the model's measured accuracy (BENCHMARKS.md, "What k pays"): a smaller gain is not resolved


def best_k(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The measured (not extrapolated) ``k'`` with the highest speed-up of "What k pays" rows; ``k' = 0`` is "no
    speculation" (``spectrace.audit.rules.speedup.best``: ``speedup`` imports this module, not the other way round, so the rule lives here)."""
    priced = [r for r in rows if not r.get("extrapolated") and r.get("speedup") is not None]
    return max(priced, key=lambda r: r["speedup"]) if priced else None


def k_better_finding(rows: list[dict[str, Any]], *, margin: float = K_BETTER_MARGIN,
                     by_band: dict[str, list[dict[str, Any]]] | None = None) -> Finding | None:
    """``SPECULATION_K_BETTER`` from one run's "What k pays" rows (``spectrace.audit.rules.speedup.speedup_by_k``): the measured
    (not extrapolated) ``k'`` with the highest predicted speed-up, when it is not the ``k`` in force and pays at least
    ``1 + margin`` times the in-force speed-up. Only for rows priced from measured steps without drafts
    (``step_source`` ``baseline``): the run-alone fit misprices step(0) on CPU (BENCHMARKS.md) and would give wrong advice.
    ``by_band`` (``spectrace.audit.rules.speedup.by_band``): the best ``k'`` of each batch-size band priced the same way; where
    they differ, the fix is vLLM's per-batch-size setting with those values."""
    priced = [r for r in rows if not r.get("extrapolated") and r.get("speedup") is not None]
    in_force = next((r for r in priced if r.get("in_force")), None)
    if in_force is None or any(r.get("step_source") != "baseline" for r in priced):
        return None
    top = best_k(priced)
    if top["k"] == in_force["k"] or in_force["speedup"] <= 0 or top["speedup"] < in_force["speedup"] * (1 + margin):
        return None
    gain = top["speedup"] / in_force["speedup"] - 1
    evidence = {"k_in_force": in_force["k"], "k_best": top["k"], "speedup_in_force": in_force["speedup"],
                "speedup_best": top["speedup"], "gain": round(gain, 4), "margin": margin,
                "expected_length_in_force": in_force["expected_length"], "expected_length_best": top["expected_length"],
                "step_ms_in_force": in_force["step_ms"], "step_ms_best": top["step_ms"], "step_source": "baseline"}
    best = "no speculation" if top["k"] == 0 else f"k = {top['k']}"
    bands = {band: pick["k"] for band, band_rows in (by_band or {}).items()
             if band_rows and all(r.get("step_source") == "baseline" for r in band_rows) and (pick := best_k(band_rows))}
    fix = ("turn speculative decoding off for this traffic (or find a drafter that agrees more)" if top["k"] == 0
           else f"set num_speculative_tokens={top['k']}")
    if len(set(bands.values())) > 1:
        evidence["best_by_band"] = bands
        schedule = [[low, high if high is not None else low * 4, k] for band, k in bands.items()
                    for low, high in [band_bounds(band)]]
        schedule[0][0] = 1  # vLLM: the first range starts at 1; gaps and the tail carry the previous k
        fix = (f"the best k differs by batch size ({', '.join(f'{b}: {k}' for b, k in bands.items())}): set "
               f"num_speculative_tokens={max(bands.values())} and num_speculative_tokens_per_batch_size="
               f"{[tuple(x) for x in schedule]}, or {fix}")
    return codes.finding(
        codes.SPECULATION_K_BETTER,
        severity="warning",
        model_role="draft",
        message=f"{best} pays {gain:.0%} more than k = {in_force['k']} in force: predicted speed-up {top['speedup']:.2f}x "
        f"against {in_force['speedup']:.2f}x (expected length {top['expected_length']:.2f} vs {in_force['expected_length']:.2f}, "
        f"step {top['step_ms']:.2f} vs {in_force['step_ms']:.2f} ms, priced from steps without drafts measured on this target)",
        evidence=evidence,
        fix=fix,
    )


# config findings that, present in a run, are the likely cause of a collapse (named in its message; the first
# present is its ``caused_by``): those that make every draft wrong first, then those whose cost depends on the
# drafter and the context (a dropped window costs nothing below it, a RoPE base more the longer the context)
COLLAPSE_SUSPECTS = (codes.DRAFT_VOCAB_MAP_MISSING, codes.DRAFT_VOCAB_MAP_INVALID, codes.DRAFT_WEIGHTS_UNLOADED,
                     codes.DRAFT_HEAD_REPLACED, codes.METHOD_DOWNGRADED, codes.TAP_CONVENTION,
                     codes.DRAFT_DTYPE_LOSSY, codes.SWA_DROPPED, codes.ROPE_MISMATCH, codes.ROPE_DIFFERS,
                     codes.TAP_DEFAULTED, codes.CAUSAL_INFERRED)
# static findings that are info because the configs cannot tell "trained so" from "misdeclared" (their evidence says
# what would settle it): a collapse in the run is that evidence, and raises them to a warning of their own
RAISED_BY_COLLAPSE = (codes.ROPE_DIFFERS, codes.TAP_DEFAULTED, codes.CAUSAL_INFERRED)


def raised_findings(collapse: Finding) -> list[Finding]:
    """The info suspects a collapse names, each raised to a warning (``evidence.raised_by``), the collapse's
    rates in its message: what the configs could not say, the run now does."""
    if collapse.code != codes.ACCEPTANCE_COLLAPSE:
        return []
    ev = collapse.evidence
    return [
        codes.finding(
            code,
            severity="warning",
            model_role="draft",
            message=f"{code}, info before the first request (the configs could not tell), is now a likely cause: "
            f"acceptance collapsed in this run (position 0 {ev['position_0_rate']:.1%}, overall {ev['overall_rate']:.1%}), "
            "the shape it predicts",
            evidence={"raised_by": codes.ACCEPTANCE_COLLAPSE, "static_severity": "info",
                      "position_0_rate": ev["position_0_rate"], "overall_rate": ev["overall_rate"]},
        )
        for code in ev.get("likely_causes", ()) if code in RAISED_BY_COLLAPSE
    ]


def collapse_finding(event: Any, suspects: Iterable[str] = ()) -> Finding:
    """``ACCEPTANCE_COLLAPSE`` or ``ACCEPTANCE_RECOVERED`` (``event``: an ``acceptance.CollapseEvent``);
    ``suspects``: codes of the run's findings, those of :data:`COLLAPSE_SUSPECTS` named as likely causes."""
    collapse = event.code == codes.ACCEPTANCE_COLLAPSE
    ev = event.evidence
    likely = [code for code in COLLAPSE_SUSPECTS if code in set(suspects)] if collapse else []
    if likely:
        ev = {**ev, "likely_causes": likely}
    onset = (
        f"; it began at step {ev['onset_step']} (context {ev['onset_context_len']})" if collapse and "onset_step" in ev
        else f" at step {ev['recovered_step']} (context {ev['recovered_context_len']})" if "recovered_step" in ev
        else ""
    )
    return codes.finding(
        codes.ACCEPTANCE_COLLAPSE if collapse else codes.ACCEPTANCE_RECOVERED,
        severity="error" if collapse else "info",
        model_role="draft",
        message=(
            f"acceptance {'collapsed' if collapse else 'recovered'}: position 0 {ev['position_0_rate']:.1%}, "
            f"overall {ev['overall_rate']:.1%} over the last {ev['window_drafted_tokens']} drafted tokens "
            f"(threshold {ev['threshold']:.0%}){onset}"
            + (f"; likely cause: {', '.join(likely)} (see the run's findings)" if likely else "")
        ),
        evidence=ev,
        fix=(
            "check the run's findings (spectrace report): a dropped sliding window, wrong hidden-state taps "
            "or a mismatched drafter all look like this"
            if collapse
            else ""
        ),
        caused_by=(likely[0] if likely else None) if collapse else codes.ACCEPTANCE_COLLAPSE,
    )


def _utc(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def drift_finding(event: Any, ranks: Iterable[int] = ()) -> Finding:
    """``ACCEPTANCE_STEP_CHANGE``, ``ACCEPTANCE_DECAY`` or ``ACCEPTANCE_RESTORED`` (``event``: a
    ``spectrace.audit.rules.drift.DriftEvent``); ``ranks``: the worker ranks the run's counts came from."""
    ev = dict(event.evidence)
    ranks = sorted(set(ranks))
    if event.kind == drift.RESTORED:
        ev["onset"], ev["recovered"] = _utc(ev["onset_ts_ns"]), _utc(ev["recovered_ts_ns"])
        what = "step change" if ev["signature"] == drift.STEP else "decay"
        return codes.finding(
            codes.ACCEPTANCE_RESTORED, model_role="draft", evidence=ev,
            caused_by=codes.ACCEPTANCE_STEP_CHANGE if ev["signature"] == drift.STEP else codes.ACCEPTANCE_DECAY,
            message=f"acceptance is back to its level before the {what} of {ev['onset']}: {ev['rate_now']:.1%} "
                    f"(before it: {ev['rate_before']:.1%}) since {ev['recovered']}",
        )
    ev["onset"] = _utc(ev["onset_ts_ns"])
    ev["ranks"] = ranks
    if ev["carried_requests"]:
        within = (f"; the {ev['carried_requests']} requests that ran across it accepted {ev['carried_rate_before']:.1%} "
                  f"before and {ev['carried_rate_after']:.1%} after: the engine changed, not the requests")
    else:
        within = "; no request ran across it, so a change in the requests' mix is not ruled out (see the request slices)"
    where = f" on every rank ({', '.join(map(str, ranks))})" if len(ranks) > 1 else ""
    if event.kind == drift.STEP:
        return codes.finding(
            codes.ACCEPTANCE_STEP_CHANGE, model_role="draft", evidence=ev,
            message=f"acceptance stepped down at {ev['onset']}{where}: {ev['rate_before']:.1%} before, "
                    f"{ev['rate_after']:.1%} after ({ev['after_level']:.2f} of the run's usual level for the same "
                    f"contexts and positions, {ev['before_level']:.2f} before){within}",
        )
    before = (f"{ev['rate_before']:.1%} before, " if ev["rate_before"] is not None else "from the run's start, ")
    return codes.finding(
        codes.ACCEPTANCE_DECAY, model_role="draft", evidence=ev,
        message=f"acceptance has been declining since {ev['onset']}{where}: {ev['slope_per_hour']:+.2f} of the run's "
                f"level per hour, from {ev['start_level']:.2f} to {ev['end_level']:.2f} (the same contexts and "
                f"positions); {before}{ev['rate_after']:.1%} since{within}",
    )
