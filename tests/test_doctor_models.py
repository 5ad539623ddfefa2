"""`spectrace doctor` on the drafter's model against the target's (issue #24): RoPE and dtype from
config.json alone, the weights from the safetensors headers (vLLM's own ``load_weights`` dry-run on
meta tensors of the header shapes). Real vLLM 0.32 code in this process; no engine, no tensor data.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from spectrace import doctor
from test_doctor import DFLASH, EAGLE3, QWEN3_8B, finding, run, run_json, triples

pytestmark = pytest.mark.vllm

MISSING = "midlayer.mlp.down_proj.weight"


def _dir(root, name, config):
    path = root / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    root = tmp_path_factory.mktemp("doctor-model-configs")
    paths = {
        "qwen3-8b": QWEN3_8B,
        "qwen3-8b-fp16": {**QWEN3_8B, "torch_dtype": "float16"},
        "eagle3": EAGLE3,
        # transformers 5 spelling: the same base, under rope_parameters
        "eagle3-v5": {**{k: v for k, v in EAGLE3.items() if k != "rope_theta"},
                      "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}},
        # a converted drafter whose base fell back to 10000
        "eagle3-theta-10k": {**EAGLE3, "rope_theta": 10000.0},
        "dflash": {**DFLASH, "layer_types": ["full_attention"] * 5},
        "dflash-theta-10k": {**DFLASH, "layer_types": ["full_attention"] * 5, "rope_theta": 10000.0},
    }
    return {name: _dir(root, name, config) for name, config in paths.items()}


def test_a_drafter_with_another_rotary_base_is_rope_mismatch_from_config_alone(capsys, configs):
    # DFlash's trainers build the drafter's RoPE from the target's config: another base misstates the training
    rc, report = run_json(capsys, "--target", configs["qwen3-8b"], "--draft", configs["dflash-theta-10k"], "--method", "dflash")
    assert (rc, triples(report)) == (1, [("CAUSAL_INFERRED", "info", None), ("ROPE_MISMATCH", "error", None)])
    rope = finding(report, "ROPE_MISMATCH")
    assert rope["evidence"]["differs"] == ["theta"] and rope["evidence"]["vllm_rule"] == doctor.RULE_ROPE
    assert (rope["evidence"]["target"]["theta"], rope["evidence"]["draft"]["theta"]) == (1000000.0, 10000.0)
    assert '"rope_theta": 1000000.0' in rope["fix"]
    assert report["models"]["draft"]["rope"]["theta"] == 10000.0
    # an EAGLE-3 drafter gets a base of its own from its trainer (the EAGLE-3 reference's 10000): info, no error
    rc, report = run_json(capsys, "--target", configs["qwen3-8b"], "--draft", configs["eagle3-theta-10k"], "--method", "eagle3")
    # (TAP_CONVENTION info: top-level ids, the producer cannot be told, #58)
    assert (rc, triples(report)) == (0, [("ROPE_DIFFERS", "info", None), ("TAP_CONVENTION", "info", None)])
    assert finding(report, "ROPE_DIFFERS")["evidence"]["differs"] == ["theta"]
    # the same base in either spelling agrees
    for draft in ("eagle3", "eagle3-v5"):
        rc, report = run_json(capsys, "--target", configs["qwen3-8b"], "--draft", configs[draft], "--method", "eagle3")
        assert (rc, triples(report)) == (0, [("TAP_CONVENTION", "info", None)]), draft  # no RoPE finding


def test_a_bf16_drafter_next_to_an_fp16_target_is_dtype_lossy(capsys, configs, tmp_path):
    # config.json alone says bfloat16: trainers leave it stale, so info, naming what settles it
    rc, report = run_json(capsys, "--target", configs["qwen3-8b-fp16"], "--draft", configs["dflash"], "--method", "dflash")
    assert rc == 0 and ("DRAFT_DTYPE_LOSSY", "info", None) in triples(report)
    assert finding(report, "DRAFT_DTYPE_LOSSY")["evidence"]["trained_from"] == "config"
    # the checkpoint's tensors say bfloat16 too (a safetensors header is all doctor reads): an error
    drafter = tmp_path / "dflash-bf16"
    drafter.mkdir()
    (drafter / "config.json").write_text(Path(configs["dflash"], "config.json").read_text())
    header = json.dumps({"fc.weight": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}}).encode()
    (drafter / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0\0")
    rc, report = run_json(capsys, "--target", configs["qwen3-8b-fp16"], "--draft", str(drafter), "--method", "dflash")
    assert rc == 1 and ("DRAFT_DTYPE_LOSSY", "error", None) in triples(report)
    lossy = finding(report, "DRAFT_DTYPE_LOSSY")
    assert lossy["evidence"]["trained_from"] == "checkpoint"
    assert (lossy["evidence"]["declared_dtype"], lossy["evidence"]["runs_in"]) == ("bfloat16", "float16")
    assert lossy["evidence"]["vllm_rule"] == doctor.RULE_DRAFT_DTYPE and "--dtype bfloat16" in lossy["fix"]
    assert (report["models"]["draft"]["declared_dtype"], report["models"]["draft"]["runs_in"]) == ("bfloat16", "float16")
    # its bf16 twin: nothing about dtype
    rc, report = run_json(capsys, "--target", configs["qwen3-8b"], "--draft", configs["dflash"], "--method", "dflash")
    assert not [f for f in report["findings"] if f["code"] == "DRAFT_DTYPE_LOSSY"]
    assert report["models"]["draft"]["checkpoint"]["error"].endswith("no *.safetensors files")  # config.json only


# -- weights: the safetensors headers of real (tiny) checkpoints ---------------------------


@pytest.fixture(scope="module")
def checkpoints(zoo, tmp_path_factory):
    from spectrace.testing.models import derive_model

    root = tmp_path_factory.mktemp("doctor-checkpoints")
    missing = derive_model(root / "eagle3-missing", zoo["eagle3"], drop_tensors=[MISSING])
    hostile = derive_model(root / "eagle3-hostile", zoo["eagle3"])
    raw = (hostile / "model.safetensors").read_bytes()
    (hostile / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + raw[8:])  # a header length of 1 TB
    return {**zoo, "eagle3_missing": str(missing), "eagle3_hostile": str(hostile)}


def test_a_tensor_missing_from_the_drafter_checkpoint_is_found_by_a_dry_load(capsys, checkpoints):
    rc, report = run_json(capsys, "--target", checkpoints["target"], "--draft", checkpoints["eagle3_missing"],
                          "--method", "eagle3", "--runner", "v1")
    assert (rc, triples(report)) == (1, [("DRAFT_WEIGHTS_UNLOADED", "error", None), ("TAP_CONVENTION", "info", None)])
    unloaded = finding(report, "DRAFT_WEIGHTS_UNLOADED")
    assert unloaded["evidence"]["unloaded"] == ["model.layers.0.mlp.down_proj.weight"]  # what the live worker names
    assert unloaded["evidence"]["shared_with_target"] == {"embed_tokens": "target", "lm_head": "target"}
    assert unloaded["evidence"]["vllm_rule"] == doctor.RULE_WEIGHTS
    draft = report["models"]["draft"]
    assert draft["dry_load"] == "ok" and draft["checkpoint"]["tensors"] == 11 and draft["checkpoint"]["dtypes"] == {"F32": 11}


@pytest.mark.parametrize("name, method", [("eagle3", "eagle3"), ("dflash", "dflash"), ("draft_seeded", "draft_model"), ("mtp", "mtp")])
def test_healthy_checkpoints_load_completely(capsys, checkpoints, name, method):
    target = checkpoints["mtp" if method == "mtp" else "target"]
    rc, report = run_json(capsys, "--target", target, "--draft", checkpoints[name], "--method", method, "--runner", "v1")
    assert [f for f in report["findings"] if f["component"] in ("weights", "rope", "dtype")] == [], name
    draft = report["models"]["draft"]
    assert draft["dry_load"] == "ok" and draft["loaded"] > 0, (name, draft)
    assert draft["checkpoint"]["error"] is None and report["models"]["target"]["checkpoint"]["tensors"] > 0


def test_a_hostile_safetensors_header_is_a_line_not_a_crash(capsys, checkpoints):
    rc, out, err = run(capsys, "--target", checkpoints["target"], "--draft", checkpoints["eagle3_hostile"], "--method", "eagle3")
    assert err == "" and "Traceback" not in out
    assert "header length 1099511627776 exceeds the file" in out and "dry load: not run" in out
    assert rc == 0  # nothing judged without a manifest; the configs are fine
