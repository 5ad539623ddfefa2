"""`spectrace doctor`: the hidden-state tap audit, from config.json files alone.

Doctor resolves the tapped ids with the chosen runner's own vLLM function (V2:
``eagle3_utils.get_eagle3_aux_layers_from_config``; V1:
``GPUModelRunner._get_eagle3_aux_layers_from_config``), falls back to the meta-built
target's ``get_eagle3_default_aux_hidden_state_layers()`` and lets the target's
``set_aux_hidden_state_layers`` sort them; the drafter's ``fc`` (built on the meta
device) gives the number of taps it takes. No engine is started, no weight read.

The last test compares doctor with the live runs of the session fixture ``tap_runs``.
"""

from __future__ import annotations

import json

import pytest

from spectrace import cli, doctor

from test_doctor import DFLASH, EAGLE3, GEMMA3_1B, QWEN3_8B, SHAPES

pytestmark = pytest.mark.vllm  # doctor runs vLLM's config and model code in this process (no engine)

RUNNERS = ("v1", "v2")
V2_IDS = "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils.get_eagle3_aux_layers_from_config"
V1_IDS = "vllm.v1.worker.gpu_model_runner.GPUModelRunner._get_eagle3_aux_layers_from_config"
DEFAULT_IDS = "get_eagle3_default_aux_hidden_state_layers"
DFLASH_FC = "vllm.model_executor.models.qwen3_dflash._get_dflash_fc_input_size"
EAGLE3_FC = "vllm.model_executor.models.llama_eagle3.LlamaModel.__init__"

EAGLE3_NO_IDS = {k: v for k, v in EAGLE3.items() if k != "eagle_aux_hidden_state_layer_ids"}
MASK = {"mask_token_id": 151669}
# a Qwen3-8B-shaped target cut to 8 layers (hidden 128): vLLM's default taps are (2, 4, 5)
QWEN3_8_LAYERS = {
    **QWEN3_8B, "num_hidden_layers": 8, "max_window_layers": 8, "hidden_size": 128, "intermediate_size": 384,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
}  # fmt: skip
SMALL_DFLASH = {
    **DFLASH, "hidden_size": 128, "intermediate_size": 384, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "num_hidden_layers": 1,
}  # fmt: skip

DRAFTERS = {
    "eagle3-ids": {**EAGLE3_NO_IDS, "eagle_aux_hidden_state_layer_ids": [2, 18, 33]},
    "eagle3-no-ids": EAGLE3_NO_IDS,
    "eagle3-out-of-range": {**EAGLE3_NO_IDS, "eagle_aux_hidden_state_layer_ids": [2, 18, 40]},
    # fc sized for three (num_aux_hidden_states) while two ids are declared
    "eagle3-two-ids-fc-three": {**EAGLE3_NO_IDS, "eagle_aux_hidden_state_layer_ids": [2, 18], "num_aux_hidden_states": 3},
    # llama_eagle3 sizes fc from num_aux_hidden_states or eagle_config's ids, never the top-level ids: 3
    "eagle3-two-ids": {**EAGLE3_NO_IDS, "eagle_aux_hidden_state_layer_ids": [2, 18]},
    # ids nested in eagle_config, as SpecForge writes them (SGLang's convention: id L the output of layer L): V1 reads
    # them verbatim, V2 does not (it taps the default). [1, 17, 32]: SpecForge's default for 36 layers, written out
    "eagle3-nested-ids": {**EAGLE3_NO_IDS, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 32]}},
    # SpecForge configs/gpt-oss-20B-eagle3.json's taps (vllm#43671) on a 24-layer target
    "specforge-1-11-21": {**EAGLE3_NO_IDS, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 11, 21]}},
    # the same drafter declared as doctor's fix says: top-level vLLM ids
    "specforge-fixed": {**EAGLE3_NO_IDS, "eagle_aux_hidden_state_layer_ids": [2, 12, 22]},
    # an EAGLE3 head that takes the last hidden state only (no fc)
    "eagle3-no-aux": {**EAGLE3_NO_IDS, "eagle_config": {"use_aux_hidden_state": False}},
    "dflash-config-ids": {**DFLASH, "dflash_config": {**MASK, "target_layer_ids": [1, 17, 32]}},
    # the silent one: top-level target_layer_ids, read by V2 (+1) and ignored by V1
    "dflash-top-level-ids": {**SMALL_DFLASH, "dflash_config": dict(MASK), "target_layer_ids": [0, 3, 6]},
    "dflash-top-level-five": {**DFLASH, "dflash_config": dict(MASK), "target_layer_ids": [1, 9, 17, 25, 33]},
    # no ids: fc sized from the drafter's num_hidden_layers (5), taps the target's default (3)
    "dflash-no-ids": {**DFLASH, "dflash_config": dict(MASK)},
    # the same, and a window transformers nulls: vLLM refuses to build the drafter (SWA_DROPPED)
    "dflash-no-ids-unbuildable": {**DFLASH, **SHAPES["layer_types_no_flag"], "dflash_config": dict(MASK)},
    # dflash_config ids plus an eagle_config dict: V1's eagle_config branch overwrites the ids with None
    "dflash-ids-and-eagle-config": {**DFLASH, "eagle_config": {"use_aux_hidden_state": True}},
    "gemma3-eagle3": {
        **EAGLE3, "hidden_size": 1152, "intermediate_size": 6912, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 256, "vocab_size": 262144, "draft_vocab_size": 32000, "max_position_embeddings": 32768,
        "eagle_aux_hidden_state_layer_ids": [2, 13, 23],
    },
}  # fmt: skip
# a Qwen3-8B-shaped target with gpt-oss-20B's 24 layers: vLLM's default taps are (2, 12, 21)
QWEN3_24_LAYERS = {**QWEN3_8B, "num_hidden_layers": 24, "max_window_layers": 24}
TARGETS = {"qwen3-8b": QWEN3_8B, "qwen3-8-layers": QWEN3_8_LAYERS, "qwen3-24-layers": QWEN3_24_LAYERS, "gemma3-1b": GEMMA3_1B}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("doctor-tap-models")
    paths = {}
    for name, config in {**TARGETS, **DRAFTERS}.items():
        path = root / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config, indent=1))
        paths[name] = str(path)
    return paths


