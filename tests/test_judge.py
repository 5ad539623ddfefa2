"""The one judge (``spectrace.audit.judge``) and the finding constructors moved into the audit
(collapse, engine-core/worker disagreement), on hand-written facts. No vLLM."""

from __future__ import annotations

from spectrace import audit
from spectrace.audit.rules import acceptance
from spectrace.audit import codes

S, F = "sliding_attention", "full_attention"
WINDOW = 32
TARGET = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2, "vocab_size": 512,
          "max_position_embeddings": 4096, "layer_types": [F, F]}  # fmt: skip
# a drafter that declares its window correctly (it survives resolution) ...
DRAFT = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2, "vocab_size": 512,
         "max_position_embeddings": 4096, "use_sliding_window": True, "sliding_window": WINDOW, "layer_types": [S, S]}  # fmt: skip
# ... but a draft_model drafter is built with the target's window (none): it runs full attention
RUNS_FULL = [{"layer_name": f"model.layers.{i}.self_attn.attn", "runtime_type": "full", "runtime_window": None} for i in range(2)]
MODELS = [
    {"model_role": "target", "declared": TARGET, "transformers_resolved": TARGET},
    {"model_role": "draft", "declared": DRAFT, "transformers_resolved": DRAFT},
]


def _codes(findings):
    return sorted((f.code, f.severity, f.caused_by) for f in findings)


def _cliff():
    return acceptance.context_cliff({(0, WINDOW): (200, 180), (WINDOW, 512): (300, 10)}, WINDOW)


def test_the_engine_cores_judge_links_a_layout_mismatch_to_the_cliff_it_explains():
    facts = audit.RunFacts(MODELS, "draft_model", max_model_len=2048, runtime_layers={"draft": RUNS_FULL})
    judged = audit.judge(facts)
    assert _codes(judged.findings) == [("LAYOUT_MISMATCH", "error", None)]
    assert judged.roots == {codes.LAYOUT_MISMATCH}
    assert judged.statuses == {"target": ["match", "match"], "draft": ["MISMATCH", "MISMATCH"]}
    [boundary] = [b for b in judged.boundaries if b.model_role == "draft"]
    assert (boundary.tokens, boundary.field) == (WINDOW, "sliding_window (declared)")
    cliff = audit.context_cliff_finding(boundary, _cliff(), judged.roots, {})
    assert (cliff.code, cliff.severity, cliff.caused_by) == ("CONTEXT_CLIFF", "warning", "LAYOUT_MISMATCH")
    # without the runtime layout (workers in other processes) the same cliff has no cause
    blind = audit.judge(audit.RunFacts(MODELS, "draft_model", max_model_len=2048))
    assert blind.findings == [] and blind.roots == set()
    assert [b.as_dict() for b in blind.boundaries] == [b.as_dict() for b in judged.boundaries]
    cliff = audit.context_cliff_finding(boundary, _cliff(), blind.roots, {})
    assert (cliff.severity, cliff.caused_by) == ("error", None)


def test_the_frontends_judge_is_config_pair_and_refusal():
    declared = {"model_type": "qwen3", "architectures": ["DFlashDraftModel"], "num_hidden_layers": 2, "vocab_size": 512,
                "sliding_window": 2048}  # fmt: skip
    resolved = {**declared, "sliding_window": None, "use_sliding_window": False, "layer_types": [F, F]}
    models = [MODELS[0], {"model_role": "draft", "declared": declared, "transformers_resolved": resolved}]
    error = "ValueError: DFlash sliding attention requires a window size configured in dflash_config.swa_window_size"
    judged = audit.judge(audit.RunFacts(models, "draft_model", method_given=False, draft_path="/m/dflash", load_error=error))
    assert _codes(judged.findings) == [
        ("FIELD_CHANGED", "info", "SWA_DROPPED"),
        ("LAYER_TYPES_DEFAULTED", "info", "SWA_DROPPED"),
        ("LOAD_FAILED", "info", "SWA_DROPPED"),  # the error names the window
        ("METHOD_INFERRED", "info", "METHOD_MISMATCH"),
        ("METHOD_MISMATCH", "error", None),
        ("SWA_DROPPED", "error", None),
    ]
    assert judged.roots == {"SWA_DROPPED", "METHOD_MISMATCH"}
    assert {d.field for d in judged.diffs if d.status == "changed"} >= {"sliding_window"}
    # the same as composing the steps by hand (what audit_live did before the judge)
    _, by_role = audit.config_findings(models, "draft_model")
    by_hand = [f for fs in by_role.values() for f in fs]
    by_hand += audit.audit_pair(method="draft_model", method_given=False, draft_path="/m/dflash", target=TARGET,
                                draft=declared)  # fmt: skip
    by_hand.append(audit.explain_load_error(error, by_hand))
    assert [f.as_row() for f in judged.findings] == [f.as_row() for f in by_hand]


