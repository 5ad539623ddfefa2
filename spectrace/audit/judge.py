"""One judge: the facts of a run in, its findings, root causes and context boundaries out.

The composition: config → pair → method chain and sampler → refusal → token budget → layout → root causes → boundaries.

The collector (``collector.judging``: on what the frontend read of a run's resolution, and on what the engine core
read of its configs and runtime layout) and ``spectrace doctor`` each gather what can be known there and call
:func:`judge`, so the composition (config → pair → refusal → layout → root causes
→ boundaries) is written once and a fact one caller lacks is visibly ``None``
instead of a step it skips.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spectrace.config_dicts import LayerPlan
from spectrace.audit.curve import ContextBoundary, context_boundaries
from spectrace.audit import codes
from spectrace.audit.draft_settings import audit_draft_settings
from spectrace.audit.dtype import audit_dtype, declared_dtype
from spectrace.audit.fields import TRAINING_ONLY, drafter_fields, field_findings, is_speculators
from spectrace.audit.findings import Finding
from spectrace.audit.vocab import audit_vocab_map
from spectrace.audit.layout import audit_model_layout, config_findings, layout_status
from spectrace.audit.load import explain_load_error
from spectrace.audit.method import audit_method_chain, audit_rejection
from spectrace.audit.pair import audit_pair
from spectrace.audit.requests import token_budget_findings
from spectrace.audit.resolution import FieldDiff, root_causes
from spectrace.audit.rope import audit_rope, rope_of


@dataclass
class RunFacts:
    """Plain data about one run; ``None`` where the calling process cannot know a fact."""

    # one dict per model: model_role, declared (config.json as written), transformers_resolved
    models: list[dict[str, Any]]
    method: str | None
    method_given: bool = True
    draft_path: str | None = None
    max_model_len: int | None = None
    # per role, the resolved config vLLM builds the model from (model_config.hf_config as a
    # dict) when it is not ``transformers_resolved``; the layout is judged against it
    built_from: dict[str, dict[str, Any] | None] | None = None
    # per role, what each built layer runs (``spectrace.vllm_objects.layers`` rows); None: no model was
    # built or read in this process, so no LAYOUT_MISMATCH can be judged here
    runtime_layers: dict[str, list[dict[str, Any]] | None] | None = None
    load_error: str | None = None  # vLLM refused the configs: its error text
    # the scheduler's budget and the speculation it must fit (``vllm_objects.configs.scheduler_facts``)
    scheduler: dict[str, Any] | None = None
    # per role, the dtype vLLM runs the model in (model_config.dtype); None: not resolved here
    runs_in: dict[str, str | None] | None = None
    # per role, the dtype most of its checkpoint's tensors hold (safetensors headers); None: not read
    checkpoint_dtypes: dict[str, str | None] | None = None
    # the drafter's config after each step of vLLM's resolution (``vllm_objects.configs.drafter_stages``,
    # ``audit.fields.Stage``); None: not computed here, no field-by-field audit
    drafter_stages: list[Any] | None = None
    # (checkpoint read, {"d2t": VocabTensor, "t2d": VocabTensor}) of the drafter (``vllm_objects.weights.
    # read_vocab_maps``); None: not read here, no vocabulary-map audit
    vocab_maps: tuple[bool, dict[str, Any]] | None = None
    # settings asked for the drafter against what it resolved to (``audit.draft_settings``' keyword arguments,
    # e.g. ``hf_overrides`` from ``vllm_objects.configs.hf_override_facts``); None: not known here
    draft_settings: dict[str, Any] | None = None
    # what vLLM builds and runs for the drafter (``vllm_objects.configs.speculation_facts``: method, the resolved
    # architectures and model class, the rejection sampler); None: not resolved here
    speculation: dict[str, Any] | None = None


@dataclass
class Judgement:
    findings: list[Finding]
    roots: set[str]  # codes of the root-cause findings
    boundaries: list[ContextBoundary]
    diffs: list[FieldDiff] = field(default_factory=list)
    plans: dict[str, list[LayerPlan]] = field(default_factory=dict)
    statuses: dict[str, list[str]] = field(default_factory=dict)  # per role, layout_status of each plan

    def by_role(self, role: str) -> list[Finding]:
        return [f for f in self.findings if f.model_role == role]


def _model(models: list[dict[str, Any]], role: str) -> dict[str, Any]:
    return next((m for m in models if m["model_role"] == role), {})


def judge(facts: RunFacts) -> Judgement:
    """Config findings, the pair, vLLM's refusal, the layout; then root causes and boundaries."""
    models = facts.models
    target, draft = _model(models, "target"), _model(models, "draft")
    diffs, by_role = config_findings(models, facts.method)
    findings = [f for role_findings in by_role.values() for f in role_findings]
    findings += audit_pair(
        method=facts.method,
        method_given=facts.method_given,
        draft_path=facts.draft_path,
        target=target.get("transformers_resolved"),
        draft=draft.get("declared"),
        target_max_model_len=facts.max_model_len,
    )
    findings += audit_method_chain(draft.get("declared"), facts.speculation)
    findings += audit_rejection(facts.speculation)
    if any(f.code == codes.METHOD_DOWNGRADED for f in findings):  # the mismatch is the downgrade's symptom
        for f in findings:
            if f.code == codes.METHOD_MISMATCH and f.caused_by is None:
                f.severity, f.caused_by, f.fix = "info", codes.METHOD_DOWNGRADED, ""
    findings += _audit_model_pair(facts, target, draft)
    field_diffs, drafter_findings = _audit_drafter(facts, target, draft, findings, diffs)
    diffs += field_diffs
    if is_speculators(draft.get("declared")):  # fields only the trainer reads are no loss (fields.TRAINING_ONLY)
        diffs = [d for d in diffs if not (d.model_role == "draft" and d.field in TRAINING_ONLY)]
    if (drafter_findings or (facts.drafter_stages and facts.method != "mtp")) and is_speculators(draft.get("declared")):
        # a speculators-format drafter's fields live in transformer_layer_config: the generic top-level
        # comparison (FIELD_*) sees only half of them, and the field audit (when it ran: the drafter's stages
        # known) names each with vLLM's function, or found nothing lost (a declared null vLLM leaves out is none)
        findings = [f for f in findings if not (f.model_role == "draft" and f.caused_by is None
                                                and f.code in (codes.FIELD_DROPPED, codes.FIELD_CHANGED))]
    findings += drafter_findings
    if facts.load_error is not None:
        findings.append(explain_load_error(facts.load_error, findings))
    if facts.scheduler is not None:
        findings += token_budget_findings(**facts.scheduler)
    plans: dict[str, list[LayerPlan]] = {}
    statuses: dict[str, list[str]] = {}
    built_from = facts.built_from if facts.built_from is not None else {
        m["model_role"]: m["transformers_resolved"] for m in models
    }
    runtime = facts.runtime_layers or {}
    declared = {m["model_role"]: m["declared"] for m in models}
    for role, resolved in built_from.items():
        role_plans, layout_findings = audit_model_layout(
            role, declared.get(role), resolved, runtime.get(role), method=facts.method
        )
        plans[role] = role_plans
        statuses[role] = layout_status(role_plans, layout_findings)
        findings += layout_findings
    boundaries = context_boundaries(
        method=facts.method,
        target_declared=target.get("declared"),
        target_resolved=built_from.get("target", target.get("transformers_resolved")),
        draft_declared=draft.get("declared"),
        draft_resolved=built_from.get("draft", draft.get("transformers_resolved")),
        max_model_len=facts.max_model_len,
    )
    # roots: the causes a run's acceptance is explained by, the uncertain info findings among them (their evidence
    # says what would settle them: a collapse does, curve.raised_findings)
    suspects = {f.code for f in findings if f.caused_by is None and f.severity == "info" and f.evidence.get("settled_by")}
    return Judgement(findings, root_causes(findings) | suspects, boundaries, diffs, plans, statuses)