def run_json(capsys, *args: str) -> tuple[int, dict]:
    rc = cli.main(["doctor", *args, "--json"])
    out, err = capsys.readouterr()
    assert err == "", err
    return rc, json.loads(out)


def doctor_json(capsys, models, target: str, draft: str, method: str, runner: str) -> tuple[int, dict]:
    return run_json(capsys, "--target", models[target], "--draft", models[draft], "--method", method, "--runner", runner)


def tap_triples(report: dict) -> list[tuple]:
    return sorted((f["code"], f["severity"], f["caused_by"]) for f in report["findings"] if f["code"].startswith("TAP_"))


def others(report: dict) -> list[dict]:
    """The findings besides CAUSAL_INFERRED, which every DFlash drafter here gets (none declares causality)."""
    causal = [f for f in report["findings"] if f["code"] == "CAUSAL_INFERRED"]
    assert [f["severity"] for f in causal] in ([], ["info"])
    return [f for f in report["findings"] if f["code"] != "CAUSAL_INFERRED"]


def finding(report: dict, code: str) -> dict:
    return next(f for f in report["findings"] if f["code"] == code)


def ids_rule(runner: str) -> str:
    return V1_IDS if runner == "v1" else V2_IDS


# -- declared the way vLLM reads them: no finding, on either runner ------------------------


@pytest.mark.parametrize("runner", RUNNERS)
def test_eagle3_with_explicit_ids_taps_what_it_declares(capsys, models, runner):
    rc, report = doctor_json(capsys, models, "qwen3-8b", "eagle3-ids", "eagle3", runner)
    # read as vLLM ids; who trained it cannot be told (no speculators_config, no SpecForge eagle_config): said as info
    assert (rc, tap_triples(report), len(report["findings"])) == (0, [("TAP_CONVENTION", "info", None)], 1)
    convention = finding(report, "TAP_CONVENTION")
    assert convention["evidence"]["producer"] is None and convention["evidence"]["sglang_reading"] == [3, 19, 34]
    assert convention["evidence"]["settled_by"] and convention["fix"] == ""
    taps = report["taps"]
    assert set(taps) == set(doctor.TAP_KEYS)
    assert taps == {
        "declared_field": "eagle_aux_hidden_state_layer_ids", "declared_ids": [2, 18, 33],
        "expected_ids": [2, 18, 33], "tapped_ids": [2, 18, 33], "input_taps": 3, "status": "ok",
        "vllm_rule": f"{ids_rule(runner)}; fc input width: {EAGLE3_FC}",
        # Qwen3Model inherits Qwen2Model.forward: _maybe_add_hidden_state(aux, idx + 1, hidden_states, residual)
        "capture_point": "the input of layer k: the residual stream (hidden_states + residual) before its input norm",
        "capture_rule": "vllm.model_executor.models.qwen2.Qwen2Model.forward",
    }  # fmt: skip


