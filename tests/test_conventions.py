"""Tap conventions by producer, the method chain and the synthetic sampler, judged from facts (pure, no vLLM) (#58).

The same functions judge the live frontend's and doctor's facts (tests/test_doctor_taps.py,
tests/test_doctor_method.py, tests/test_conventions_live.py run them on vLLM's own resolution)."""

from __future__ import annotations

from spectrace import audit
from spectrace.audit import codes
from spectrace.audit.method import audit_method_chain, audit_rejection, declared_algorithm
from spectrace.audit.taps import SPECFORGE, SPECULATORS, audit_taps, tap_producer

SPECFORGE_GPT_OSS = {"architectures": ["LlamaForCausalLMEagle3"], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 11, 21]}}


def triples(findings):
    return sorted((f.code, f.severity, f.caused_by) for f in findings)


def test_the_producer_is_told_from_what_the_checkpoint_carries():
    assert tap_producer(SPECFORGE_GPT_OSS) == SPECFORGE
    assert tap_producer({"speculators_model_type": "eagle3", "eagle_aux_hidden_state_layer_ids": [1, 2, 3]}) == SPECULATORS
    assert tap_producer({"model_type": "speculators"}) == SPECULATORS  # as vLLM's SpeculatorsConfig resolves it
    assert tap_producer({"dflash_config": {"target_layer_ids": [1, 9]}}) == "dflash-reference"
    assert tap_producer({"eagle_aux_hidden_state_layer_ids": [2, 12, 21]}) is None
    assert tap_producer(None) is None and tap_producer({"eagle_config": "text"}) is None


def test_specforge_ids_read_verbatim_are_one_layer_early():
    tap, findings = audit_taps(draft=SPECFORGE_GPT_OSS, target_layers=24, tapped_ids=[1, 11, 21], input_taps=3)
    assert (tap.expected_ids, tap.tapped_ids, tap.status) == ([2, 12, 22], [1, 11, 21], "mismatch")
    assert triples(findings) == [("TAP_CONVENTION", "error", None), ("TAP_MISMATCH", "info", "TAP_CONVENTION")]
    convention = next(f for f in findings if f.code == codes.TAP_CONVENTION)
    assert convention.evidence["ids_to_declare"] == [2, 12, 22] and convention.evidence["producer"] == SPECFORGE
    assert '"eagle_aux_hidden_state_layer_ids": [2, 12, 22]' in convention.fix and "vllm#43671" in convention.message


def test_specforge_ids_not_read_are_the_defaults_mismatch_with_the_ids_to_declare():
    tap, findings = audit_taps(draft=SPECFORGE_GPT_OSS, target_layers=24, tapped_ids=[2, 12, 21], input_taps=3,
                               default_ids=[2, 12, 21], default_rule="SupportsEagle3.get_eagle3_default_aux_hidden_state_layers")
    assert triples(findings) == [("TAP_MISMATCH", "error", None)]
    assert '"eagle_aux_hidden_state_layer_ids": [2, 12, 22]' in findings[0].fix
    # the default that happens to be what SpecForge trained on: quiet
    _, findings = audit_taps(draft={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 11, 20]}}, target_layers=24,
                             tapped_ids=[2, 12, 21], input_taps=3, default_ids=[2, 12, 21], default_rule="d")
    assert findings == []


def test_ids_of_a_producer_that_cannot_be_told_are_said_as_info_and_speculators_not_at_all():
    _, findings = audit_taps(draft={"eagle_aux_hidden_state_layer_ids": [2, 12, 21]}, target_layers=24,
                             tapped_ids=[2, 12, 21], input_taps=3)
    assert triples(findings) == [("TAP_CONVENTION", "info", None)]
    assert findings[0].evidence["sglang_reading"] == [3, 13, 22] and findings[0].evidence["settled_by"]
    _, findings = audit_taps(draft={"speculators_model_type": "eagle3", "eagle_aux_hidden_state_layer_ids": [2, 12, 21]},
                             target_layers=24, tapped_ids=[2, 12, 21], input_taps=3)
    assert findings == []
    # DFlash's target_layer_ids: one convention for every producer, read as such (+1)
    _, findings = audit_taps(draft={"dflash_config": {"target_layer_ids": [1, 11, 21]}}, target_layers=24,
                             tapped_ids=[2, 12, 22], input_taps=3)
    assert findings == []