def test_the_layout_is_judged_against_the_config_vllm_builds_from():
    # doctor and the worker judge the layout against model_config.hf_config (built_from), not the capture
    built = {"target": TARGET, "draft": {**DRAFT, "layer_types": [F, F], "sliding_window": None}}
    facts = audit.RunFacts(MODELS, "draft_model", built_from=built, runtime_layers={"draft": RUNS_FULL})
    judged = audit.judge(facts)
    assert [p.resolved_type for p in judged.plans["draft"]] == ["full", "full"]
    # runs as that config says, not as declared: LAYOUT_MISMATCH against config.json, caused by
    # the window that config lost (the worker's own reading of the drafter's config)
    assert _codes(judged.findings) == [("LAYOUT_MISMATCH", "info", "SWA_DROPPED")]
    assert "from config.json" in judged.findings[0].message
    assert judged.statuses["draft"] == ["explained", "explained"]


def test_collapse_and_recovery_findings_whole():
    evidence = {"position_0_rate": 0.05, "overall_rate": 0.02, "window_drafted_tokens": 300, "threshold": 0.2,
                "onset_step": 7, "onset_context_len": 41, "onset_ts_ns": 1}  # fmt: skip
    finding = audit.collapse_finding(acceptance.CollapseEvent(codes.ACCEPTANCE_COLLAPSE, evidence))
    assert finding.as_row() == {
        "code": "ACCEPTANCE_COLLAPSE", "severity": "error", "component": "verification", "model_role": "draft",
        "message": "acceptance collapsed: position 0 5.0%, overall 2.0% over the last 300 drafted tokens (threshold 20%); "
                   "it began at step 7 (context 41)",
        "evidence": '{"onset_context_len": 41, "onset_step": 7, "onset_ts_ns": 1, "overall_rate": 0.02, '
                    '"position_0_rate": 0.05, "threshold": 0.2, "window_drafted_tokens": 300}',
        "fix": "check the run's findings (spectrace report): a dropped sliding window, wrong hidden-state taps "
               "or a mismatched drafter all look like this",
        "caused_by": None,
    }  # fmt: skip
    back = {**evidence, "position_0_rate": 0.9, "overall_rate": 0.8, "recovered_step": 20, "recovered_context_len": 90}
    recovered = audit.collapse_finding(acceptance.CollapseEvent(codes.ACCEPTANCE_RECOVERED, back))
    assert (recovered.code, recovered.severity, recovered.caused_by, recovered.fix) == (
        "ACCEPTANCE_RECOVERED", "info", "ACCEPTANCE_COLLAPSE", "")
    assert recovered.message.endswith("(threshold 20%) at step 20 (context 90)")


def test_disagreement_finding_whole():
    finding = audit.disagreement_finding([72, 60], [72, 61], 1, "run-1")
    assert finding.as_row() == {
        "code": "VERIFY_DISAGREEMENT", "severity": "error", "component": "verification", "model_role": "draft",
        "message": "engine core counted 72 drafted / 60 accepted, worker rank 1 verified 72 / 61",
        "evidence": '{"engine_core": [72, 60], "rank": 1, "run_id": "run-1", "worker": [72, 61]}',
        "fix": "the numbers vLLM reports are not what the device verified; report to vLLM",
        "caused_by": None,
    }  # fmt: skip


def test_every_finding_code_is_registered_with_its_component_and_severity():
    judged = audit.judge(audit.RunFacts(MODELS, "draft_model", runtime_layers={"draft": RUNS_FULL}))
    made = judged.findings + [audit.disagreement_finding([1, 1], [1, 0], 0, "r")]
    for finding in made:
        entry = codes.REGISTRY[finding.code]
        assert finding.component == entry.component and finding.severity in entry.severities, finding.code


def test_a_speculators_drafter_served_right_gets_no_field_finding():
    """The trained zoo's EAGLE-3 as speculators writes it: a training-only field and a declared null that vLLM
    leaves out are no loss; once the field audit ran, the generic FIELD_* comparison stays out of it."""
    from spectrace.audit.fields import Stage

    layer = {"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 1, "vocab_size": 512}
    declared = {"speculators_model_type": "eagle3", "speculators_config": {"algorithm": "eagle3"}, "draft_vocab_size": 512,
                "target_hidden_size": None, "embed_requires_grad": False, "norm_before_residual": True,
                "transformer_layer_config": layer}  # fmt: skip
    built = {**layer, "draft_vocab_size": 512, "norm_before_residual": True}
    models = [MODELS[0], {"model_role": "draft", "declared": declared, "transformers_resolved": built}]
    blind = audit.judge(audit.RunFacts(models, "eagle3"))
    assert ("FIELD_DROPPED", "warning", None) in _codes(blind.findings)  # without the stages: the generic comparison
    stages = [Stage("extract_transformers_pre_trained_config -> update_eagle3", built), Stage("SpeculativeConfig", built)]
    judged = audit.judge(audit.RunFacts(models, "eagle3", drafter_stages=stages))
    assert judged.findings == [] and not [d for d in judged.diffs if d.field == "embed_requires_grad"]
