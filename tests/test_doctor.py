"""`spectrace doctor` on config.json files alone, with the installed vLLM's own rules.

Every test here runs real vLLM 0.32 code (config resolution, SpeculativeConfig,
VllmConfig validation, model classes built on the meta device) in this process; none
starts an engine or reads a weight. The model directories hold nothing but config.json,
in realistic shapes (a Qwen3-8B target and drafters for it).

The last test compares doctor with the live runs of the session fixture ``audit_runs``.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spectrace import cli, doctor

pytestmark = pytest.mark.vllm  # doctor runs vLLM's config and model code in this process (no engine)

S, F = "sliding_attention", "full_attention"
WINDOW = 2048
MIXED = [S, S, S, S, F]

QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 40960,
    "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}  # fmt: skip
# YaRN the way transformers reads it: max_position_embeddings is the scaled context
QWEN3_8B_YARN = {
    **QWEN3_8B,
    "max_position_embeddings": 131072,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
}
QWEN3_06B = {**QWEN3_8B, "hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16,
             "num_hidden_layers": 28, "max_window_layers": 28, "tie_word_embeddings": True}  # fmt: skip
LLAMA_32_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 128000, "eos_token_id": 128001,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 16, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": 128256,
}  # fmt: skip
EAGLE3 = {
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 12288, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "num_hidden_layers": 1, "vocab_size": 151936, "draft_vocab_size": 32000, "max_position_embeddings": 40960,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "hidden_act": "silu", "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151645, "attention_bias": False,
    "eagle_aux_hidden_state_layer_ids": [2, 18, 33],
}  # fmt: skip
GEMMA3_1B = {
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 2,
    "cache_implementation": "hybrid", "eos_token_id": [1, 106], "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "intermediate_size": 6912,
    "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
    "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16", "vocab_size": 262144,
}  # fmt: skip
# a 5-layer DFlash drafter for Qwen3-8B (z-lab layout: Qwen3 layers, dflash_config)
DFLASH = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 5,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000, "rms_norm_eps": 1e-06,
    "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False, "dtype": "bfloat16",
    "block_size": 16, "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
}  # fmt: skip
SHAPES = {
    "layer_types_no_flag": {"layer_types": MIXED, "sliding_window": WINDOW},
    "window_only": {"sliding_window": WINDOW},
    "flagged": {"layer_types": MIXED, "sliding_window": WINDOW, "use_sliding_window": True},
    "swa_window_size": {"layer_types": MIXED, "dflash_config": {**DFLASH["dflash_config"], "swa_window_size": WINDOW}},
}
SLIDES = [("sliding", WINDOW)] * 4 + [("full", None)]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("doctor-models")
    configs = {
        "qwen3-8b": QWEN3_8B,
        "qwen3-8b-yarn": QWEN3_8B_YARN,
        "qwen3-0.6b": QWEN3_06B,
        "llama-3.2-1b": LLAMA_32_1B,
        "qwen3-8b-eagle3": EAGLE3,
        "gemma3-1b": GEMMA3_1B,
        # a DFlash drafter in a directory without "dflash" in its name
        "qwen3-8b-drafter": {**DFLASH, **SHAPES["flagged"]},
        **{f"qwen3-8b-dflash-{name}": {**DFLASH, **shape} for name, shape in SHAPES.items()},
    }
    paths = {}
    for name, config in configs.items():
        path = root / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config, indent=1))
        paths[name] = str(path)
    return paths


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli.main(["doctor", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys, *args: str) -> tuple[int, dict]:
    rc, out, err = run(capsys, *args, "--json")
    assert err == "", err  # vLLM's log noise stays silent
    return rc, json.loads(out)


def triples(report: dict) -> list[tuple]:
    return sorted((f["code"], f["severity"], f["caused_by"]) for f in report["findings"])


def layout(report: dict, role: str = "draft", what: str = "runtime") -> list[tuple]:
    return [(row[f"{what}_type"], row[f"{what}_window"]) for row in report["layout"][role]]


def finding(report: dict, code: str) -> dict:
    return next(f for f in report["findings"] if f["code"] == code)


# -- the four DFlash shapes --------------------------------------------------------------

V2_EXPECTED = {
    "layer_types_no_flag": [
        ("FIELD_CHANGED", "info", "SWA_DROPPED"),
        ("LOAD_FAILED", "info", "SWA_DROPPED"),
        ("SWA_DROPPED", "error", None),
    ],
    "window_only": [
        ("CAUSAL_INFERRED", "info", None),  # no layer_types declared: vLLM makes no layer causal
        ("FIELD_CHANGED", "info", "SWA_DROPPED"),
        ("LAYER_TYPES_DEFAULTED", "info", "SWA_DROPPED"),
        ("LAYOUT_MISMATCH", "info", "SWA_DROPPED"),
        ("SWA_DROPPED", "error", None),
    ],
    "flagged": [("CAUSAL_INFERRED", "info", None)],  # no causality declared: vLLM infers it per layer
    "swa_window_size": [("CAUSAL_INFERRED", "info", None)],
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_dflash_shapes_on_the_v2_runner(capsys, models, shape):
    rc, report = run_json(
        capsys, "--target", models["qwen3-8b"], "--draft", models[f"qwen3-8b-dflash-{shape}"], "--method", "dflash"
    )
    assert report["runner"] == "v2"  # the default
    assert triples(report) == V2_EXPECTED[shape]
    assert rc == (1 if any(severity == "error" for _, severity, _ in V2_EXPECTED[shape]) else 0)
    draft = report["layout"]["draft"]
    assert len(draft) == 5
    assert set(draft[0]) >= {"layer_index", "declared_type", "declared_window", "resolved_type", "resolved_window",
                             "runtime_type", "runtime_window"}  # fmt: skip
    assert report["rules"]["draft"] == doctor.RULE_DFLASH
    # the target is built too: 36 full-attention layers
    assert layout(report, "target") == [("full", None)] * 36
    if shape == "layer_types_no_flag":
        assert finding(report, "FIELD_CHANGED")["evidence"]["field"] == "sliding_window"
        load = finding(report, "LOAD_FAILED")
        assert "requires a window size" in load["message"] and "use_sliding_window" in load["message"]
        assert load["evidence"]["vllm_rule"] == doctor.RULE_DFLASH
        assert layout(report, what="declared") == SLIDES
        assert layout(report) == [(None, None)] * 5  # vLLM never built it
    elif shape == "window_only":
        assert layout(report, what="declared") == [("unspecified", WINDOW)] * 5
        assert layout(report, what="resolved") == layout(report) == [("full", None)] * 5
        assert finding(report, "LAYOUT_MISMATCH")["evidence"]["vllm_rule"] == doctor.RULE_DFLASH
        assert finding(report, "SWA_DROPPED")["evidence"]["vllm_rule"] == doctor.RULE_GET_CONFIG
    else:
        assert layout(report, what="declared") == layout(report, what="resolved") == layout(report) == SLIDES
        assert [row["causal"] for row in draft] == [True] * 4 + [False]
        assert [row["kv_cache_spec"] for row in draft] == ["SlidingWindowSpec"] * 4 + ["FullAttentionSpec"]


def test_v1_runner_refuses_mixed_drafters_as_a_finding_that_names_v2(capsys, models):
    for shape in ("flagged", "swa_window_size"):
        rc, report = run_json(
            capsys, "--target", models["qwen3-8b"], "--draft", models[f"qwen3-8b-dflash-{shape}"],
            "--method", "dflash", "--runner", "v1",
        )  # fmt: skip
        assert rc == 1 and report["runner"] == "v1"
        assert triples(report) == [("LOAD_FAILED", "error", None)]
        load = finding(report, "LOAD_FAILED")
        assert load["evidence"]["needs_runner"] == "v2"
        assert "needs the V2 model runner" in load["message"] and "V2" in load["fix"]
        assert load["evidence"]["vllm_rule"] == "vllm.config.vllm.VllmConfig._validate_v1_model_runner"
        assert layout(report, what="declared") == SLIDES and layout(report) == [(None, None)] * 5
    # the nulled window is a second, independent root cause on V1
    rc, report = run_json(
        capsys, "--target", models["qwen3-8b"], "--draft", models["qwen3-8b-dflash-layer_types_no_flag"],
        "--method", "dflash", "--runner", "v1",
    )  # fmt: skip
    assert triples(report) == [
        ("FIELD_CHANGED", "info", "SWA_DROPPED"),
        ("LOAD_FAILED", "error", None),
        ("SWA_DROPPED", "error", None),
    ]
    # an all-full drafter runs on V1 as on V2
    rc, report = run_json(
        capsys, "--target", models["qwen3-8b"], "--draft", models["qwen3-8b-dflash-window_only"],
        "--method", "dflash", "--runner", "v1",
    )  # fmt: skip
    assert triples(report) == V2_EXPECTED["window_only"] and layout(report) == [("full", None)] * 5


# -- the other codes ----------------------------------------------------------------------


def test_dflash_drafter_in_a_plain_directory_without_method_is_method_mismatch(capsys, models):
    rc, report = run_json(capsys, "--target", models["qwen3-8b"], "--draft", models["qwen3-8b-drafter"])
    assert rc == 1
    assert report["method"] == "draft_model" and report["method_given"] is False  # vLLM's own inference
    assert triples(report) == [
        ("CAUSAL_INFERRED", "info", None),  # vLLM still builds the DFlash class, inferring causality
        ("METHOD_INFERRED", "info", "METHOD_MISMATCH"),
        ("METHOD_MISMATCH", "error", None),
    ]
    mismatch = finding(report, "METHOD_MISMATCH")
    assert mismatch["evidence"]["vllm_rule"] == doctor.RULE_SPEC
    assert '"method": "dflash"' in mismatch["fix"]
    # given the method, the same directory has only the causality vLLM had to infer
    rc, report = run_json(capsys, "--target", models["qwen3-8b"], "--draft", models["qwen3-8b-drafter"], "--method", "dflash")
    assert (rc, triples(report)) == (0, [("CAUSAL_INFERRED", "info", None)])


def test_dflash_drafter_declaring_no_causality_is_causal_inferred(capsys, models, tmp_path):
    rc, report = run_json(
        capsys, "--target", models["qwen3-8b"], "--draft", models["qwen3-8b-dflash-flagged"], "--method", "dflash"
    )
    inferred = finding(report, "CAUSAL_INFERRED")
    # info: vLLM's fallback is the published drafters' convention (a collapse in a run raises it: test_run_judge)
    assert inferred["severity"] == "info" and rc == 0 and inferred["evidence"]["settled_by"]
    assert inferred["evidence"]["causal_by_layer"] == [True] * 4 + [False]  # sliding layers causal: vLLM's rule
    assert inferred["evidence"]["from"] == "runtime"  # read off the layers doctor built
    assert "layers [0, 1, 2, 3] causal" in inferred["message"]
    assert inferred["evidence"]["vllm_rule"] == "vllm.model_executor.models.qwen3_dflash._dflash_layer_causal"
    # declared: nothing to infer
    declared = tmp_path / "qwen3-8b-dflash-causal"
    declared.mkdir()
    config = {**DFLASH, **SHAPES["flagged"], "dflash_config": {**DFLASH["dflash_config"], "causal": True}}
    (declared / "config.json").write_text(json.dumps(config))
    rc, report = run_json(capsys, "--target", models["qwen3-8b"], "--draft", str(declared), "--method", "dflash")
    assert (rc, triples(report)) == (0, [])
    assert [row["causal"] for row in report["layout"]["draft"]] == [True] * 5


def test_draft_model_with_another_vocabulary_is_vocab_mismatch(capsys, models):
    rc, report = run_json(
        capsys, "--target", models["qwen3-8b"], "--draft", models["llama-3.2-1b"], "--method", "draft_model"
    )
    assert rc == 1
    assert triples(report) == [
        ("LOAD_FAILED", "info", "VOCAB_MISMATCH"),
        ("ROPE_DIFFERS", "info", None),  # an independent drafter's own RoPE (llama3 scaling): named, not an error
        ("VOCAB_MISMATCH", "error", None),
    ]
    vocab = finding(report, "VOCAB_MISMATCH")
    assert (vocab["evidence"]["target_vocab_size"], vocab["evidence"]["draft_vocab_size"]) == (151936, 128256)
    assert vocab["evidence"]["vllm_rule"] == doctor.RULE_DRAFT_VOCAB
    load = finding(report, "LOAD_FAILED")
    assert "same vocabulary size" in load["message"]  # vLLM's own refusal, in one line
    assert "ValidationError" not in load["message"]
    assert load["evidence"]["vllm_rule"] == doctor.RULE_DRAFT_VOCAB


def test_yarn_target_with_a_plain_drafter_is_draft_context_short(capsys, models):
    rc, report = run_json(
        capsys, "--target", models["qwen3-8b-yarn"], "--draft", models["qwen3-8b-dflash-flagged"], "--method", "dflash"
    )
    # the drafter reads the target's positions without the target's YaRN: a RoPE mismatch (issue #24)
    assert rc == 1
    assert triples(report) == [
        ("CAUSAL_INFERRED", "info", None), ("DRAFT_CONTEXT_SHORT", "warning", None), ("ROPE_MISMATCH", "error", None),
    ]
    assert finding(report, "ROPE_MISMATCH")["evidence"]["differs"] == ["rope_type", "factor", "original_max_position_embeddings"]
    assert report["max_model_len"] == 131072  # vLLM's derivation (YaRN: already scaled)
    short = finding(report, "DRAFT_CONTEXT_SHORT")
    assert short["evidence"]["target_context"] == 131072
    assert short["evidence"]["vllm_rule"] == doctor.RULE_MAX_LEN
    # capped the way vLLM would be served: the context is no longer short, the rotation still differs
    rc, report = run_json(
        capsys, "--target", models["qwen3-8b-yarn"], "--draft", models["qwen3-8b-dflash-flagged"],
        "--method", "dflash", "--max-model-len", "32768",
    )  # fmt: skip
    assert (rc, triples(report), report["max_model_len"]) == (
        1, [("CAUSAL_INFERRED", "info", None), ("ROPE_MISMATCH", "error", None)], 32768,
    )


def test_eagle3_with_a_reduced_draft_vocabulary_is_clean(capsys, models):
    for runner in ("v2", "v1"):
        rc, report = run_json(
            capsys, "--target", models["qwen3-8b"], "--draft", models["qwen3-8b-eagle3"],
            "--method", "eagle3", "--runner", runner,
        )  # fmt: skip
        # top-level ids of a drafter whose producer cannot be told: their convention said as info (#58)
        assert (rc, [(f["code"], f["severity"]) for f in report["findings"]]) == (0, [("TAP_CONVENTION", "info")])
        assert layout(report) == [("full", None)]
        assert "Eagle3LlamaForCausalLM" in report["rules"]["draft"]
        assert (report["taps"]["tapped_ids"], report["taps"]["status"]) == ([2, 18, 33], "ok")


def test_qwen3_draft_model_for_a_qwen3_target_is_clean(capsys, models):
    rc, report = run_json(capsys, "--target", models["qwen3-8b"], "--draft", models["qwen3-0.6b"], "--method", "draft_model")
    assert (rc, report["findings"]) == (0, [])
    assert layout(report) == [("full", None)] * 28 and layout(report, "target") == [("full", None)] * 36


def test_token_budget_below_a_full_batch_of_drafts_is_token_budget_short(capsys, models):
    """draft_model, k 3: a decoding request takes 1 + 3 tokens and 1 drafting slot of max_num_batched_tokens."""
    args = ["--target", models["qwen3-8b"], "--draft", models["qwen3-0.6b"], "--method", "draft_model",
            "--num-speculative-tokens", "3", "--max-model-len", "1024", "--max-num-seqs", "256"]
    rc, report = run_json(capsys, *args, "--max-num-batched-tokens", "1024")
    assert (rc, triples(report)) == (0, [("TOKEN_BUDGET_SHORT", "warning", None)])
    f = finding(report, "TOKEN_BUDGET_SHORT")
    assert (f["evidence"]["needed"], f["evidence"]["full_draft_requests"], f["evidence"]["drafting_slots"]) == (1280, 204, 1)
    assert f["evidence"]["vllm_rule"].startswith("vllm.v1.core.sched.scheduler.Scheduler.schedule")
    assert "--max-num-batched-tokens to at least 1280" in f["fix"]
    assert report["scheduler"]["given"] == ["max_num_batched_tokens", "max_num_seqs"]
    assert (report["scheduler"]["max_num_seqs"], report["scheduler"]["max_num_batched_tokens"]) == (256, 1024)
    # the healthy twin: the budget fits a full batch
    rc, report = run_json(capsys, *args, "--max-num-batched-tokens", "1280")
    assert (rc, report["findings"]) == (0, [])


def test_scheduler_defaults_are_vllm_serves_and_said_to_be_this_machines(capsys, models):
    """Without --max-num-seqs / --max-num-batched-tokens the rule judges `vllm serve`'s defaults (its usage
    context, not an engine built in Python's), and the text says they are this machine's platform's."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    tokens, seqs = (d[UsageContext.OPENAI_API_SERVER] for d in EngineArgs.get_batch_defaults(world_size=1))
    args = ["--target", models["qwen3-8b"], "--draft", models["qwen3-0.6b"], "--method", "draft_model"]
    rc, report = run_json(capsys, *args)
    assert report["scheduler"]["given"] == []
    assert (report["scheduler"]["max_num_seqs"], report["scheduler"]["max_num_batched_tokens"]) == (seqs, tokens)
    rc, out, _ = run(capsys, *args, "--max-num-seqs", "64")
    line = next(line for line in out.splitlines() if line.startswith("  scheduler "))
    assert f"max_num_seqs 64, max_num_batched_tokens {tokens} (default)" in line
    assert "pass --max-num-seqs and --max-num-batched-tokens as the server runs" in line