def test_the_capture_point_is_carried_on_the_taps_row():
    tap, _ = audit_taps(draft=SPECFORGE_GPT_OSS, target_layers=24, tapped_ids=[1, 11, 21], input_taps=3,
                        capture_point="the input of layer k", capture_rule="m.Model.forward")
    assert tap.as_row()["capture_point"] == "the input of layer k"


SPECULATORS_EAGLE3 = {"speculators_model_type": "eagle3", "architectures": ["Eagle3DraftModel"],
                      "speculators_config": {"algorithm": "eagle3"}}
BUILT_EAGLE3 = {"architectures": ["Eagle3LlamaForCausalLM"],
                "model_class": "vllm.model_executor.models.llama_eagle3.Eagle3LlamaForCausalLM"}


def test_declared_algorithm():
    assert declared_algorithm(SPECULATORS_EAGLE3) == ("eagle3", "speculators_model_type")
    assert declared_algorithm({"speculators_config": {"algorithm": "dflash2"}}) == ("dflash2", "speculators_config.algorithm")
    assert declared_algorithm({"architectures": ["DFlash2DraftModel"]}) == ("dflash2", "architectures")
    assert declared_algorithm({"architectures": ["LlamaForCausalLMEagle3"]}) == ("eagle3", "architectures")
    assert declared_algorithm({"architectures": ["LlamaForCausalLM"]}) == (None, None)


def test_an_eagle3_drafter_run_as_eagle_is_downgraded_and_its_twin_is_quiet():
    [f] = audit_method_chain(SPECULATORS_EAGLE3, {**BUILT_EAGLE3, "method": "eagle"})
    assert (f.code, f.severity, f.evidence["skipped"]) == (codes.METHOD_DOWNGRADED, "error", "fc (the auxiliary hidden-state fusion)")
    assert audit_method_chain(SPECULATORS_EAGLE3, {**BUILT_EAGLE3, "method": "eagle3"}) == []
    # vLLM could not build an EAGLE-3 class (EagleLlamaForCausalLMEagle3 is registered nowhere): loud, no downgrade
    assert audit_method_chain({"architectures": ["LlamaForCausalLMEagle3"]},
                              {"architectures": ["EagleLlamaForCausalLMEagle3"], "model_class": None, "method": "eagle"}) == []


def test_a_dflash2_drafter_built_as_dflash_is_downgraded_and_its_twin_is_quiet():
    declared = {"speculators_model_type": "dflash2"}
    [f] = audit_method_chain(declared, {"architectures": ["DFlashDraftModel"], "model_class": "m.DFlashQwen3ForCausalLM",
                                        "method": "dflash"})
    assert f.code == codes.METHOD_DOWNGRADED and "vllm#52816" in f.message and f.evidence["skipped"] == "the candidate selector"
    assert audit_method_chain(declared, {"architectures": ["DFlash2DraftModel"], "model_class": "m.DFlash2Qwen3ForCausalLM",
                                         "method": "dflash"}) == []


def test_the_judge_makes_the_mismatch_the_downgrades_symptom():
    models = [{"model_role": "target", "declared": {}, "transformers_resolved": {}},
              {"model_role": "draft", "declared": SPECULATORS_EAGLE3, "transformers_resolved": {}}]
    judged = audit.judge(audit.RunFacts(models, "eagle", speculation={**BUILT_EAGLE3, "method": "eagle"}))
    assert ("METHOD_MISMATCH", "info", "METHOD_DOWNGRADED") in triples(judged.findings)
    assert ("METHOD_DOWNGRADED", "error", None) in triples(judged.findings)
    judged = audit.judge(audit.RunFacts(models, "eagle3", speculation={**BUILT_EAGLE3, "method": "eagle3"}))
    assert not [f for f in judged.findings if f.component == "method"]


def test_synthetic_acceptance_and_its_quiet_twin():
    [f] = audit_rejection({"rejection_sample_method": "synthetic", "synthetic_acceptance_length": None,
                           "synthetic_acceptance_rates": [1.0, 0.5, 0.0]})
    assert (f.code, f.severity) == (codes.SYNTHETIC_ACCEPTANCE, "warning") and "[1.0, 0.5, 0.0]" in f.message
    assert audit_rejection({"rejection_sample_method": "standard"}) == []
    assert audit_rejection(None) == []