@pytest.mark.parametrize("runner", RUNNERS)
def test_eagle3_without_ids_is_tap_defaulted(capsys, models, runner):
    rc, report = doctor_json(capsys, models, "qwen3-8b", "eagle3-no-ids", "eagle3", runner)
    assert rc == 0  # a warning
    assert tap_triples(report) == [("TAP_DEFAULTED", "info", None)]
    assert len(report["findings"]) == 1
    taps = report["taps"]
    assert (taps["declared_field"], taps["expected_ids"], taps["tapped_ids"], taps["status"]) == (
        None, None, [2, 18, 33], "defaulted")  # (2, n // 2, n - 3) for 36 layers
    defaulted = finding(report, "TAP_DEFAULTED")
    assert "[2, 18, 33]" in defaulted["message"]
    rule = defaulted["evidence"]["vllm_rule"]
    assert rule.startswith(ids_rule(runner)) and DEFAULT_IDS in rule
    assert defaulted["evidence"]["runner"] == runner


@pytest.mark.parametrize("runner", RUNNERS)
def test_dflash_config_ids_are_tapped_one_deeper(capsys, models, runner):
    rc, report = doctor_json(capsys, models, "qwen3-8b", "dflash-config-ids", "dflash", runner)
    assert (rc, others(report)) == (0, [])
    taps = report["taps"]
    assert (taps["declared_field"], taps["declared_ids"], taps["expected_ids"], taps["tapped_ids"]) == (
        "dflash_config.target_layer_ids", [1, 17, 32], [2, 18, 33], [2, 18, 33])
    assert (taps["input_taps"], taps["status"]) == (3, "ok")
    assert taps["vllm_rule"] == f"{ids_rule(runner)}; fc input width: {DFLASH_FC}"


# -- the silent mismatch: top-level target_layer_ids ---------------------------------------


def test_top_level_target_layer_ids_is_a_mismatch_on_v1_only(capsys, models):
    rc, report = doctor_json(capsys, models, "qwen3-8-layers", "dflash-top-level-ids", "dflash", "v1")
    assert rc == 1
    assert tap_triples(report) == [("TAP_MISMATCH", "error", None)]
    taps = report["taps"]
    assert (taps["declared_field"], taps["declared_ids"], taps["expected_ids"]) == ("target_layer_ids", [0, 3, 6], [1, 4, 7])
    # V1 ignores top-level target_layer_ids and taps the default, while the DFlash fc is
    # sized by the V2 function (three): same count, nothing fails, drafts are rejected
    assert (taps["tapped_ids"], taps["input_taps"], taps["status"]) == ([2, 4, 5], 3, "mismatch")
    mismatch = finding(report, "TAP_MISMATCH")
    assert "silently" in mismatch["message"]
    assert mismatch["evidence"]["vllm_rule"].startswith(V1_IDS) and DEFAULT_IDS in mismatch["evidence"]["vllm_rule"]
    assert mismatch["evidence"]["fc_rule"] == DFLASH_FC

    rc, report = doctor_json(capsys, models, "qwen3-8-layers", "dflash-top-level-ids", "dflash", "v2")
    assert (rc, tap_triples(report)) == (0, [])
    assert (report["taps"]["tapped_ids"], report["taps"]["status"]) == ([1, 4, 7], "ok")  # V2 reads it, +1


def test_readable_output_has_a_taps_section(capsys, models):
    rc = cli.main(["doctor", "--target", models["qwen3-8-layers"], "--draft", models["dflash-top-level-ids"],
                   "--method", "dflash", "--runner", "v1"])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 1 and err == ""
    section = out[out.index("Hidden-state taps (V1 model runner):"):]
    assert "declared  target_layer_ids = [0, 3, 6]" in section
    assert "expected  [1, 4, 7]" in section and "tapped    [2, 4, 5]" in section
    assert "fc input  3 tap(s)" in section and "status    mismatch" in section
    assert "ERROR   TAP_MISMATCH [draft]" in out
    # no taps section for a method whose drafter takes no hidden states
    cli.main(["doctor", "--target", models["qwen3-8b"], "--draft", models["qwen3-8b"], "--method", "draft_model"])
    out, _ = capsys.readouterr()
    assert "Hidden-state taps" not in out


