"""`spectrace doctor` on speculators-format EAGLE-3 drafters (issue #35): every field vLLM drops or replaces,
the vocabulary map, the guessed taps. Real vLLM 0.32 code in this process (its speculators updater, config
resolution, the drafter built on the meta device, ``load_weights`` dry-run); no engine.

The drafters are written by ``spectrace.testing.models.build_speculators_eagle3`` in the JSON shape the
speculators library writes (its ``Eagle3SpeculatorConfig``), with real safetensors (``d2t`` / ``t2d`` values
are read), next to the zoo's 8-layer target.
"""

from __future__ import annotations

import json

import pytest

from spectrace import cli

pytestmark = pytest.mark.vllm

UPDATER = ("vllm.transformers_utils.configs.speculators.base.SpeculatorsConfig.extract_transformers_pre_trained_config"
           " -> vllm.transformers_utils.configs.speculators.algos.update_eagle3")
FIXED = {"norm_before_residual": False}  # what speculators meant: its default, which its serialiser leaves out
CASES = {
    # the clean twin: everything where vLLM reads it
    "clean": dict(top=FIXED),
    # norms declared in the decoder layer (vLLM reads them from the top only), the trainer's default left out,
    # a rope_scaling at the top (vLLM builds the drafter from transformer_layer_config)
    "fields": dict(layer={"norm_before_fc": True, "norm_output": True},
                   top={"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    # fc_norm declared in the layer, with the per-tap norm weights a drafter trained with it carries
    "fc_norm": dict(top=FIXED, layer={"fc_norm": True}),
    "vocab_ok": dict(top=FIXED, draft_vocab_size=200),
    **{f"vocab_{kind}": dict(top=FIXED, draft_vocab_size=200, d2t=kind)
       for kind in ("missing", "identity", "float", "short", "out_of_range")},
    "noids": dict(top=FIXED, aux_layer_ids=None),
}


@pytest.fixture(scope="module")
def drafters(zoo, tmp_path_factory):
    from spectrace.testing.models import build_speculators_eagle3

    root = tmp_path_factory.mktemp("speculators")
    paths = {name: str(build_speculators_eagle3(root / f"{name}-eagle3", target_dir=zoo["target"], **kw))
             for name, kw in CASES.items()}
    for name, change in (("notdict", ["not", "a", "dict"]), ("unknown", "eagle9")):
        path = root / f"{name}-eagle3"
        path.mkdir()
        config = json.loads((root / "clean-eagle3" / "config.json").read_text())
        config["transformer_layer_config" if name == "notdict" else "speculators_model_type"] = change
        (path / "config.json").write_text(json.dumps(config))
        paths[name] = str(path)
    return paths


def doctor(capsys, zoo, draft, runner="v2"):
    rc = cli.main(["doctor", "--target", zoo["target"], "--draft", draft, "--method", "eagle3", "--runner", runner, "--json"])
    out, err = capsys.readouterr()
    return rc, json.loads(out), err


def _triples(report):
    return sorted((f["code"], f["severity"], f["caused_by"], f["evidence"].get("field")) for f in report["findings"])


def test_each_field_vllm_loses_on_the_way_to_the_drafter_is_named_with_its_function(capsys, zoo, drafters):
    rc, report, _ = doctor(capsys, zoo, drafters["fields"])
    assert rc == 1
    assert _triples(report) == [
        ("DRAFT_FIELD_CHANGED", "error", None, "rope_scaling.rope_type"),
        ("DRAFT_FIELD_DEFAULT_DIFFERS", "error", None, "norm_before_residual"),
        ("DRAFT_FIELD_DROPPED", "error", None, "rope_scaling.factor"),
        ("DRAFT_FIELD_OVERRIDDEN", "error", None, "transformer_layer_config.norm_before_fc"),
        ("DRAFT_FIELD_OVERRIDDEN", "error", None, "transformer_layer_config.norm_output"),
        # the norm weights the checkpoint carries, skipped because vLLM built no such norm
        ("DRAFT_TENSORS_UNUSED", "info", "DRAFT_FIELD_OVERRIDDEN", None),
    ]
    by_field = {f["evidence"].get("field"): f for f in report["findings"]}
    over = by_field["transformer_layer_config.norm_before_fc"]
    assert (over["evidence"]["declared"], over["evidence"]["resolved"], over["evidence"]["vllm_rule"]) == (True, False, UPDATER)
    assert over["fix"].startswith('declare "norm_before_fc": true at the top level')
    default = by_field["norm_before_residual"]
    assert (default["evidence"]["resolved"], default["evidence"]["trainer_default"]) == (True, False)
    assert "to_diff_dict" in default["message"] and default["evidence"]["vllm_rule"] == UPDATER
    assert "into transformer_layer_config" in by_field["rope_scaling.factor"]["fix"]
    unused = next(f for f in report["findings"] if f["code"] == "DRAFT_TENSORS_UNUSED")
    assert unused["evidence"]["unused"] == ["input_norm.weight"]
    # fc_norm lost: vLLM builds no fc_norm, and its loader refuses the checkpoint's fc_norm weights outright
    rc, report, _ = doctor(capsys, zoo, drafters["fc_norm"])
    assert (rc, _triples(report)) == (1, [("DRAFT_FIELD_OVERRIDDEN", "error", None, "transformer_layer_config.fc_norm")])
    assert "no module or parameter named 'fc_norm'" in report["models"]["draft"]["dry_load"]


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_the_clean_twins_are_quiet(capsys, zoo, drafters, runner):
    for name in ("clean", "vocab_ok"):
        rc, report, _ = doctor(capsys, zoo, drafters[name], runner)
        assert (rc, report["findings"]) == (0, []), name


def test_a_missing_or_wrong_vocabulary_map_says_where_draft_ids_land(capsys, zoo, drafters):
    expected = {
        "vocab_missing": ("DRAFT_VOCAB_MAP_MISSING", "every draft lands on target tokens 0..199"),
        "vocab_identity": ("DRAFT_VOCAB_MAP_INVALID", "draft id i lands on target id 2i"),
        "vocab_float": ("DRAFT_VOCAB_MAP_INVALID", "d2t is F32, not an integer tensor"),
        "vocab_short": ("DRAFT_VOCAB_MAP_INVALID", "d2t has shape [199], not [200]"),
        "vocab_out_of_range": ("DRAFT_VOCAB_MAP_INVALID", "199->711"),
    }
    for name, (code, words) in expected.items():
        rc, report, _ = doctor(capsys, zoo, drafters[name])
        [finding] = report["findings"]
        assert (rc, finding["code"], finding["severity"]) == (1, code, "error"), name
        assert words in finding["message"], (name, finding["message"])
        assert (finding["evidence"]["draft_vocab_size"], finding["evidence"]["target_vocab_size"]) == (200, 512)
    # the missing map is no longer an "uninitialised" parameter: vLLM zero-fills draft_id_to_target_id
    _, report, _ = doctor(capsys, zoo, drafters["vocab_missing"])
    assert "DRAFT_WEIGHTS_UNLOADED" not in {f["code"] for f in report["findings"]}


def test_taps_vllm_guesses_are_named_as_guessed(capsys, zoo, drafters):
    rc, report, _ = doctor(capsys, zoo, drafters["noids"])
    [finding] = report["findings"]
    assert (rc, finding["code"], finding["evidence"]["guessed"]) == (0, "TAP_DEFAULTED", True)
    assert finding["evidence"]["tapped_ids"] == finding["evidence"]["default_ids"] == [2, 4, 5]  # (2, 8//2, 8-3)
    assert finding["evidence"]["default_rule"].endswith("get_eagle3_default_aux_hidden_state_layers")
    assert "vLLM guessed the drafter's taps [2, 4, 5]" in finding["message"]


def test_a_speculators_config_vllm_cannot_convert_is_one_line(capsys, zoo, drafters):
    for name, words in (("notdict", "transformer_layer_config must be an object"),
                        ("unknown", "speculators_model_type 'eagle9' is not one this vLLM converts")):
        rc = cli.main(["doctor", "--target", zoo["target"], "--draft", drafters[name], "--method", "eagle3"])
        out, err = capsys.readouterr()
        assert rc == 2 and words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, name


def test_an_hf_override_of_the_targets_rope_never_reaches_the_drafter(zoo, drafters):
    """vLLM's own config resolution (no engine): a dict --hf-overrides applies to the target's config only."""
    from vllm.engine.arg_utils import EngineArgs

    from spectrace.audit.draft_settings import audit_draft_settings
    from spectrace.vllm_objects.configs import hf_override_facts

    yarn = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 1024, "rope_theta": 10000.0}
    args = EngineArgs(model=zoo["target"], hf_overrides={"rope_parameters": yarn}, enforce_eager=True,
                      speculative_config={"model": drafters["clean"], "method": "eagle3", "num_speculative_tokens": 2})
    vllm_config = args.create_engine_config()
    facts = {f["key"]: f for f in hf_override_facts(vllm_config)}
    assert (facts["rope_parameters.rope_type"]["target"], facts["rope_parameters.rope_type"]["draft"]) == ("yarn", "default")
    found = audit_draft_settings(method="eagle3", hf_overrides=list(facts.values()))
    assert {(f.code, f.severity, f.evidence["setting"]) for f in found} >= {
        ("DRAFT_SETTING_IGNORED", "error", "hf_overrides.rope_parameters.rope_type"),
        ("DRAFT_SETTING_IGNORED", "error", "hf_overrides.rope_parameters.factor"),
    }
