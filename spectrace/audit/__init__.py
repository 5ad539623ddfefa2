"""The audit: pure functions that turn captured config and layout into findings.

Nothing here imports vLLM or touches a process: the collector (``spectrace.collector.judging``, on what the live
hooks read) and ``spectrace doctor`` feed the same functions with plain dicts, and the unit tests feed them
hand-written ones; no vLLM process imports it in the process shape (what readers and judges share is in the leaves
``spectrace.config_dicts`` and ``spectrace.readings``). One module per topic:

- ``codes``: the registry of finding codes (code, severities, meaning, fix)
- ``findings``: the ``Finding`` record
- ``spectrace.config_dicts`` (a leaf, re-exported here): reading config dicts (layer kinds, windows, per-layer plans)
- ``resolution``: declared vs resolved config (``SWA_DROPPED``, ``FIELD_*``)
- ``layout``: what runs vs its config (``LAYOUT_MISMATCH``), and each layer's verdict
- ``pair``: method, vocabulary, context of target + drafter
- ``load``: vLLM's refusals (``LOAD_FAILED``)
- ``taps``: hidden-state taps (``TAP_*``)
- ``causality``: DFlash causality (``CAUSAL_INFERRED``)
- ``window``: a ``draft_model`` drafter gets the target's window
- ``curve``: the acceptance curve (boundaries, cliffs, dummy drafts, collapse, not paying)
- ``requests``: request slices the drafter cannot see (``SLICE_ACCEPTANCE_LOW``), the token budget
  (``TOKEN_BUDGET_SHORT``), drafts never verified (``DRAFTS_UNVERIFIED``), prefix-cache
  hits the EAGLE block drop costs (``PREFIX_HITS_DROPPED``)
- ``dynamic_k``: dynamic speculation whose k flips between steps (``DYNAMIC_K_THRASHING``)
- ``fields``: every drafter field through vLLM's own stages (``DRAFT_FIELD_*``)
- ``vocab``: the drafter's ``d2t`` / ``t2d`` vocabulary map (``DRAFT_VOCAB_MAP_*``)
- ``draft_settings``: draft settings accepted and never applied (``DRAFT_SETTING_IGNORED``)
- ``ranks``: agreement within one engine (``RANK_DISAGREEMENT``, ``VERIFY_DISAGREEMENT``)
- ``judge``: the static judge — one function that composes them for a run's facts (config, layout, taps)
- ``batch``: what the run judge is fed (one flush's ``RunBatch``: a ``RunObservation`` per run) and gives back
  (``Judged``: ``Verdict``s, the live speed-up windows, the rules that failed)
- ``run_judge``: the run judge — ``RunJudge.observe(batch)``: each flush's records in, the run rules' findings out,
  once each
- ``store_judge``: one run's verdicts from a store or lake (``judge_store``): what ``spectrace report`` renders
- ``rules/``: the run rules' arithmetic (acceptance and the collapse detector, request slices, what k pays, the one
  speed-up figure's words, which findings are active)

``batch``, ``run_judge``, ``store_judge`` and ``rules`` are imported by name, not from here: they need NumPy, which the
static judge (the frontend's, doctor's) does not.

Root causes and consequences: each root cause is one ``error`` (or ``warning``)
finding; what follows from it is reported as ``info`` findings whose
``caused_by`` names the root cause's code, so a user reads one error, not five.
Finding codes are stable and documented in docs/reference/codes.md (generated from ``codes``).
"""

from spectrace.audit import codes
from spectrace.audit.causality import audit_causality
from spectrace.config_dicts import (
    ATTENTION_FIELDS,
    DFLASH_FIELDS,
    FULL,
    LINEAR,
    MODEL_FREE_METHODS,
    SLIDING,
    UNSPECIFIED,
    LayerPlan,
    architecture,
    declared_sliding_intent,
    layer_plans,
)
from spectrace.audit.curve import (
    ContextBoundary,
    collapse_finding,
    context_boundaries,
    context_cliff_finding,
    dummy_drafts_finding,
    k_better_finding,
    not_paying_finding,
    position_cliff_finding,
)
from spectrace.audit.dynamic_k import k_thrashing, thrashing_finding
from spectrace.audit.findings import Finding
from spectrace.audit.judge import Judgement, RunFacts, judge
from spectrace.audit.layout import (
    LAYOUT_STATUSES,
    audit_layout,
    audit_model_layout,
    config_findings,
    layout_status,
    mismatched_layers,
    with_runtime,
)
from spectrace.audit.load import explain_build_error, explain_load_error, runner_refusal
from spectrace.audit.pair import architecture_method, audit_pair, effective_context
from spectrace.audit.ranks import disagreement_finding, rank_disagreements
from spectrace.audit.requests import dropped_hits, dropped_hits_finding, drafting_slots, slice_finding, thinking_finding, token_budget_findings, unverified_drafts, unverified_finding
from spectrace.audit.resolution import FieldDiff, audit_config, draft_root_causes, field_diffs, root_causes
from spectrace.audit.taps import TAP_FIELDS, TapAudit, audit_taps, declared_taps
from spectrace.audit.window import reapplied_window, target_window

__all__ = [
    "ATTENTION_FIELDS", "DFLASH_FIELDS", "FULL", "LAYOUT_STATUSES", "LINEAR", "MODEL_FREE_METHODS", "SLIDING",
    "TAP_FIELDS", "UNSPECIFIED",
    "ContextBoundary", "FieldDiff", "Finding", "Judgement", "LayerPlan", "RunFacts", "TapAudit",
    "architecture", "architecture_method", "audit_causality", "audit_config", "audit_layout", "audit_model_layout",
    "audit_pair", "audit_taps", "codes", "collapse_finding", "config_findings", "context_boundaries",
    "context_cliff_finding", "declared_sliding_intent", "declared_taps", "disagreement_finding", "draft_root_causes",
    "dummy_drafts_finding", "effective_context", "explain_build_error", "explain_load_error", "field_diffs", "judge",
    "layer_plans", "layout_status", "mismatched_layers", "k_better_finding", "not_paying_finding", "position_cliff_finding",
    "rank_disagreements", "reapplied_window", "root_causes", "runner_refusal", "target_window", "with_runtime",
    "dropped_hits", "dropped_hits_finding", "drafting_slots", "slice_finding", "thinking_finding", "token_budget_findings", "unverified_drafts", "unverified_finding",
    "k_thrashing", "thrashing_finding",
]