# -- out of range, count mismatch ----------------------------------------------------------


@pytest.mark.parametrize("runner", RUNNERS)
def test_ids_beyond_the_target_are_out_of_range(capsys, models, runner):
    rc, report = doctor_json(capsys, models, "qwen3-8b", "eagle3-out-of-range", "eagle3", runner)
    assert rc == 1
    assert tap_triples(report) == [("TAP_OUT_OF_RANGE", "error", None)]
    assert not any(f["code"] == "LOAD_FAILED" for f in report["findings"])  # vLLM builds it
    assert (report["taps"]["tapped_ids"], report["taps"]["status"]) == ([2, 18, 40], "out_of_range")
    assert "[40]" in finding(report, "TAP_OUT_OF_RANGE")["message"]


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("draft", ["eagle3-two-ids-fc-three", "eagle3-two-ids"])
def test_eagle3_fc_sized_for_three_with_two_ids_is_count_mismatch(capsys, models, runner, draft):
    """vLLM 0.32 builds this pair (no build-time check compares fc with the taps); it fails
    at the first forward. So the faithful report is TAP_COUNT_MISMATCH, not LOAD_FAILED."""
    rc, report = doctor_json(capsys, models, "qwen3-8b", draft, "eagle3", runner)
    assert rc == 1
    assert [(f["code"], f["severity"], f["caused_by"]) for f in report["findings"]] == [("TAP_COUNT_MISMATCH", "error", None)]
    taps = report["taps"]
    assert (taps["expected_ids"], taps["tapped_ids"], taps["input_taps"], taps["status"]) == (
        [2, 18], [2, 18], 3, "count_mismatch")
    assert finding(report, "TAP_COUNT_MISMATCH")["evidence"]["fc_rule"] == EAGLE3_FC


@pytest.mark.parametrize("runner", RUNNERS)
def test_dflash_without_ids_sizes_fc_by_its_own_layers(capsys, models, runner):
    rc, report = doctor_json(capsys, models, "qwen3-8b", "dflash-no-ids", "dflash", runner)
    assert rc == 1
    assert tap_triples(report) == [("TAP_COUNT_MISMATCH", "error", None), ("TAP_DEFAULTED", "info", None)]
    assert (report["taps"]["tapped_ids"], report["taps"]["input_taps"]) == ([2, 18, 33], 5)


def test_a_drafter_that_does_not_build_is_sized_from_its_config(capsys, models):
    """V2 builds the target and sets its taps, then fails on the drafter: the fc width comes
    from vLLM's own sizing function on the config, and the count mismatch is still found."""
    rc, report = doctor_json(capsys, models, "qwen3-8b", "dflash-no-ids-unbuildable", "dflash", "v2")
    assert rc == 1
    load = finding(report, "LOAD_FAILED")
    assert (load["caused_by"], load["evidence"]["phase"]) == ("SWA_DROPPED", "building the draft model")
    assert tap_triples(report) == [("TAP_COUNT_MISMATCH", "error", None), ("TAP_DEFAULTED", "info", None)]
    assert (report["taps"]["tapped_ids"], report["taps"]["input_taps"]) == ([2, 18, 33], 5)
    assert report["taps"]["vllm_rule"].endswith(f"fc input width: {DFLASH_FC}")


def test_five_top_level_ids_on_v1_is_a_count_mismatch(capsys, models):
    rc, report = doctor_json(capsys, models, "qwen3-8b", "dflash-top-level-five", "dflash", "v1")
    assert rc == 1
    assert tap_triples(report) == [("TAP_COUNT_MISMATCH", "error", None), ("TAP_MISMATCH", "info", "TAP_COUNT_MISMATCH")]
    assert (report["taps"]["tapped_ids"], report["taps"]["input_taps"]) == ([2, 18, 33], 5)
    rc, report = doctor_json(capsys, models, "qwen3-8b", "dflash-top-level-five", "dflash", "v2")
    assert (rc, others(report), report["taps"]["tapped_ids"]) == (0, [], [2, 10, 18, 26, 34])


# -- where the two runners' resolvers differ -------------------------------------------------


