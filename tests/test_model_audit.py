"""The drafter's model against the target's (issue #24): RoPE, dtype, weights; pure rules on
hand-written facts, and the safetensors manifest from bytes written here (no torch, no vLLM)."""

from __future__ import annotations

import json
import struct

import pytest

from spectrace import audit
from spectrace.audit.curve import raised_findings
from spectrace.audit import codes
from spectrace.audit.dtype import audit_dtype, declared_dtype
from spectrace.audit.rope import audit_rope, rope_of, runtime_rope
from spectrace.audit.weights import audit_weights
from spectrace.vllm_objects.weights import MAX_HEADER_BYTES, ManifestError, read_header, read_manifest

QWEN3_ROPE = {"rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}}


# -- RoPE: both spellings ----------------------------------------------------------------


def test_rope_reads_transformers_5_and_legacy_spellings_alike():
    v5 = rope_of({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768}})
    legacy = rope_of({"rope_theta": 1e6, "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 32768}})
    assert v5.compared() == legacy.compared() == {
        "theta": 1e6, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
        "partial_rotary_factor": 1.0, "neox_style": None,
    }
    assert v5.source == "rope_parameters.rope_theta, rope_parameters" and legacy.source == "rope_theta, rope_scaling"
    # nested per layer type: the full-attention entry; a text_config when the top level names none
    nested = rope_of({"rope_parameters": {"full_attention": {"rope_theta": 5e5, "rope_type": "default"},
                                          "sliding_attention": {"rope_theta": 1e4}}})
    assert nested.theta == 5e5
    assert rope_of({"text_config": {"rope_theta": 7.0}}).theta == 7.0
    assert rope_of({"rope_theta": 1e4, "partial_rotary_factor": 0.5, "rope_interleaved": True}).compared()["neox_style"] is False
    assert rope_of(None) is None


def test_rope_mismatch_for_shared_positions_names_both_values_and_the_fix():
    target = rope_of({"rope_theta": 1e6, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}})
    draft = rope_of({"rope_theta": 10000})  # a DFlash drafter whose config lost the target's scaling and base
    [finding] = audit_rope("dflash", target, draft)
    # DFlash's trainers build the drafter's RoPE from the target's (speculators, SpecForge): a misdeclaration
    assert (finding.code, finding.severity, finding.model_role) == (codes.ROPE_MISMATCH, "error", "draft")
    assert finding.evidence["differs"] == ["theta", "rope_type", "factor", "original_max_position_embeddings"]
    assert "theta: target 1000000.0, drafter 10000.0" in finding.message
    # what it costs is measured, not promised (nothing on the trained EAGLE-3 at x100, 37 % -> 23 % on the DFlash)
    assert "depends on the drafter and the context length" in finding.message and "degrade" not in finding.message
    assert '"rope_type": "yarn"' in finding.fix and '"factor": 4.0' in finding.fix
    assert audit_rope("dflash", target, target) == []


def test_an_eagle3_drafters_own_rope_is_info_saying_what_settles_it():
    """The EAGLE-3 reference trains its drafter with a base of its own (10000): from configs alone, info."""
    target = rope_of({"rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}})
    for method in ("eagle3", "eagle"):
        [finding] = audit_rope(method, target, rope_of({}))
        assert (finding.code, finding.severity) == (codes.ROPE_DIFFERS, "info")
        assert "SafeAILab/EAGLE" in finding.message and finding.evidence["settled_by"]
        assert finding.fix.startswith("only if acceptance collapses")  # never rewrite a drafter that works
    [mtp] = audit_rope("mtp", target, rope_of({}))
    assert (mtp.code, mtp.severity) == (codes.ROPE_MISMATCH, "error")  # MTP layers are the target's own


def test_a_missing_base_is_vllms_default_10000():
    assert audit_rope("dflash", rope_of({"rope_theta": 10000}), rope_of({})) == []
    [finding] = audit_rope("dflash", rope_of({"rope_theta": 1e6}), rope_of({}))
    assert finding.evidence["draft"]["theta"] is None and "drafter 10000.0" in finding.message


def test_layout_counts_only_where_both_are_known():
    neox = runtime_rope({"base": 1e6, "head_size": 32, "rotary_dim": 32, "neox_style": True, "rope_type": "default"})
    gptj = runtime_rope({"base": 1e6, "head_size": 32, "rotary_dim": 32, "neox_style": False, "rope_type": "default"})
    [finding] = audit_rope("mtp", neox, gptj, where="built rotary modules")
    assert finding.evidence["differs"] == ["neox_style"] and "NeoX" in finding.fix
    assert audit_rope("mtp", neox, rope_of(QWEN3_ROPE)) == []  # the config names no layout


def test_draft_model_rope_difference_is_info_naming_the_collapse_suspect():
    [finding] = audit_rope("draft_model", rope_of(QWEN3_ROPE), rope_of({"rope_theta": 10000}))
    assert (finding.code, finding.severity) == (codes.ROPE_DIFFERS, "info")
    assert "first suspect if acceptance collapses or falls with context" in finding.message
    assert audit_rope("ngram", rope_of(QWEN3_ROPE), rope_of({"rope_theta": 10000})) == []


def test_judge_compares_the_configs_vllm_builds_from():
    target = {"model_role": "target", "declared": QWEN3_ROPE, "transformers_resolved": QWEN3_ROPE}
    draft_cfg = {"architectures": ["LlamaForCausalLMEagle3"], "rope_theta": 10000}
    draft = {"model_role": "draft", "declared": draft_cfg, "transformers_resolved": draft_cfg}
    judged = audit.judge(audit.RunFacts([target, draft], "eagle3"))
    assert [f.code for f in judged.findings if f.component == "rope"] == [codes.ROPE_DIFFERS]
    assert codes.ROPE_DIFFERS in judged.roots  # an uncertain info finding: a collapse in the run names and raises it
    dflash = {**draft, "declared": {**draft_cfg, "architectures": ["DFlashDraftModel"]}}
    dflash["transformers_resolved"] = dflash["declared"]
    judged = audit.judge(audit.RunFacts([target, dflash], "dflash"))
    assert [f.code for f in judged.findings if f.component == "rope"] == [codes.ROPE_MISMATCH]
    healthy = {**draft, "transformers_resolved": {**draft_cfg, **QWEN3_ROPE}}
    assert not [f for f in audit.judge(audit.RunFacts([target, healthy], "eagle3")).findings if f.component == "rope"]


# -- dtype -------------------------------------------------------------------------------


def test_bf16_drafter_in_the_targets_fp16_is_an_error():
    [finding] = audit_dtype("draft", declared="bfloat16", checkpoint="BF16", runs_in="torch.float16", target_runs_in="float16")
    assert (finding.code, finding.severity) == (codes.DRAFT_DTYPE_LOSSY, "error")
    assert "overflow" in finding.message and "the target's dtype" in finding.message
    assert finding.fix.startswith("run the target in bfloat16 (--dtype bfloat16)")
    assert finding.evidence == {"declared_dtype": "bfloat16", "checkpoint_dtype": "bfloat16", "runs_in": "float16",
                                "target_runs_in": "float16", "trained_from": "checkpoint"}
    # config.json alone (no checkpoint read): often stale, so info, naming what settles it
    [stale] = audit_dtype("draft", declared="bfloat16", checkpoint=None, runs_in="float16", target_runs_in="float16")
    assert (stale.severity, stale.evidence["trained_from"]) == ("info", "config") and "safetensors" in stale.message
    # a stale torch_dtype (float16) over bfloat16 tensors: the tensors win, bfloat16 runs in bfloat16, nothing to say
    assert audit_dtype("draft", declared="float16", checkpoint="BF16", runs_in="bfloat16") == []


@pytest.mark.parametrize(
    "declared, checkpoint, runs_in, expected",
    [
        (None, "BF16", "float16", "error"),  # the checkpoint's tensors say what the config does not
        ("float32", None, "float16", "info"),  # config.json alone: info (trainers leave torch_dtype stale)
        ("float16", None, "bfloat16", "info"),
        (None, "F32", "float16", "warning"),
        ("bfloat16", "F16", "bfloat16", "warning"),
        ("float32", None, "bfloat16", None),  # the usual serving cast
        ("float16", None, "float32", None),
        ("bfloat16", None, "bfloat16", None),
        (None, None, "float16", None),
    ],
)
def test_dtype_pairs(declared, checkpoint, runs_in, expected):
    found = audit_dtype("draft", declared=declared, checkpoint=checkpoint, runs_in=runs_in)
    assert [f.severity for f in found] == ([expected] if expected else [])


def test_declared_dtype_spellings_and_the_judge():
    assert declared_dtype({"torch_dtype": "bfloat16"}) == declared_dtype({"dtype": "bfloat16"}) == "bfloat16"
    assert declared_dtype({"dtype": "auto"}) is None
    target = {"model_role": "target", "declared": {}, "transformers_resolved": {}}
    draft = {"model_role": "draft", "declared": {"dtype": "bfloat16"}, "transformers_resolved": {}}
    judged = audit.judge(audit.RunFacts([target, draft], "draft_model", runs_in={"target": "float16", "draft": "float16"}))
    assert [f.code for f in judged.findings] == [codes.DRAFT_DTYPE_LOSSY]
    assert audit.judge(audit.RunFacts([target, draft], "draft_model")).findings == []  # runs_in unknown: no judgement


# -- weights -----------------------------------------------------------------------------

PARAMS = [
    "model.embed_tokens.weight", "model.fc.weight", "model.layers.8.self_attn.qkv_proj.weight",
    "model.layers.8.mlp.down_proj.weight", "model.norm.weight", "lm_head.weight",
]
TENSORS = ["fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
           "midlayer.self_attn.v_proj.weight", "midlayer.mlp.down_proj.weight", "norm.weight", "lm_head.weight"]


def test_healthy_drafter_with_shared_embeddings_has_no_weight_finding():
    loaded = set(PARAMS) - {"model.embed_tokens.weight"}
    assert audit_weights("draft", tensors=TENSORS, parameters=PARAMS, loaded=loaded,
                         shared={"embed_tokens": "target", "lm_head": "own"}) == []


def test_a_parameter_no_tensor_reached_and_the_misnamed_tensor():
    tensors = [t if t != "midlayer.mlp.down_proj.weight" else "midlayer.mlp.down_projection.weight" for t in TENSORS]
    loaded = set(PARAMS) - {"model.embed_tokens.weight", "model.layers.8.mlp.down_proj.weight"}
    unloaded, unused = audit_weights("draft", tensors=tensors, parameters=PARAMS, loaded=loaded,
                                     shared={"embed_tokens": "target"}, quantization="fp8")
    assert (unloaded.code, unloaded.severity) == (codes.DRAFT_WEIGHTS_UNLOADED, "error")
    assert unloaded.evidence["unloaded"] == ["model.layers.8.mlp.down_proj.weight"] and unloaded.evidence["unloaded_count"] == 1
    assert unloaded.evidence["unused_tensors_like_them"] == {"model.layers.8.mlp.down_proj.weight": ["midlayer.mlp.down_projection.weight"]}
    assert "off for quantized models (fp8)" in unloaded.message
    assert (unused.code, unused.severity, unused.caused_by) == (codes.DRAFT_TENSORS_UNUSED, "info", codes.DRAFT_WEIGHTS_UNLOADED)
    assert unused.evidence["unused"] == ["midlayer.mlp.down_projection.weight"]


def test_unknown_loaded_set_or_target_role_judges_nothing():
    assert audit_weights("draft", tensors=TENSORS, parameters=PARAMS, loaded=None) == []
    assert audit_weights("target", tensors=TENSORS, parameters=PARAMS, loaded=set()) == []
    # an extra tensor nothing consumed, every parameter loaded: a warning of its own
    [unused] = audit_weights("draft", tensors=TENSORS + ["mtp.0.eh_proj.weight"], parameters=PARAMS, loaded=set(PARAMS))
    assert (unused.code, unused.severity, unused.evidence["unused"]) == (codes.DRAFT_TENSORS_UNUSED, "warning", ["mtp.0.eh_proj.weight"])


# -- the safetensors manifest: headers only, hostile files refused ------------------------


def _write(path, header: dict | bytes, *, length: int | None = None, data: bytes = b"\0" * 16):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def test_manifest_reads_names_shapes_dtypes_from_headers(tmp_path):
    _write(tmp_path / "model-00001.safetensors", {"__metadata__": {"format": "pt"},
                                                  "a.weight": {"dtype": "BF16", "shape": [4, 2], "data_offsets": [0, 16]}})
    _write(tmp_path / "model-00002.safetensors", {"b.weight": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
                                                  "c.bias": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})
    manifest = read_manifest(tmp_path)
    assert manifest.error is None and manifest.files == ["model-00001.safetensors", "model-00002.safetensors"]
    assert manifest.tensors == {"a.weight": ("BF16", (4, 2)), "b.weight": ("BF16", (2,)), "c.bias": ("F32", (1,))}
    assert manifest.main_dtype() == "BF16" and manifest.dtypes() == {"BF16": 2, "F32": 1}


@pytest.mark.parametrize(
    "header, length, error",
    [
        (b"{}", MAX_HEADER_BYTES + 1, "exceeds"),
        (b"{}", 10_000, "exceeds the file"),
        (b"not json", None, "not JSON"),
        (b"[1, 2]", None, "not a JSON object"),
        ({"a": {"dtype": "F32", "shape": [-1]}}, None, "no valid dtype and shape"),
        ({"a": "x"}, None, "is not an object"),
        (b"[" * 100_000 + b"]" * 100_000, None, "not JSON"),
    ],
)
def test_hostile_headers_are_one_clear_error(tmp_path, header, length, error):
    path = _write(tmp_path / "bad.safetensors", header, length=length)
    with pytest.raises(ManifestError, match=error):
        read_header(path)
    assert error in read_manifest(tmp_path).error


def test_short_file_and_no_checkpoint(tmp_path):
    (tmp_path / "x.safetensors").write_bytes(b"\1\2")
    assert "shorter than a safetensors header" in read_manifest(tmp_path).error
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no *.safetensors files" in read_manifest(empty).error


def test_ranks_that_share_embeddings_differently_disagree():
    """vLLM's weight-equality test decides per rank whether the drafter keeps its own embeddings."""
    own = [("draft", "own", "own", "[]")]
    shared = [("draft", "target", "own", "[]")]
    assert audit.rank_disagreements({}, {}, {}, weights={0: own, 1: own}) == []
    [finding] = audit.rank_disagreements({}, {}, {}, weights={0: own, 1: shared})
    assert (finding.code, finding.evidence["aspect"], finding.evidence["differing_ranks"]) == (codes.RANK_DISAGREEMENT, "weights", [1])
    assert "embeddings and head" in finding.message


def test_a_collapse_names_the_model_findings_of_its_run_as_likely_causes():
    from types import SimpleNamespace

    event = SimpleNamespace(code=codes.ACCEPTANCE_COLLAPSE, evidence={
        "position_0_rate": 0.01, "overall_rate": 0.01, "window_drafted_tokens": 400, "threshold": 0.1})
    finding = audit.collapse_finding(event, {codes.ROPE_DIFFERS, codes.TAP_DEFAULTED})
    assert finding.evidence["likely_causes"] == [codes.ROPE_DIFFERS, codes.TAP_DEFAULTED]
    assert finding.caused_by == codes.ROPE_DIFFERS and "likely cause: ROPE_DIFFERS, TAP_DEFAULTED" in finding.message
    # what the configs could not tell, the collapse does: both info suspects come back as warnings
    raised = raised_findings(finding)
    assert [(f.code, f.severity, f.evidence["raised_by"]) for f in raised] == [
        (codes.ROPE_DIFFERS, "warning", codes.ACCEPTANCE_COLLAPSE), (codes.TAP_DEFAULTED, "warning", codes.ACCEPTANCE_COLLAPSE)]
    assert "position 0 1.0%" in raised[0].message
    both = audit.collapse_finding(event, {codes.ROPE_MISMATCH, codes.DRAFT_VOCAB_MAP_MISSING})
    # every draft on a wrong id comes first: its cost is certain, a RoPE's depends on the drafter and the context
    assert both.evidence["likely_causes"] == [codes.DRAFT_VOCAB_MAP_MISSING, codes.ROPE_MISMATCH]
    assert both.caused_by == codes.DRAFT_VOCAB_MAP_MISSING
    alone = audit.collapse_finding(event)
    assert "likely_causes" not in alone.evidence and alone.caused_by is None
    assert raised_findings(both) == [] and raised_findings(alone) == []  # errors stay errors


def test_a_context_cliff_past_the_drafters_length_is_explained_by_its_rope():
    [boundary] = audit.context_boundaries(
        method="draft_model", target_declared={}, target_resolved={}, max_model_len=4096,
        draft_declared={"max_position_embeddings": 2048}, draft_resolved={"max_position_embeddings": 2048},
    )
    assert codes.ROPE_DIFFERS in boundary.explained_by and codes.ROPE_MISMATCH in boundary.explained_by


def test_a_parameter_the_model_never_reads_needs_no_tensor():
    """DFlash's mask_embedding is read only when the checkpoint ships one (vLLM 0.32 qwen3_dflash)."""
    params = ["model.mask_embedding", "model.fc.weight"]
    assert audit_weights("draft", tensors=["fc.weight"], parameters=params, loaded={"model.fc.weight"},
                         inert={"model.mask_embedding"}) == []
    [unloaded] = audit_weights("draft", tensors=["fc.weight"], parameters=params, loaded={"model.fc.weight"})
    assert unloaded.evidence["unloaded"] == ["model.mask_embedding"]


def test_inert_parameters_read_dflashs_flag():
    from types import SimpleNamespace

    from spectrace.vllm_objects.weights import inert_parameters

    built = SimpleNamespace(model=SimpleNamespace(mask_embedding=object(), has_separate_mask_embedding=False))
    assert inert_parameters(built) == {"model.mask_embedding"}
    built.model.has_separate_mask_embedding = True
    assert inert_parameters(built) == set() and inert_parameters(object()) == set()


# -- the drafter's own head (vllm-ascend#11374) ------------------------------------------------

# the published pair of vllm-ascend#11374: RedHatAI/Qwen3-8B-speculator.dflash ships its own head of shape
# [draft_vocab_size = 32000, hidden 4096] next to Qwen3-8B's lm_head [vocab_size = 151936, 4096]
# (https://github.com/vllm-project/vllm-ascend/pull/9795: "draft_vocab_size=32000 vs target vocab_size=151936")
DRAFT_HEAD = {"lm_head.weight": ("BF16", (32000, 4096)), "layers.0.self_attn.q_proj.weight": ("BF16", (4096, 4096))}
QWEN3_8B = {"lm_head.weight": ("BF16", (151936, 4096)), "model.embed_tokens.weight": ("BF16", (151936, 4096))}


def test_a_draft_head_of_another_shape_replaced_by_the_targets_is_an_error():
    from spectrace.audit.weights import audit_head, target_head_shape

    [finding] = audit_head("draft", tensors=DRAFT_HEAD, shared={"lm_head": "target"}, has_own_lm_head=False,
                           target_shape=target_head_shape(QWEN3_8B))
    assert (finding.code, finding.severity, finding.component) == ("DRAFT_HEAD_REPLACED", "error", "weights")
    assert finding.evidence["draft_shape"] == [32000, 4096] and finding.evidence["target_shape"] == [151936, 4096]
    assert "32000 × 4096" in finding.message and "151936 × 4096" in finding.message
    # the same, whatever the flag said: a head of another shape cannot be a copy
    assert audit_head("draft", tensors=DRAFT_HEAD, shared={"lm_head": "target"}, has_own_lm_head=True,
                      target_shape=(151936, 4096))[0].severity == "error"


def test_the_quiet_twins_of_a_replaced_head():
    from spectrace.audit.weights import audit_head, target_head_shape

    same = {"lm_head.weight": ("F32", (512, 128))}
    # kept: the drafter computes with its own head
    assert audit_head("draft", tensors=DRAFT_HEAD, shared={"lm_head": "own"}, has_own_lm_head=True,
                      target_shape=(151936, 4096)) == []
    # no head in the checkpoint (DFlash, EAGLE trained on the target's): the target's is the one it learnt with
    assert audit_head("draft", tensors={"fc.weight": ("BF16", (4096, 12288))}, shared={"lm_head": "target"},
                      has_own_lm_head=False, target_shape=(151936, 4096)) == []
    # a copy vLLM compared (the flag set by load_weights, then torch.equal): shared to save memory
    assert audit_head("draft", tensors=same, shared={"lm_head": "target"}, has_own_lm_head=True,
                      target_shape=(512, 128)) == []
    # MTP in the target's checkpoint: its tensors are the target's (tensors=None), and draft_model shares nothing
    assert audit_head("draft", tensors=None, shared={"lm_head": "target"}, has_own_lm_head=None,
                      target_shape=(512, 128)) == []
    assert audit_head("draft", tensors=DRAFT_HEAD, shared={}, has_own_lm_head=None, target_shape=(512, 128)) == []
    # tied target: its head is its input embedding
    assert target_head_shape({"model.embed_tokens.weight": ("BF16", (151936, 2048))}) == (151936, 2048)


def test_a_same_shape_head_replaced_without_a_comparison_is_a_warning():
    from spectrace.audit.weights import audit_head

    [finding] = audit_head("draft", tensors={"lm_head.weight": ("F32", (512, 128))}, shared={"lm_head": "target"},
                           has_own_lm_head=False, target_shape=(512, 128))
    assert finding.severity == "warning" and "without vLLM comparing" in finding.message
    assert "compare the drafter's lm_head.weight" in finding.fix