def test_target_layers_follow_the_target_model_class_rule(capsys, models):
    """Gemma 3: no layer_types, a window and a 5:1 pattern; vLLM's Gemma3 class slides 22 of 26 layers."""
    rc, report = run_json(capsys, "--target", models["gemma3-1b"], "--draft", models["gemma3-1b"], "--method", "draft_model")
    assert "vllm.model_executor.models.gemma3.Gemma3ForCausalLM" in report["rules"]["target"]
    expected = [("full", None) if i % 6 == 5 else ("sliding", 512) for i in range(26)]
    assert layout(report, "target", "resolved") == layout(report, "target") == expected
    assert layout(report, "draft") == expected
    # derived, not declared: a warning each, and no layout mismatch
    assert triples(report) == [("LAYER_TYPES_DEFAULTED", "warning", None)] * 2
    assert rc == 0


def test_every_finding_names_its_vllm_rule(capsys, models):
    cases = [
        ("qwen3-8b", "qwen3-8b-dflash-window_only", "dflash"),
        ("qwen3-8b", "qwen3-8b-dflash-layer_types_no_flag", "dflash"),
        ("qwen3-8b", "qwen3-8b-drafter", None),
        ("qwen3-8b", "llama-3.2-1b", "draft_model"),
        ("qwen3-8b-yarn", "qwen3-8b-dflash-flagged", "dflash"),
    ]
    for target, draft, method in cases:
        args = ["--target", models[target], "--draft", models[draft]] + (["--method", method] if method else [])
        _, report = run_json(capsys, *args)
        assert report["findings"]
        for f in report["findings"]:
            assert set(f) == {"code", "severity", "component", "model_role", "message", "evidence", "fix", "caused_by"}
            assert f["evidence"]["vllm_rule"].startswith("vllm."), f