def _resolved(model: dict[str, Any], built_from: dict[str, dict[str, Any] | None] | None, role: str) -> dict[str, Any] | None:
    """The config vLLM builds ``role`` from: the built config, else vLLM's final, else transformers'."""
    if built_from is not None and built_from.get(role) is not None:
        return built_from[role]
    return model.get("vllm_resolved") or model.get("transformers_resolved")


def _audit_model_pair(facts: RunFacts, target: dict[str, Any], draft: dict[str, Any]) -> list[Finding]:
    """The drafter's RoPE against the target's, and the dtype it runs in against the one it was trained in."""
    if not draft:
        return []
    findings = audit_rope(
        facts.method, rope_of(_resolved(target, facts.built_from, "target")), rope_of(_resolved(draft, facts.built_from, "draft"))
    )
    if facts.runs_in is not None:
        findings += audit_dtype(
            "draft",
            declared=declared_dtype(draft.get("declared")),
            checkpoint=(facts.checkpoint_dtypes or {}).get("draft"),
            runs_in=facts.runs_in.get("draft"),
            target_runs_in=facts.runs_in.get("target"),
        )
    return findings


def _vocab_size(config: dict[str, Any] | None) -> Any:
    if not isinstance(config, dict):
        return None
    text = config.get("text_config")
    if isinstance(text, dict) and isinstance(text.get("vocab_size"), int):
        return text["vocab_size"]
    return config.get("vocab_size")


