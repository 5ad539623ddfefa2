"""Unit tests of the pure audit (spectrace.audit) on hand-written config dicts.

``declared`` is a config.json as written; ``resolved`` is what transformers 5.19's
``Qwen3Config`` / ``Qwen2Config`` make of it (gate 1: ``sliding_window`` is nulled unless
``use_sliding_window``; gate 2: a missing ``layer_types`` is derived, sliding only from
``max_window_layers`` on). No vLLM, no files.
"""

from __future__ import annotations

import pytest

from spectrace import audit

S, F = "sliding_attention", "full_attention"
WINDOW = 2048
MIXED = [S, S, S, S, F]
BASE = {"model_type": "qwen3", "architectures": ["DFlashDraftModel"], "num_hidden_layers": 5, "vocab_size": 151936}
RESOLVED_BASE = {**BASE, "use_sliding_window": False, "max_window_layers": 28}
LOAD_ERROR = (
    "ValueError: DFlash sliding attention requires a window size configured in "
    "dflash_config.swa_window_size or the top-level sliding_window."
)


def codes(findings):
    return sorted((f.code, f.severity, f.caused_by) for f in findings)


# -- the four DFlash shapes ------------------------------------------------------------

SHAPES = {
    # layer_types + sliding_window, no use_sliding_window: gate 1 nulls the window
    "layer_types_no_flag": (
        {**BASE, "layer_types": MIXED, "sliding_window": WINDOW},
        {**RESOLVED_BASE, "layer_types": MIXED, "sliding_window": None},
    ),
    # sliding_window only: window nulled and layer_types derived all full
    "window_only": (
        {**BASE, "sliding_window": WINDOW},
        {**RESOLVED_BASE, "layer_types": [F] * 5, "sliding_window": None},
    ),
    "flagged": (
        {**BASE, "layer_types": MIXED, "sliding_window": WINDOW, "use_sliding_window": True},
        {**RESOLVED_BASE, "layer_types": MIXED, "sliding_window": WINDOW, "use_sliding_window": True},
    ),
    "swa_window_size": (
        {**BASE, "layer_types": MIXED, "dflash_config": {"swa_window_size": WINDOW, "mask_token_id": 151669}},
        {**RESOLVED_BASE, "layer_types": MIXED, "sliding_window": None,
         "dflash_config": {"swa_window_size": WINDOW, "mask_token_id": 151669}},
    ),
}  # fmt: skip


def test_layer_types_without_flag_is_swa_dropped():
    declared, resolved = SHAPES["layer_types_no_flag"]
    diffs, findings = audit.audit_config("draft", declared, resolved)
    assert codes(findings) == [("FIELD_CHANGED", "info", "SWA_DROPPED"), ("SWA_DROPPED", "error", None)]
    swa = next(f for f in findings if f.code == "SWA_DROPPED")
    assert "use_sliding_window is absent" in swa.message and "use_sliding_window" in swa.fix
    changed = next(f for f in findings if f.code == "FIELD_CHANGED")
    assert changed.evidence == {"field": "sliding_window", "declared": WINDOW, "resolved": None}
    assert {d.field: d.status for d in diffs}["sliding_window"] == "changed"
    plans = audit.layer_plans(declared, resolved)
    assert [(p.declared_type, p.declared_window) for p in plans] == [("sliding", WINDOW)] * 4 + [("full", None)]
    assert [(p.resolved_type, p.resolved_window) for p in plans] == [("sliding", None)] * 4 + [("full", None)]
    # vLLM's DFlash model refuses the nulled window: explained by SWA_DROPPED
    load = audit.explain_load_error(LOAD_ERROR, findings)
    assert (load.code, load.severity, load.caused_by) == ("LOAD_FAILED", "info", "SWA_DROPPED")
    assert "use_sliding_window" in load.message


def test_window_only_is_swa_dropped_and_runs_full():
    declared, resolved = SHAPES["window_only"]
    _, findings = audit.audit_config("draft", declared, resolved)
    assert codes(findings) == [
        ("FIELD_CHANGED", "info", "SWA_DROPPED"),
        ("LAYER_TYPES_DEFAULTED", "info", "SWA_DROPPED"),
        ("SWA_DROPPED", "error", None),
    ]
    plans = audit.layer_plans(declared, resolved)
    assert [(p.declared_type, p.declared_window, p.resolved_type, p.resolved_window) for p in plans] == [
        ("unspecified", WINDOW, "full", None)
    ] * 5
    for plan in plans:
        plan.runtime_type, plan.runtime_window = "full", None
    layout = audit.audit_layout("draft", plans, audit.root_causes(findings))
    assert codes(layout) == [("LAYOUT_MISMATCH", "info", "SWA_DROPPED")]
    assert len(layout[0].evidence["layers"]) == 5