def test_readable_output(capsys, models):
    rc, out, err = run(
        capsys, "--target", models["qwen3-8b"], "--draft", models["qwen3-8b-dflash-window_only"], "--method", "dflash"
    )
    assert rc == 1 and err == ""
    assert "draft attention layout" in out and "target attention layout" in out
    assert "layer  declared" in out  # spectrace.cli.format_table
    assert "0-4    unspecified(2048)  full" in out and "0-35" in out
    assert "ERROR   SWA_DROPPED [draft]" in out and "fix: add \"use_sliding_window\": true" in out
    assert "(caused by SWA_DROPPED)" in out
    assert "1 error(s)" in out


@pytest.mark.parametrize("runner, said", [
    ("v2", "judged by the V2 model runner's rules (--runner v1 for V1's); this CPU build of vLLM serves V1 by "
           "default: pass --runner v1"),
    ("v1", "judged by the V1 model runner's rules (--runner v2 for V2's); this CPU build of vLLM serves V1 by default"),
])
def test_the_header_says_whose_rules_it_applied_and_what_this_build_serves(capsys, models, runner, said):
    """The CPU build serves V1; the default rules are V2's (CUDA's default): the header says both (issue #57)."""
    from vllm.platforms import current_platform

    assert current_platform.device_type == "cpu"  # the project's vLLM is the CPU build
    rc, out, err = run(capsys, "--target", models["qwen3-8b"], "--draft", models["qwen3-8b-dflash-window_only"],
                       "--method", "dflash", "--runner", runner)
    head = out.splitlines()
    assert head[0].startswith("spectrace doctor (vLLM 0.32") and said in head[1], out
    assert ("--runner v1 to judge" in head[1]) == (runner == "v2")


