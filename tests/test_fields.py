"""Every drafter field and the vocabulary map (issue #35), the pure judgements: ``audit.fields`` on stages
given as data, ``audit.vocab`` on map values given as data, ``audit.taps``' guessed taps. No vLLM: what the
installed vLLM's own stages produce is tested in test_doctor_fields.py (doctor) and test_fields_live.py.
"""

from __future__ import annotations

from spectrace import audit
from spectrace.audit import codes
from spectrace.audit.fields import Stage, drafter_fields, field_findings, relink
from spectrace.audit.vocab import VocabTensor, audit_vocab_map

UPDATER = "extract_transformers_pre_trained_config -> update_eagle3"
LAYER = {"model_type": "llama", "hidden_size": 128, "rms_norm_eps": 1e-6, "norm_before_fc": True}
# speculators' shape: the EAGLE-3 fields at the top, the decoder layer below (defaults left out)
DECLARED = {"speculators_model_type": "eagle3", "speculators_config": {"proposal_methods": []}, "draft_vocab_size": 200,
            "transformer_layer_config": LAYER, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}  # fmt: skip


def _stages(after_updater, final):
    return [Stage(UPDATER, after_updater), Stage("SpeculatorsConfig.__init__", final), Stage("SpeculativeConfig", final)]


def _by_code(findings):
    return {f.code: f for f in findings}