def test_specforge_ids_are_read_one_layer_early_by_v1(capsys, models):
    """SpecForge's nested ids are in SGLang's convention (id L: the output of layer L): trained on vLLM taps
    [2, 18, 33]. V1 reads them verbatim, one layer early on every tap; V2 does not read them and taps its default,
    which is SpecForge's own default written out, so right by coincidence (#58, vllm#43671)."""
    rc, report = doctor_json(capsys, models, "qwen3-8b", "eagle3-nested-ids", "eagle3", "v1")
    assert rc == 1 and tap_triples(report) == [("TAP_CONVENTION", "error", None), ("TAP_MISMATCH", "info", "TAP_CONVENTION")]
    assert (report["taps"]["expected_ids"], report["taps"]["tapped_ids"]) == ([2, 18, 33], [1, 17, 32])
    convention = finding(report, "TAP_CONVENTION")
    assert convention["evidence"]["producer"] == "specforge" and convention["evidence"]["ids_to_declare"] == [2, 18, 33]
    assert convention["fix"].startswith('declare "eagle_aux_hidden_state_layer_ids": [2, 18, 33] at the top level')
    assert "one layer early on every tap" in convention["message"] and "SGLang" in convention["message"]
    assert finding(report, "TAP_MISMATCH")["fix"] == ""
    rc, report = doctor_json(capsys, models, "qwen3-8b", "eagle3-nested-ids", "eagle3", "v2")
    assert (rc, report["findings"], report["taps"]["tapped_ids"], report["taps"]["status"]) == (0, [], [2, 18, 33], "ok")


def test_specforge_gpt_oss_taps_are_off_on_both_runners_and_the_fix_is_quiet(capsys, models):
    """SpecForge's gpt-oss-20B drafter declares [1, 11, 21] (trained on vLLM taps [2, 12, 22]): V1 taps [1, 11, 21],
    one layer early on every tap; V2 taps its default (2, 12, 21), the third one layer early. Declared as the fix says
    (top-level vLLM ids), both runners tap what it was trained on."""
    rc, report = doctor_json(capsys, models, "qwen3-24-layers", "specforge-1-11-21", "eagle3", "v1")
    assert rc == 1 and tap_triples(report) == [("TAP_CONVENTION", "error", None), ("TAP_MISMATCH", "info", "TAP_CONVENTION")]
    assert (report["taps"]["expected_ids"], report["taps"]["tapped_ids"]) == ([2, 12, 22], [1, 11, 21])
    rc, report = doctor_json(capsys, models, "qwen3-24-layers", "specforge-1-11-21", "eagle3", "v2")
    assert rc == 1 and tap_triples(report) == [("TAP_MISMATCH", "error", None)]
    assert (report["taps"]["expected_ids"], report["taps"]["tapped_ids"]) == ([2, 12, 22], [2, 12, 21])
    mismatch = finding(report, "TAP_MISMATCH")
    assert mismatch["fix"].startswith('declare "eagle_aux_hidden_state_layer_ids": [2, 12, 22] at the top level')
    assert "SGLang" in mismatch["message"] and mismatch["evidence"]["producer"] == "specforge"
    for runner in RUNNERS:
        rc, report = doctor_json(capsys, models, "qwen3-24-layers", "specforge-fixed", "eagle3", runner)
        assert (rc, report["taps"]["tapped_ids"], report["taps"]["status"]) == (0, [2, 12, 22], "ok")
        assert [f["severity"] for f in report["findings"]] == ["info"]  # the producer, no longer told: TAP_CONVENTION


@pytest.mark.parametrize("runner", RUNNERS)
def test_speculators_ids_are_vllm_taps_by_construction(capsys, runner):
    """A speculators-format drafter (the zoo's, trained by speculators 0.9.0): its ids are vLLM taps, no doubt said."""
    from published_corpus import ZOO

    rc, report = run_json(capsys, "--target", str(ZOO / "target"), "--draft", str(ZOO / "eagle3"), "--method", "eagle3",
                          "--runner", runner)
    assert (rc, report["findings"]) == (0, [])
    taps = report["taps"]
    assert (taps["declared_ids"], taps["expected_ids"], taps["tapped_ids"], taps["status"]) == ([1, 2, 3], [1, 2, 3], [1, 2, 3], "ok")