@pytest.mark.parametrize("shape", ["flagged", "swa_window_size"])
def test_correct_sliding_drafters_are_clean(shape):
    declared, resolved = SHAPES[shape]
    _, findings = audit.audit_config("draft", declared, resolved)
    assert findings == []
    plans = audit.layer_plans(declared, resolved)
    expected = [("sliding", WINDOW)] * 4 + [("full", None)]
    assert [(p.declared_type, p.declared_window) for p in plans] == expected
    assert [(p.resolved_type, p.resolved_window) for p in plans] == expected
    for plan, (kind, window) in zip(plans, expected):
        plan.runtime_type, plan.runtime_window = kind, window
    assert audit.audit_layout("draft", plans, set()) == []


def test_a_layer_that_runs_other_than_resolved_is_an_error():
    declared, resolved = SHAPES["flagged"]
    plans = audit.layer_plans(declared, resolved)
    for plan in plans:
        plan.runtime_type, plan.runtime_window = "full", None  # e.g. an old vLLM ignoring layer_types
    [finding] = audit.audit_layout("draft", plans, set())
    assert (finding.code, finding.severity, finding.caused_by) == ("LAYOUT_MISMATCH", "error", None)
    assert len(finding.evidence["layers"]) == 4


# -- targets that must stay clean ---------------------------------------------------------

QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
    "max_window_layers": 36, "sliding_window": None, "use_sliding_window": False, "rope_scaling": None,
    "rope_theta": 1000000,
}  # fmt: skip
QWEN3_8B_RESOLVED = {
    **{k: v for k, v in QWEN3_8B.items() if k not in ("rope_scaling", "rope_theta")},
    "layer_types": [F] * 36,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000},
}


def test_target_without_layer_types_and_no_sliding_intent_is_clean():
    assert not audit.declared_sliding_intent(QWEN3_8B)
    diffs, findings = audit.audit_config("target", QWEN3_8B, QWEN3_8B_RESOLVED)
    assert findings == []
    status = {d.field: d.status for d in diffs}
    assert status["layer_types"] == "defaulted"
    # "rope_scaling": null and transformers 5's default rope_parameters mean the same
    assert status["rope_scaling"] == "ok"
    plans = audit.layer_plans(QWEN3_8B, QWEN3_8B_RESOLVED)
    assert {(p.declared_type, p.declared_window, p.resolved_type) for p in plans} == {("unspecified", None, "full")}
    for plan in plans:
        plan.runtime_type = "full"
    assert audit.audit_layout("target", plans, set()) == []


def test_qwen2_style_disabled_window_is_not_swa_dropped():
    declared = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_hidden_layers": 28,
        "use_sliding_window": False, "sliding_window": 131072, "max_window_layers": 28, "vocab_size": 152064,
    }  # fmt: skip
    resolved = {**declared, "sliding_window": None, "layer_types": [F] * 28}
    assert not audit.declared_sliding_intent(declared)
    _, findings = audit.audit_config("target", declared, resolved)
    assert "SWA_DROPPED" not in {f.code for f in findings}
    # declared off, so nulling it is what was asked: no warning either
    assert findings == []
    plans = audit.layer_plans(declared, resolved)
    assert {(p.declared_type, p.declared_window, p.resolved_type) for p in plans} == {("unspecified", None, "full")}


def test_changed_attention_field_without_a_root_cause_is_a_warning():
    declared = {**QWEN3_8B, "max_window_layers": 36}
    resolved = {**QWEN3_8B_RESOLVED, "max_window_layers": 28}
    _, findings = audit.audit_config("target", declared, resolved)
    assert codes(findings) == [("FIELD_CHANGED", "warning", None)]


# -- the pair -----------------------------------------------------------------------------

DFLASH_DECLARED = {**BASE, "layer_types": MIXED, "sliding_window": WINDOW, "use_sliding_window": True,
                   "max_position_embeddings": 40960}  # fmt: skip
EAGLE3 = {
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
    "vocab_size": 151936, "draft_vocab_size": 32000, "max_position_embeddings": 40960,
}  # fmt: skip
LLAMA_1B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
            "max_position_embeddings": 131072}  # fmt: skip
QWEN3_06B = {**QWEN3_8B, "hidden_size": 1024, "num_hidden_layers": 28}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
QWEN3_8B_YARN = {**QWEN3_8B_RESOLVED, "max_position_embeddings": 131072, "rope_parameters": {**YARN, "rope_theta": 1e6}}