def test_doctor_leaves_the_process_as_it_found_it(capsys, models):
    from vllm.config import VllmConfig
    from vllm.distributed import parallel_state

    prop = VllmConfig.__dict__["use_v2_model_runner"]
    level = logging.getLogger("vllm").level
    env = dict(os.environ)
    run_json(capsys, "--target", models["qwen3-8b"], "--draft", models["qwen3-8b-dflash-flagged"], "--method", "dflash")
    assert VllmConfig.__dict__["use_v2_model_runner"] is prop
    assert logging.getLogger("vllm").level == level
    assert dict(os.environ) == env
    assert not parallel_state.model_parallel_is_initialized()


# -- bad input: exit 2, one line on stderr --------------------------------------------------


@pytest.fixture(scope="module")
def bad_dirs(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("doctor-bad")
    made = {}
    for name, content in {
        "invalid-json": b'{"architectures": ["Qwen3ForCausalLM"],',
        "not-an-object": b"[1, 2, 3]",
        "not-utf8": b'{"model_type": "qwen3", "x": "\xff\xfe"}',
    }.items():
        (root / name).mkdir()
        (root / name / "config.json").write_bytes(content)
        made[name] = str(root / name)
    (root / "no-config").mkdir()
    made["no-config"] = str(root / "no-config")
    made["missing"] = str(root / "does-not-exist")
    (root / "a-file").write_text("{}")
    made["a-file"] = str(root / "a-file")
    return made


BAD = {
    "missing target path": (lambda m, b: ["--target", b["missing"], "--draft", m["qwen3-0.6b"]], "does not exist"),
    "missing draft path": (lambda m, b: ["--target", m["qwen3-8b"], "--draft", b["missing"]], "does not exist"),
    "path is a file": (lambda m, b: ["--target", b["a-file"], "--draft", m["qwen3-0.6b"]], "not a directory"),
    "no config.json": (lambda m, b: ["--target", m["qwen3-8b"], "--draft", b["no-config"]], "has no config.json"),
    "invalid JSON": (lambda m, b: ["--target", b["invalid-json"], "--draft", m["qwen3-0.6b"]], "not valid JSON"),
    "JSON not an object": (lambda m, b: ["--target", m["qwen3-8b"], "--draft", b["not-an-object"]], "JSON object"),
    "unreadable config": (lambda m, b: ["--target", m["qwen3-8b"], "--draft", b["not-utf8"]], "cannot read"),
    "unknown method": (lambda m, b: ["--target", m["qwen3-8b"], "--draft", m["qwen3-0.6b"], "--method", "dflash2"],
                       "unknown method 'dflash2'"),
    "model-free method": (lambda m, b: ["--target", m["qwen3-8b"], "--draft", m["qwen3-0.6b"], "--method", "ngram"],
                          "unknown method 'ngram'"),
    "unknown runner": (lambda m, b: ["--target", m["qwen3-8b"], "--draft", m["qwen3-0.6b"], "--runner", "v3"],
                       "unknown runner 'v3'"),
    "bad k": (lambda m, b: ["--target", m["qwen3-8b"], "--draft", m["qwen3-0.6b"], "--num-speculative-tokens", "0"],
              "positive integer"),
    "bad budget": (lambda m, b: ["--target", m["qwen3-8b"], "--draft", m["qwen3-0.6b"], "--max-num-batched-tokens", "x"],
                   "--max-num-batched-tokens must be a positive integer"),
    "no target": (lambda m, b: ["--draft", m["qwen3-0.6b"]], "needs --target"),
    "no draft": (lambda m, b: ["--target", m["qwen3-8b"]], "needs --draft"),
    "flag without value": (lambda m, b: ["--target", m["qwen3-8b"], "--draft"], "expected one argument"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_exits_2_with_one_line(capsys, models, bad_dirs, case):
    make_args, needle = BAD[case]
    rc, out, err = run(capsys, *make_args(models, bad_dirs))
    assert rc == 2
    assert out == ""
    assert len(err.splitlines()) == 1 and err.endswith("\n"), err
    assert err.startswith("spectrace: error: ") and needle in err


# -- numbers and lists from anyone's config.json ------------------------------------------------


def test_a_huge_rope_factor_and_a_huge_tap_list_are_findings_and_bounded_output(capsys, models, tmp_path):
    def model(name, config):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config, separators=(",", ":")))
        return str(tmp_path / name)

    # a RoPE factor of 1e308 stretches the context past any integer (OverflowError in the context audit)
    yarn = model("yarn-1e308", {**QWEN3_06B, "rope_scaling": {"rope_type": "yarn", "factor": 1e308,
                                                             "original_max_position_embeddings": 4096}})
    rc, out, err = run(capsys, "--target", models["qwen3-8b"], "--draft", yarn, "--max-model-len", "2048")
    assert rc == 1 and "Error:" not in err and "(--debug" not in err, err
    assert "ROPE_DIFFERS" in out and "drafter 1e+308" in out
    # 5000 declared tap ids: the text and the messages show 16 of them, the JSON evidence 256, and the count
    many = model("eagle3-5000", {**EAGLE3, "eagle_aux_hidden_state_layer_ids": list(range(5000))})
    rc, out, err = run(capsys, "--target", models["qwen3-8b"], "--draft", many, "--method", "eagle3")
    assert rc == 1 and len(out) < 20_000, len(out)
    assert f"= {list(range(16))}"[:-1] + ", ... 4984 more (5000 in all)]" in out
    assert "asks for hidden state(s) [37, 38, " in out and "... 4947 more (4963 in all)]" in out  # TAP_OUT_OF_RANGE
    rc, report = run_json(capsys, "--target", models["qwen3-8b"], "--draft", many, "--method", "eagle3")
    declared = finding(report, "TAP_OUT_OF_RANGE")["evidence"]["declared_ids"]
    assert declared == [*range(256), "... 4744 more (5000 in all)"] and report["taps"]["declared_ids"] == declared


# -- the installed command, as a user runs it -----------------------------------------------


def _command(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    return subprocess.run(
        [sys.executable, "-m", "spectrace.cli", "doctor", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_command_prints_clean_json_and_nothing_else(models):
    started = time.perf_counter()
    proc = _command("--target", models["qwen3-8b"], "--draft", models["qwen3-8b-dflash-layer_types_no_flag"],
                    "--method", "dflash", "--json")  # fmt: skip
    wall = time.perf_counter() - started
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == ""  # no vLLM / transformers log lines
    report = json.loads(proc.stdout)
    assert ("SWA_DROPPED", "error", None) in triples(report)
    print(f"doctor wall time (fresh process, vLLM import included): {wall:.1f}s; in doctor: {report['seconds']}s")
    bad = _command("--target", models["qwen3-8b"], "--draft", models["qwen3-0.6b"], "--runner", "v9")
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr == "spectrace: error: unknown runner 'v9' (choose from v1, v2)\n"


def test_query_stays_fast_without_vllm():
    code = "import sys, spectrace.cli as c; c.build_parser(); print('vllm' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr


# -- doctor and a live run agree ------------------------------------------------------------

# Found only while vLLM runs (acceptance, verification): no config can predict them.
LIVE_ONLY = {
    "ACCEPTANCE_COLLAPSE", "ACCEPTANCE_RECOVERED", "VERIFY_DISAGREEMENT",  # measured while serving
    "CONTEXT_CLIFF", "POSITION_CLIFF", "DUMMY_DRAFTS", "SPECULATION_NOT_PAYING",
    "SLICE_ACCEPTANCE_LOW", "DRAFTS_UNVERIFIED", "PREFIX_HITS_DROPPED", "DYNAMIC_K_THRASHING",
}  # fmt: skip
LAYOUT_COLUMNS = ("declared_type", "declared_window", "resolved_type", "resolved_window",
                  "runtime_type", "runtime_window", "kv_cache_spec", "causal")  # fmt: skip


@pytest.mark.vllm
def test_doctor_agrees_with_live_runs(audit_runs, capsys):
    """Each audit drafter served live on the CPU build (V1 runner) vs doctor --runner v1."""
    from spectrace.testing.engine import EngineSpec

    con, results, paths = audit_runs
    max_model_len = EngineSpec.__dataclass_fields__["max_model_len"].default  # the live engines' max_model_len
    assert set(results) == {"window_only", "layer_types_no_flag", "flagged", "swa_window_size", "no_method"}
    for name, result in results.items():
        assert result.run_id, (name, result.error)
        target, draft, method, inferred, k, runner = con.execute(
            "select target_model, draft_model, method, method_inferred, num_speculative_tokens, model_runner "
            "from runs where run_id = ?",
            [result.run_id],
        ).fetchone()
        assert runner == "v1"
        assert Path(draft).resolve() == Path(paths[name]).resolve()
        args = ["--target", target, "--draft", str(paths[name]), "--runner", "v1",
                "--num-speculative-tokens", str(k), "--max-model-len", str(max_model_len)]  # fmt: skip
        if not inferred:
            args += ["--method", method]
        rc, report = run_json(capsys, *args)
        assert report["method"] == method, name

        live_findings = con.execute(
            "select code, severity, caused_by from findings where run_id = ?", [result.run_id]
        ).fetchall()
        live = collections.Counter(tuple(row) for row in live_findings if row[0] not in LIVE_ONLY)
        mine = collections.Counter((f["code"], f["severity"], f["caused_by"]) for f in report["findings"])
        assert mine == live, (name, sorted(mine.elements()), sorted(live.elements()))
        assert rc == (1 if any(s == "error" for _, s, _ in live) else 0), name

        for role in ("draft", "target"):
            live_layout = con.execute(
                f"select {', '.join(LAYOUT_COLUMNS)} from attention_layout where run_id = ? and model_role = ? "
                "order by layer_index",
                [result.run_id, role],
            ).fetchall()
            doctor_layout = [tuple(row[c] for c in LAYOUT_COLUMNS) for row in report["layout"][role]]
            if live_layout:
                assert doctor_layout == [tuple(row) for row in live_layout], (name, role)
            else:
                # the live worker failed to build the drafter: nothing ran, so no runtime layout
                # was recorded; doctor shows the draft's declared/resolved columns, runtime empty
                assert not result.ok, name
                if role == "draft":
                    assert doctor_layout and all(row[4] is None for row in doctor_layout), name