def test_a_nested_norm_overwritten_by_the_top_level_default_and_a_replaced_trainer_default_are_errors():
    # what update_eagle3 leaves: the layer's keys, its top-level reads with their defaults on top
    built = {"model_type": "llama", "hidden_size": 128, "rms_norm_eps": 1e-6, "norm_before_fc": False,
             "norm_before_residual": True, "draft_vocab_size": 200}  # fmt: skip
    fields = drafter_fields(DECLARED, _stages(built, built))
    status = {f.path: (f.status, f.rule) for f in fields if f.status != "ok"}
    assert status == {
        "transformer_layer_config.norm_before_fc": ("overridden", UPDATER),
        "rope_scaling.rope_type": ("dropped", UPDATER),
        "rope_scaling.factor": ("dropped", UPDATER),
        "norm_before_residual": ("default_differs", UPDATER),
    }
    found = _by_code(field_findings(DECLARED, fields))
    over = found[codes.DRAFT_FIELD_OVERRIDDEN]
    assert (over.severity, over.evidence["declared"], over.evidence["resolved"]) == ("error", True, False)
    assert over.fix.startswith('declare "norm_before_fc": true at the top level')
    default = found[codes.DRAFT_FIELD_DEFAULT_DIFFERS]
    assert (default.severity, default.evidence["trainer_default"], default.evidence["resolved"]) == ("error", False, True)
    assert default.fix.startswith('declare "norm_before_residual": false at the top level')
    dropped = found[codes.DRAFT_FIELD_DROPPED]
    assert dropped.severity == "error" and "into transformer_layer_config" in dropped.fix
    # a clean twin: the norms at the top, the rope inside the layer
    clean = {**DECLARED, "transformer_layer_config": {**LAYER, "norm_before_fc": False,
             "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "norm_before_residual": False}  # fmt: skip
    clean.pop("rope_scaling")
    built = {**built, "norm_before_residual": False, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    assert [f for f in drafter_fields(clean, _stages(built, built)) if f.status != "ok"] == []



def test_training_only_fields_are_not_followed():
    """speculators writes fields only its trainer reads (``embed_requires_grad`` in every EAGLE-3 config, as in the
    trained zoo's); vLLM drops them and serving never reads them: no finding, no config_fields row."""
    declared = {**DECLARED, "embed_requires_grad": False, "enable_sp_ulysses": False,
                "transformer_layer_config": {**LAYER, "norm_before_fc": False}, "norm_before_residual": False}
    built = {"model_type": "llama", "hidden_size": 128, "rms_norm_eps": 1e-6, "norm_before_fc": False,
             "norm_before_residual": False, "draft_vocab_size": 200, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    declared.pop("rope_scaling")
    declared["transformer_layer_config"]["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    assert [f.path for f in drafter_fields(declared, _stages(built, built)) if f.status != "ok"] == []
    # the same name outside a speculators config is an ordinary field
    hf = [Stage("get_config", {"model_type": "llama", "embed_requires_grad": False}), Stage("SpeculativeConfig", {})]
    assert [f.path for f in drafter_fields({"model_type": "llama", "embed_requires_grad": False}, hf)] == [
        "embed_requires_grad"]

def test_metadata_is_a_warning_a_purposeful_change_info_and_a_known_cause_is_linked_not_repeated():
    declared = {"model_type": "llama", "initializer_range": 0.02, "max_position_embeddings": 2048, "sliding_window": 64,
                "rope_theta": 10000.0, "sliding_window_pattern": 6}  # fmt: skip
    resolved = {"model_type": "eagle", "max_position_embeddings": 4096, "rope_parameters": {"rope_theta": 10000.0}}
    # transformers' class converts sliding_window_pattern (the config audit's business, not followed here) ...
    transformers = {"model_type": "llama", "initializer_range": 0.02, "max_position_embeddings": 2048,
                    "sliding_window": 64, "rope_parameters": {"rope_theta": 10000.0}}  # fmt: skip
    # ... then vLLM's own stage loses two fields and raises the context
    stages = [Stage("get_config", transformers), Stage("vllm.config.speculative.SpeculativeConfig.__post_init__", resolved)]
    fields = drafter_fields(declared, stages)
    assert {f.path: f.status for f in fields} == {
        "initializer_range": "dropped", "max_position_embeddings": "changed", "sliding_window": "dropped", "rope_theta": "ok"}
    swa = codes.finding(codes.SWA_DROPPED, model_role="draft", message="window lost")
    found = field_findings(declared, fields, causes=[swa])
    assert sorted((f.evidence["field"], f.severity, f.caused_by) for f in found) == [
        ("initializer_range", "warning", None),
        ("max_position_embeddings", "info", None),
        ("sliding_window", "info", "SWA_DROPPED"),
    ]
    # a field an attention finding already reports is left to it
    assert [f.evidence["field"] for f in field_findings(declared, fields, covered={"sliding_window", "initializer_range"},
                                                        causes=[swa])] == ["max_position_embeddings"]


def test_norm_tensors_nothing_loaded_are_explained_by_the_lost_norm_field():
    built = {"model_type": "llama", "hidden_size": 128, "rms_norm_eps": 1e-6, "norm_before_fc": False,
             "norm_before_residual": False, "draft_vocab_size": 200}  # fmt: skip
    findings = field_findings(DECLARED, drafter_fields({**DECLARED, "rope_scaling": None}, _stages(built, built)))
    unused = codes.finding(codes.DRAFT_TENSORS_UNUSED, "warning", model_role="draft", message="1 unused",
                           evidence={"unused": ["input_norm.weight"]})
    findings.append(unused)
    relink(findings)
    assert (unused.severity, unused.caused_by, unused.fix) == ("info", codes.DRAFT_FIELD_OVERRIDDEN, "")


def _map(kind, n=200, vocab=512):
    targets = [i * vocab // n + 1 for i in range(n)]
    offsets = [t - i for i, t in enumerate(targets)]
    values = {"offsets": offsets, "identity": list(range(n)), "zeros": [0] * n, "out": offsets[:-1] + [vocab],
              "clash": [offsets[0], offsets[0] - 1] + offsets[2:]}[kind]
    return VocabTensor("I64", (n,), values)


def _mask(targets, vocab=512):
    return VocabTensor("BOOL", (vocab,), [1 if i in set(targets) else 0 for i in range(vocab)])


def test_a_reduced_vocabulary_needs_a_d2t_of_offsets_onto_distinct_valid_target_ids():
    def judge(d2t, t2d=None, **kw):
        args = {"draft_vocab_size": 200, "target_vocab_size": 512, "checkpoint_read": True, "d2t": d2t, "t2d": t2d, **kw}
        return [(f.code, f.severity, f.message) for f in audit_vocab_map(**args)]

    good_targets = [i * 512 // 200 + 1 for i in range(200)]
    assert judge(_map("offsets"), _mask(good_targets)) == []
    [(code, severity, message)] = judge(None)
    assert (code, severity) == ("DRAFT_VOCAB_MAP_MISSING", "error") and "target tokens 0..199" in message
    for kind, words in (("identity", "not offsets"), ("zeros", "all zero"), ("out", "199->711"), ("clash", "same target id")):
        [(code, severity, message)] = judge(_map(kind))
        assert (code, severity) == ("DRAFT_VOCAB_MAP_INVALID", "error") and words in message, kind
    assert "F32" in judge(VocabTensor("F32", (200,), None))[0][2]
    assert "[199]" in judge(VocabTensor("I64", (199,), list(range(199))))[0][2]
    # a t2d that disagrees is a warning (vLLM skips it)
    [(code, severity, message)] = judge(_map("offsets"), _mask(good_targets[:-1]))
    assert (code, severity) == ("DRAFT_VOCAB_MAP_INVALID", "warning") and "marks 199" in message
    # nothing to judge: equal vocabularies, an unknown size, a checkpoint not read (a config-only directory)
    assert judge(None, draft_vocab_size=512) == judge(None, draft_vocab_size=None) == judge(None, checkpoint_read=False) == []


def test_taps_vllm_guessed_are_named_as_guessed_with_the_method_that_gave_them():
    rule = "vllm.model_executor.models.interfaces.SupportsEagle3.get_eagle3_default_aux_hidden_state_layers"
    tap, [finding] = audit.audit_taps(draft={}, target_layers=8, tapped_ids=[2, 4, 5], input_taps=3,
                                      default_ids=[2, 4, 5], default_rule=rule)
    assert (tap.status, finding.code, finding.evidence["guessed"]) == ("defaulted", "TAP_DEFAULTED", True)
    assert "guessed" in finding.message and rule in finding.message
    # declared in a field this runner does not read: a mismatch whose taps are the guess
    tap, [finding] = audit.audit_taps(draft={"target_layer_ids": [0, 3, 6]}, target_layers=8, tapped_ids=[2, 4, 5],
                                      input_taps=3, default_ids=[2, 4, 5], default_rule=rule)
    assert (finding.code, finding.evidence["guessed"]) == ("TAP_MISMATCH", True) and "guessed default" in finding.message
    # declared, read, and wrong: not a guess
    tap, [finding] = audit.audit_taps(draft={"eagle_aux_hidden_state_layer_ids": [1, 3, 6]}, target_layers=8,
                                      tapped_ids=[1, 3, 7], input_taps=3, default_ids=[2, 4, 5], default_rule=rule)
    assert (finding.code, finding.evidence["guessed"]) == ("TAP_MISMATCH", False) and "guessed" not in finding.message


def test_draft_settings_accepted_and_never_applied_are_named():
    from spectrace.audit.draft_settings import audit_draft_settings

    found = audit_draft_settings(method="eagle3", max_model_len=(256, 512), tensor_parallel_size=(1, 2))
    assert [(f.code, f.severity, f.evidence["setting"], f.evidence["asked"], f.evidence["runs_with"]) for f in found] == [
        ("DRAFT_SETTING_IGNORED", "warning", "speculative_config.max_model_len", 256, 512),
        ("DRAFT_SETTING_IGNORED", "warning", "draft_tensor_parallel_size", 1, 2),
    ]
    yarn = {"key": "rope_parameters.rope_type", "asked": "yarn", "target": "yarn", "draft": "default"}
    [finding] = audit_draft_settings(method="mtp", hf_overrides=[yarn])
    assert (finding.severity, finding.evidence["setting"]) == ("error", "hf_overrides.rope_parameters.rope_type")
    # applied, unknown, or an independent drafter (target-only overrides are expected there): nothing
    assert audit_draft_settings(method="eagle3", max_model_len=(512, 512), tensor_parallel_size=(None, 1)) == []
    assert audit_draft_settings(method="mtp", hf_overrides=[{**yarn, "draft": "yarn"}]) == []
    assert audit_draft_settings(method="draft_model", hf_overrides=[yarn]) == []


def test_tap_ids_that_are_not_layer_ids_are_one_finding_not_a_crash():
    """#38's probe: NaN, infinity, null or text among declared tap ids raised out of the tap audit (int(nan))."""
    for bad in (float("nan"), float("inf"), None, "two", True):
        tap, findings = audit.audit_taps(draft={"eagle_aux_hidden_state_layer_ids": [1, bad, 6]}, target_layers=8,
                                         tapped_ids=[2, 4, 5], input_taps=3)
        assert tap.status == "out_of_range" and findings[0].code == "TAP_OUT_OF_RANGE", bad
        assert repr(bad) in findings[0].message and "not layer ids" in findings[0].message
    tap, findings = audit.audit_taps(draft={"eagle_aux_hidden_state_layer_ids": [1.0, 3, 6.0]}, target_layers=8,
                                     tapped_ids=[2, 4, 7], input_taps=3)
    assert tap.declared_ids == [1, 3, 6] and "TAP_OUT_OF_RANGE" not in [f.code for f in findings]