def test_dflash_drafter_run_as_draft_model_by_inference_is_method_mismatch():
    findings = audit.audit_pair(
        method="draft_model", method_given=False, draft_path="/models/drafter",
        target=QWEN3_8B_RESOLVED, draft=DFLASH_DECLARED,
    )  # fmt: skip
    assert codes(findings) == [("METHOD_INFERRED", "info", "METHOD_MISMATCH"), ("METHOD_MISMATCH", "error", None)]
    mismatch = next(f for f in findings if f.code == "METHOD_MISMATCH")
    assert '"method": "dflash"' in mismatch.fix and "inferred from the path" in mismatch.message


def test_method_given_and_matching_is_clean():
    findings = audit.audit_pair(
        method="dflash", method_given=True, draft_path="/models/drafter",
        target=QWEN3_8B_RESOLVED, draft=DFLASH_DECLARED,
    )  # fmt: skip
    assert findings == []


def test_method_inferred_correctly_is_a_warning_only():
    findings = audit.audit_pair(
        method="eagle3", method_given=False, draft_path="/models/Qwen3-8B_eagle3",
        target=QWEN3_8B_RESOLVED, draft=EAGLE3,
    )  # fmt: skip
    assert codes(findings) == [("METHOD_INFERRED", "warning", None)]


def test_draft_model_with_another_vocabulary_is_vocab_mismatch():
    findings = audit.audit_pair(
        method="draft_model", method_given=True, draft_path="/models/llama", target=QWEN3_8B_RESOLVED, draft=LLAMA_1B
    )
    assert codes(findings) == [("VOCAB_MISMATCH", "error", None)]
    assert findings[0].evidence["target_vocab_size"] == 151936 and findings[0].evidence["draft_vocab_size"] == 128256
    load = audit.explain_load_error(
        "ValueError: Target and draft model should have the same vocabulary size. Target model vocab_size=151936.",
        findings,
    )
    assert (load.severity, load.caused_by) == ("info", "VOCAB_MISMATCH")


def test_eagle3_reduced_draft_vocabulary_is_clean():
    findings = audit.audit_pair(
        method="eagle3", method_given=True, draft_path="/models/eagle3", target=QWEN3_8B_RESOLVED, draft=EAGLE3
    )
    assert findings == []


def test_eagle3_with_another_full_vocabulary_is_vocab_mismatch():
    draft = {**EAGLE3, "vocab_size": 128256}
    findings = audit.audit_pair(method="eagle3", method_given=True, draft_path="x", target=QWEN3_8B_RESOLVED, draft=draft)
    assert codes(findings) == [("VOCAB_MISMATCH", "error", None)]


def test_qwen3_draft_model_for_qwen3_target_is_clean():
    findings = audit.audit_pair(
        method="draft_model", method_given=True, draft_path="/models/Qwen3-0.6B",
        target=QWEN3_8B_RESOLVED, draft=QWEN3_06B, target_max_model_len=40960,
    )  # fmt: skip
    assert findings == []


def test_yarn_target_and_plain_drafter_is_draft_context_short():
    assert audit.effective_context(QWEN3_8B_YARN) == 131072
    assert audit.effective_context(DFLASH_DECLARED) == 40960
    for max_model_len in (131072, None):  # vLLM's max_model_len, or the config's own context
        findings = audit.audit_pair(
            method="dflash", method_given=True, draft_path="x", target=QWEN3_8B_YARN, draft=DFLASH_DECLARED,
            target_max_model_len=max_model_len,
        )  # fmt: skip
        assert codes(findings) == [("DRAFT_CONTEXT_SHORT", "warning", None)]
        assert findings[0].evidence["target_context"] == 131072
    # the same YaRN factor on the drafter, or a capped --max-model-len: clean
    draft = {**DFLASH_DECLARED, "rope_scaling": YARN}
    assert audit.audit_pair(method="dflash", method_given=True, draft_path="x", target=QWEN3_8B_YARN, draft=draft) == []
    capped = audit.audit_pair(
        method="dflash", method_given=True, draft_path="x", target=QWEN3_8B_YARN, draft=DFLASH_DECLARED,
        target_max_model_len=32768,
    )  # fmt: skip
    assert capped == []


def test_model_free_methods_have_no_pair_findings():
    assert audit.audit_pair(method="ngram", method_given=True, draft_path=None, target=QWEN3_8B, draft=None) == []


# -- load errors ---------------------------------------------------------------------------