def test_an_eagle_config_dict_hides_dflash_ids_from_v1(capsys, models):
    rc, report = doctor_json(capsys, models, "qwen3-8b", "dflash-ids-and-eagle-config", "dflash", "v1")
    assert rc == 1
    assert tap_triples(report) == [("TAP_COUNT_MISMATCH", "error", None), ("TAP_MISMATCH", "info", "TAP_COUNT_MISMATCH")]
    assert (report["taps"]["expected_ids"], report["taps"]["tapped_ids"]) == ([2, 10, 18, 26, 34], [2, 18, 33])
    rc, report = doctor_json(capsys, models, "qwen3-8b", "dflash-ids-and-eagle-config", "dflash", "v2")
    assert (rc, others(report), report["taps"]["status"]) == (0, [], "ok")


# -- where taps do not apply, or vLLM refuses ------------------------------------------------


def test_no_taps_for_drafters_that_take_no_hidden_states(capsys, models):
    for runner in RUNNERS:
        rc, report = doctor_json(capsys, models, "qwen3-8b", "eagle3-no-aux", "eagle3", runner)
        assert (rc, report["taps"], report["findings"]) == (0, None, [])
    rc, report = run_json(capsys, "--target", models["qwen3-8b"], "--draft", models["qwen3-8b"], "--method", "draft_model")
    assert (rc, report["taps"], report["findings"]) == (0, None, [])


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_target_without_the_eagle3_interface_is_refused(capsys, models, runner):
    rc, report = doctor_json(capsys, models, "gemma3-1b", "gemma3-eagle3", "eagle3", runner)
    assert rc == 1 and report["taps"] is None
    load = finding(report, "LOAD_FAILED")
    assert (load["severity"], load["model_role"]) == ("error", "target")
    assert "does not support EAGLE3 interface" in load["message"]
    assert load["evidence"]["phase"] == "setting the target's hidden-state taps"
    assert load["evidence"]["vllm_rule"] == doctor.TAP_SETTER[runner]


def test_every_tap_finding_names_its_vllm_rule(capsys, models):
    cases = [("qwen3-8b", "eagle3-no-ids", "eagle3"), ("qwen3-8-layers", "dflash-top-level-ids", "dflash"),
             ("qwen3-8b", "eagle3-two-ids", "eagle3"), ("qwen3-8b", "eagle3-out-of-range", "eagle3")]  # fmt: skip
    for target, draft, method in cases:
        _, report = doctor_json(capsys, models, target, draft, method, "v1")
        taps = [f for f in report["findings"] if f["code"].startswith("TAP_")]
        assert taps
        for f in taps:
            assert f["evidence"]["vllm_rule"].startswith("vllm."), f
            assert f["evidence"]["fc_rule"].startswith("vllm."), f
            assert f["component"] == "taps" and f["model_role"] == "draft"


# -- doctor and a live run agree --------------------------------------------------------------


@pytest.mark.vllm
def test_doctor_agrees_with_live_tap_runs(tap_runs, capsys):
    """Each tap_runs pair served live on the CPU build (V1 runner) vs doctor --runner v1."""
    con, results, paths = tap_runs
    assert set(results) == {"eagle3_ids", "eagle3_noids", "dflash_top_level"}
    for name, result in results.items():
        assert result.ok and result.run_id, (name, result.error)
        target, method, k, runner = con.execute(
            "select target_model, method, num_speculative_tokens, model_runner from runs where run_id = ?",
            [result.run_id],
        ).fetchone()
        assert runner == "v1"
        rc, report = run_json(capsys, "--target", target, "--draft", str(paths[name]), "--method", method,
                              "--runner", "v1", "--num-speculative-tokens", str(k))  # fmt: skip
        row = con.execute(
            "select declared_field, declared_ids, expected_ids, tapped_ids, input_taps, status "
            "from hidden_state_taps where run_id = ?",
            [result.run_id],
        ).fetchone()
        field, declared, expected, tapped, inputs, status = row
        live = {"declared_field": field, "declared_ids": json.loads(declared), "expected_ids": json.loads(expected),
                "tapped_ids": json.loads(tapped), "input_taps": inputs, "status": status}  # fmt: skip
        mine = {key: report["taps"][key] for key in live}
        assert mine == live, name
        live_codes = sorted(
            tuple(r) for r in con.execute(
                "select code, severity, caused_by from findings where run_id = ? and code like 'TAP_%'", [result.run_id]
            ).fetchall()
        )  # fmt: skip
        assert tap_triples(report) == live_codes, name