def _audit_drafter(
    facts: RunFacts, target: dict[str, Any], draft: dict[str, Any], findings: list[Finding], diffs: list[FieldDiff]
) -> tuple[list[FieldDiff], list[Finding]]:
    """Every drafter field through vLLM's stages (``audit.fields``) and its vocabulary map (``audit.vocab``)."""
    if not draft:
        return [], []
    rows: list[FieldDiff] = []
    found: list[Finding] = []
    declared = draft.get("declared")
    # an MTP drafter is the target's own layers: SpeculativeConfig.hf_config_override rewrites its config on
    # purpose (num_hidden_layers 0, n_predict, model_type), so a field-by-field audit would only repeat that
    if facts.drafter_stages and facts.method != "mtp":
        fields = drafter_fields(declared, facts.drafter_stages)
        moved = {f.path: f for f in fields if f.status == "moved"}
        for d in diffs:  # the generic top-level comparison saw a field vLLM's updater moved as dropped: it is not
            if d.model_role == "draft" and d.field in moved and d.status == "dropped":
                d.status, d.resolved = "moved", moved[d.field].resolved
        listed = {d.field for d in diffs if d.model_role == "draft"}
        rows = [FieldDiff("draft", f.path, f.declared, f.resolved, f.status) for f in fields
                if f.status not in ("ok", "moved") and f.path not in listed]
        covered = set() if is_speculators(declared) else {
            f.evidence.get("field") for f in findings
            if f.model_role == "draft" and f.code in (codes.FIELD_DROPPED, codes.FIELD_CHANGED)}
        found += field_findings(declared, fields, covered=covered, causes=findings)
    if facts.vocab_maps is not None:
        read, maps = facts.vocab_maps
        final = (facts.drafter_stages[-1].config if facts.drafter_stages else None) or _resolved(draft, facts.built_from, "draft")
        found += audit_vocab_map(
            draft_vocab_size=(final or {}).get("draft_vocab_size"),
            target_vocab_size=_vocab_size(_resolved(target, facts.built_from, "target")),
            checkpoint_read=read,
            d2t=maps.get("d2t"),
            t2d=maps.get("t2d"),
        )
    if facts.draft_settings:
        found += audit_draft_settings(**facts.draft_settings)
    return rows, found