def test_runner_refusal_is_its_own_root_cause():
    declared, resolved = SHAPES["layer_types_no_flag"]
    _, findings = audit.audit_config("draft", declared, resolved)
    for error in (
        "ValueError: Model Runner V1 does not support: mixed sliding/full dflash drafts",
        "NotImplementedError: DFlash drafters with mixed sliding/full attention require the V2 model runner; "
        "relaunch with VLLM_USE_V2_MODEL_RUNNER=1.",
    ):
        assert audit.runner_refusal(error) == "v2"
        load = audit.explain_load_error(error, findings)  # SWA_DROPPED does not explain it
        assert (load.code, load.severity, load.caused_by) == ("LOAD_FAILED", "error", None)
        assert load.evidence["needs_runner"] == "v2"
        assert "V2 model runner" in load.message and "V2" in load.fix
    v2 = "ValueError: Model Runner V2 does not yet support: heterogeneous-vocabulary draft models"
    assert audit.runner_refusal(v2) == "v1"
    assert audit.explain_load_error(v2, []).evidence["needs_runner"] == "v1"
    assert audit.runner_refusal(LOAD_ERROR) is None


def test_unexplained_load_error_is_an_error():
    load = audit.explain_load_error("RuntimeError: out of memory", [])
    assert (load.code, load.severity, load.caused_by) == ("LOAD_FAILED", "error", None)
    assert load.message == "vLLM refused to build the model: RuntimeError: out of memory."


def test_pattern_derived_sliding_layers_without_layer_types_are_no_mismatch():
    """Gemma 3 style: a window, no layer_types; transformers derives 5 sliding : 1 full."""
    declared = {"model_type": "gemma3_text", "num_hidden_layers": 12, "sliding_window": 512, "sliding_window_pattern": 6}
    derived = ([S] * 5 + [F]) * 2
    resolved = {**declared, "layer_types": derived}
    plans = audit.layer_plans(declared, resolved)
    assert [p.resolved_window for p in plans] == [512 if t == S else None for t in derived]
    for plan in plans:
        plan.runtime_type, plan.runtime_window = plan.resolved_type, plan.resolved_window
    _, findings = audit.audit_config("target", declared, resolved)
    assert audit.audit_layout("target", plans, audit.root_causes(findings)) == []
    # but a runtime that ignores the derived layout still is one
    for plan in plans:
        plan.runtime_type, plan.runtime_window = "full", None
    ignored = audit.audit_layout("target", plans, set())
    assert ("LAYOUT_MISMATCH", "error", None) in codes(ignored)
    assert "run differently from their resolved config" in ignored[0].message


def test_hybrid_linear_attention_layers_are_their_own_type():
    """Qwen3-Next: Gated DeltaNet layers are `linear`, never full attention; running as declared is no finding."""
    declared = {"model_type": "qwen3_next", "num_hidden_layers": 4, "layer_types": ["linear_attention"] * 3 + ["full_attention"]}
    plans = audit.layer_plans(declared, declared)
    assert [(p.declared_type, p.resolved_type) for p in plans] == [("linear", "linear")] * 3 + [("full", "full")]
    layers = [{"runtime_type": t, "runtime_window": None} for t in ("linear", "linear", "linear", "full")]
    assert audit.audit_model_layout("target", declared, declared, layers)[1] == []
    # a linear layer that runs as full attention is a mismatch
    layers[0] = {"runtime_type": "full", "runtime_window": None}
    [finding] = audit.audit_model_layout("target", declared, declared, layers)[1]
    assert (finding.code, finding.severity) == ("LAYOUT_MISMATCH", "error")
    # an MTP head on a hybrid target: the target's layer_types do not describe the MTP layer
    plans, findings = audit.audit_model_layout("draft", declared, declared, [{"runtime_type": "full"}], method="mtp")
    assert [(p.declared_type, p.resolved_type) for p in plans] == [("unspecified", "full")] and findings == []


# -- DFlash causality, a re-applied window, context boundaries -----------------------------

from spectrace import audit as _audit  # noqa: E402

_DFLASH = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_hidden_layers": 2,
           "dflash_config": {"mask_token_id": 5}}  # fmt: skip


def test_causal_inferred_follows_vllms_rule_unless_declared():
    resolved = {**_DFLASH, "layer_types": ["sliding_attention", "full_attention"]}
    [finding] = _audit.audit_causality("draft", _DFLASH, resolved)
    # info: vLLM's fallback is the published drafters' convention; the evidence says what settles it
    assert (finding.code, finding.severity) == ("CAUSAL_INFERRED", "info")
    assert finding.evidence["causal_by_layer"] == [True, False] and finding.evidence["from"] == "rule"
    assert finding.evidence["settled_by"] and "collapse after it" in finding.message
    declared = {**_DFLASH, "dflash_config": {"mask_token_id": 5, "causal": False}}
    assert _audit.audit_causality("draft", declared, resolved) == []
    assert _audit.audit_causality("draft", {**_DFLASH, "is_causal": True}, resolved) == []
    # set by vLLM's updater (update_dflash: dflash_config.causal from sliding_window_non_causal): nothing inferred
    updated = {**resolved, "dflash_config": {"mask_token_id": 5, "causal": True}}
    assert _audit.audit_causality("draft", _DFLASH, updated) == []
    assert _audit.audit_causality("target", _DFLASH, resolved) == []


_TARGET_SLIDING = {"model_type": "qwen3", "num_hidden_layers": 2, "sliding_window": 32, "use_sliding_window": True,
                   "layer_types": ["sliding_attention"] * 2}  # fmt: skip
_DRAFT_WINDOW_ONLY = {"model_type": "qwen3", "num_hidden_layers": 2, "sliding_window": 32}
_DRAFT_RESOLVED = {"model_type": "qwen3", "num_hidden_layers": 2, "sliding_window": None, "use_sliding_window": False,
                   "layer_types": ["full_attention"] * 2}  # fmt: skip


def test_draft_model_drafter_gets_the_targets_window_back():
    models = [
        {"model_role": "target", "declared": _TARGET_SLIDING, "transformers_resolved": _TARGET_SLIDING},
        {"model_role": "draft", "declared": _DRAFT_WINDOW_ONLY, "transformers_resolved": _DRAFT_RESOLVED},
    ]
    _, by_role = _audit.config_findings(models, "draft_model")
    swa = next(f for f in by_role["draft"] if f.code == "SWA_DROPPED")
    assert swa.severity == "warning" and "comes from the target" in swa.message
    _, by_role = _audit.config_findings(models, "eagle3")  # only draft_model gets the target's window
    assert next(f for f in by_role["draft"] if f.code == "SWA_DROPPED").severity == "error"
    runtime = [{"runtime_type": "sliding", "runtime_window": 32}] * 2
    _, layout = _audit.audit_model_layout("draft", _DRAFT_WINDOW_ONLY, _DRAFT_RESOLVED, runtime)
    assert [(f.code, f.severity, f.caused_by) for f in layout] == [("LAYOUT_MISMATCH", "info", "SWA_DROPPED")]
    # a drafter that declares no window, forced onto the target's, stays an error
    _, layout = _audit.audit_model_layout("draft", _DRAFT_RESOLVED, _DRAFT_RESOLVED, runtime)
    assert [(f.code, f.severity, f.caused_by) for f in layout] == [("LAYOUT_MISMATCH", "error", None)]


def test_context_boundaries_from_the_runs_configs():
    bounds = _audit.context_boundaries(
        method="draft_model", target_declared=_TARGET_SLIDING, target_resolved=_TARGET_SLIDING,
        draft_declared={**_DRAFT_WINDOW_ONLY, "max_position_embeddings": 64,
                        "rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 128}},
        draft_resolved=_DRAFT_RESOLVED, max_model_len=4096,
    )  # fmt: skip
    assert [(b.tokens, b.model_role, b.field) for b in bounds] == [
        (32, "target", "sliding_window (declared)"),
        (32, "draft", "sliding_window (declared)"),
        (64, "draft", "max_position_embeddings"),
        (128, "draft", "rope original_max_position_embeddings"),
    ]
    assert "DRAFT_CONTEXT_SHORT" in bounds[2].explained_by


def test_ranks_that_agree_raise_nothing_and_each_disagreement_is_one_finding():
    layer = ("target", 0, "sliding", 512, None)
    layouts = {0: [layer, ("target", 1, "full", None, None)], 1: [("target", 1, "full", None, None), layer]}
    assert audit.rank_disagreements(layouts, {0: [2, 4], 1: [2, 4]}, {0: (72, 60), 1: (72, 60)}) == []
    assert audit.rank_disagreements({0: [layer]}, {0: [1]}, {0: (1, 1)}) == []  # one rank: nothing to compare
    layouts[1] = [("target", 0, "full", None, None), ("target", 1, "full", None, None)]  # rank 1 lost the window
    found = audit.rank_disagreements(layouts, {0: [2, 4], 1: [2, 5]}, {0: (72, 60), 1: (72, 61)})
    assert [(f.code, f.severity, f.evidence["aspect"], f.evidence["differing_ranks"]) for f in found] == [
        ("RANK_DISAGREEMENT", "error", aspect, [1]) for aspect in ("layout", "taps", "counts")
    ]
    assert found[0].evidence["layers"] == {"1": [("target", 0, "full", None, None)]}
    assert found[0].evidence["reference_layers"] == [layer]
