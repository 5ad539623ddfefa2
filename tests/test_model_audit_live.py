"""The drafter's model against the target's (issue #24), on real vLLM 0.32 runs on CPU.

- A drafter checkpoint missing a tensor: vLLM's EAGLE3 ``load_weights`` returns nothing to
  vLLM, so its "weights were not initialized" check never runs and the parameter keeps its
  ``torch.empty`` value while the engine serves: ``DRAFT_WEIGHTS_UNLOADED`` names it.
- An EAGLE3 drafter whose rotary base differs from the target's: ``ROPE_DIFFERS`` (info: the EAGLE-3 reference
  trains its drafter with a base of its own, so the configs cannot tell; a collapse in the run raises it).
- A ``draft_model`` drafter trained in bfloat16 next to a float16 target: vLLM builds it in
  float16 (``DRAFT_DTYPE_LOSSY``); its other rotary base is legitimate, named (``ROPE_DIFFERS``, info).
- Every drafter field vLLM drops or replaces, the vocabulary map, the guessed taps (issue #35): one
  speculators-format EAGLE-3 drafter (``build_speculators_eagle3``, the JSON shape the speculators library
  writes) carries every case: its norms declared inside ``transformer_layer_config``, ``norm_before_residual``
  left out, ``rope_scaling`` at the top level, a 200-token draft vocabulary without ``d2t``, no tap ids, and
  a ``speculative_config.max_model_len`` the proposer never uses. Its clean twins are judged by doctor
  (test_doctor_fields.py).

The healthy twins are the session's standard engines (``traced_methods``: draft_model, eagle3,
dflash, mtp), which must carry none of these findings.
"""

from __future__ import annotations

import json

import pytest

import spectrace.store
from spectrace.testing.engine import EngineSpec, run_engines

pytestmark = pytest.mark.vllm

MODEL_CODES = ("DRAFT_WEIGHTS_UNLOADED", "DRAFT_TENSORS_UNUSED", "ROPE_MISMATCH", "ROPE_DIFFERS", "DRAFT_DTYPE_LOSSY")
MISSING = "midlayer.mlp.down_proj.weight"
FIELD_CODES = ("DRAFT_FIELD_DROPPED", "DRAFT_FIELD_CHANGED", "DRAFT_FIELD_OVERRIDDEN", "DRAFT_FIELD_DEFAULT_DIFFERS",
               "DRAFT_VOCAB_MAP_MISSING", "DRAFT_VOCAB_MAP_INVALID", "DRAFT_SETTING_IGNORED")  # fmt: skip


@pytest.fixture(scope="module")
def model_runs(zoo, scratch, cache_root):
    from spectrace.testing.models import build_speculators_eagle3, derive_model

    root = scratch / "model-audit-models"
    target = zoo["target"]
    target_rope = json.loads(open(f"{target}/config.json").read())["rope_parameters"]
    other_rope = {**target_rope, "rope_theta": 500000.0}  # the zoo target rotates with 10000
    missing = derive_model(root / "eagle3-missing", zoo["eagle3"], drop_tensors=[MISSING])
    rope = derive_model(root / "eagle3-rope", zoo["eagle3"], config={"rope_parameters": other_rope})
    bf16 = derive_model(root / "draft-bf16", target, config={"dtype": "bfloat16", "rope_parameters": other_rope},
                        tensor_dtype="bfloat16")  # saved in bf16: the checkpoint settles how it was trained
    fields = build_speculators_eagle3(
        root / "speculators-eagle3", target_dir=target, aux_layer_ids=None, layer={"norm_before_fc": True},
        top={"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, draft_vocab_size=200, d2t="missing",
    )

    def spec(name, method, model, speculative=None, **extra):
        return EngineSpec(name=name, target=target, max_tokens=4, prompts=["the quick brown fox"],
                          speculative={"method": method, "model": str(model), "num_speculative_tokens": 2,
                                       **(speculative or {})}, **extra)

    specs = [
        spec("missing", "eagle3", missing),
        spec("rope", "eagle3", rope),
        spec("bf16_in_fp16", "draft_model", bf16, extra_llm_kwargs={"dtype": "float16"}),
        # a drafter context asked for (vllm#52258): accepted, and the proposer runs with the run's 512
        spec("fields", "eagle3", fields, speculative={"max_model_len": 256}),
    ]
    store = scratch / "model-audit-store"
    results = run_engines(specs, store=store, cache_root=cache_root, log_file=scratch / "model-audit.log")
    return spectrace.store.open(store), results


def _findings(con, run_id):
    return con.execute(
        "select code, severity, model_role, process_role, message, evidence, fix from findings "
        "where run_id = ? and list_contains(?, code) order by code",
        [run_id, list(MODEL_CODES)],
    ).fetchall()


def _weights(con, run_id, role="draft"):
    row = con.execute(
        "select parameters, loaded, unloaded, unused_tensors, embed_tokens, lm_head, checkpoint_tensors, "
        "checkpoint_dtypes, manifest_error, manifest_ms, declared_dtype, runtime_dtype, runtime_rope "
        "from model_weights where run_id = ? and model_role = ?",
        [run_id, role],
    ).fetchone()
    names = ("parameters", "loaded", "unloaded", "unused", "embed_tokens", "lm_head", "tensors", "dtypes",
             "manifest_error", "manifest_ms", "declared_dtype", "runtime_dtype", "runtime_rope")
    facts = dict(zip(names, row))
    for key in ("unloaded", "unused", "dtypes", "runtime_rope"):
        facts[key] = json.loads(facts[key]) if facts[key] is not None else None
    return facts


def test_a_tensor_missing_from_the_drafter_checkpoint_is_named_while_vllm_serves(model_runs):
    con, results = model_runs
    result = results["missing"]
    assert result.ok, result.error  # vLLM loads it without a word
    [(code, severity, role, process, message, evidence, fix)] = _findings(con, result.run_id)
    parameter = "model.layers.0.mlp.down_proj.weight"  # vLLM names its EAGLE3 layer 0 (its attention layer is numbered after the target's)
    assert (code, severity, role, process) == ("DRAFT_WEIGHTS_UNLOADED", "error", "draft", "worker")
    evidence = json.loads(evidence)
    assert evidence["unloaded"] == [parameter] and evidence["unloaded_count"] == 1
    assert evidence["shared_with_target"] == {"embed_tokens": "target", "lm_head": "target"}
    assert parameter in message and "initial values" in message and "convert" in fix
    facts = _weights(con, result.run_id)
    assert facts["unloaded"] == [parameter] and facts["unused"] == []
    assert facts["loaded"] == facts["parameters"] - 3  # the shared embeddings and head, and the missing one
    assert facts["manifest_error"] is None and facts["tensors"] == 11  # the source's 12, less the one
    # `spectrace report` flags the drafter's row
    from spectrace.queries import report

    text = report.render(con, run_id=result.run_id)
    models = text[text.index("Models (checkpoint"):]
    draft_row = next(line for line in models.splitlines() if " draft " in line)
    assert draft_row.lstrip().startswith("!") and "target/target" in draft_row and "float32 -> float32" in draft_row


def test_an_eagle3_drafter_with_another_rotary_base_is_rope_differs(model_runs):
    con, results = model_runs
    result = results["rope"]
    assert result.ok, result.error
    [(code, severity, role, process, message, evidence, fix)] = _findings(con, result.run_id)
    assert (code, severity, role, process) == ("ROPE_DIFFERS", "info", "draft", "frontend")
    evidence = json.loads(evidence)
    assert evidence["differs"] == ["theta"] and evidence["settled_by"]
    assert (evidence["target"]["theta"], evidence["draft"]["theta"]) == (10000.0, 500000.0)
    assert fix.startswith("only if acceptance collapses") and '"rope_theta": 10000.0' in fix
    # the built rotary modules run what the configs said
    assert _weights(con, result.run_id)["runtime_rope"]["base"] == 500000.0
    assert _weights(con, result.run_id, "target")["runtime_rope"]["base"] == 10000.0


def test_a_bf16_drafter_next_to_an_fp16_target_runs_in_fp16(model_runs):
    con, results = model_runs
    result = results["bf16_in_fp16"]
    assert result.ok, result.error
    found = {code: (severity, json.loads(evidence), message, fix) for code, severity, _, _, message, evidence, fix in _findings(con, result.run_id)}
    assert set(found) == {"DRAFT_DTYPE_LOSSY", "ROPE_DIFFERS"}
    severity, evidence, message, fix = found["DRAFT_DTYPE_LOSSY"]
    assert severity == "error" and evidence["declared_dtype"] == "bfloat16" and evidence["runs_in"] == "float16"
    assert (evidence["checkpoint_dtype"], evidence["trained_from"]) == ("bfloat16", "checkpoint")
    assert "the target's dtype" in message and "--dtype bfloat16" in fix
    assert found["ROPE_DIFFERS"][0] == "info" and "first suspect" in found["ROPE_DIFFERS"][2]
    facts = _weights(con, result.run_id)
    assert (facts["declared_dtype"], facts["runtime_dtype"]) == ("bfloat16", "float16")
    assert facts["unloaded"] == [] and (facts["embed_tokens"], facts["lm_head"]) == ("own", "own")  # draft_model shares nothing


def test_healthy_pairs_have_no_model_finding_and_a_complete_load(traced_methods):
    store, results = traced_methods
    con = spectrace.store.open(store)
    for name in ("self", "seeded", "eagle3", "dflash", "mtp"):
        result = results[name]
        assert result.ok, result.error
        assert _findings(con, result.run_id) == [], name
        assert con.execute("select code from findings where run_id = ? and list_contains(?, code)",
                           [result.run_id, list(FIELD_CODES)]).fetchall() == [], name
        facts = _weights(con, result.run_id)
        # a drafter in the target's own checkpoint (self, mtp) leaves the target's tensors unjudged
        assert facts["unloaded"] == [] and facts["unused"] == (None if name in ("self", "mtp") else []), (name, facts)
        assert facts["loaded"] is not None and facts["manifest_error"] is None, name
        assert facts["runtime_dtype"] == "float32" and facts["runtime_rope"]["base"] == 10000.0, name
        assert facts["manifest_ms"] < 50, name  # headers only
    assert _weights(con, results["self"].run_id)["loaded"] == _weights(con, results["self"].run_id)["parameters"]


def test_each_drafter_field_case_is_named_while_vllm_serves_a_speculators_drafter(model_runs):
    con, results = model_runs
    result = results["fields"]
    assert result.ok, result.error
    assert result.tokens and len(result.tokens[0]) == 4  # the engine served
    codes = (*FIELD_CODES, "DRAFT_WEIGHTS_UNLOADED", "DRAFT_TENSORS_UNUSED", "TAP_DEFAULTED")
    rows = con.execute(
        "select code, severity, caused_by, process_role, evidence from findings where run_id = ? and list_contains(?, code)",
        [result.run_id, list(codes)],
    ).fetchall()
    found = sorted((code, severity, caused_by, role, json.loads(e).get("field")) for code, severity, caused_by, role, e in rows)
    assert found == [
        ("DRAFT_FIELD_CHANGED", "error", None, "frontend", "rope_scaling.rope_type"),
        ("DRAFT_FIELD_DEFAULT_DIFFERS", "error", None, "frontend", "norm_before_residual"),
        ("DRAFT_FIELD_DROPPED", "error", None, "frontend", "rope_scaling.factor"),
        ("DRAFT_FIELD_OVERRIDDEN", "error", None, "frontend", "transformer_layer_config.norm_before_fc"),
        ("DRAFT_SETTING_IGNORED", "warning", None, "worker", None),
        # the worker does not see the frontend's field findings: the unused norm weight stays a warning there
        ("DRAFT_TENSORS_UNUSED", "warning", None, "worker", None),
        # no DRAFT_WEIGHTS_UNLOADED for draft_id_to_target_id: vLLM zero-fills it, the map finding says what that does
        ("DRAFT_VOCAB_MAP_MISSING", "error", None, "frontend", None),
        ("TAP_DEFAULTED", "info", None, "worker", None),  # vLLM's default is the trainers': info until acceptance says
    ]
    evidence = {code: json.loads(e) for code, _, _, _, e in rows}
    assert evidence["DRAFT_FIELD_OVERRIDDEN"]["vllm_rule"].endswith("algos.update_eagle3")
    default = evidence["DRAFT_FIELD_DEFAULT_DIFFERS"]
    assert (default["resolved"], default["trainer_default"]) == (True, False)
    assert evidence["DRAFT_VOCAB_MAP_MISSING"]["d2t"] is None and evidence["DRAFT_VOCAB_MAP_MISSING"]["draft_vocab_size"] == 200
    assert evidence["DRAFT_TENSORS_UNUSED"]["unused"] == ["input_norm.weight"]
    taps = evidence["TAP_DEFAULTED"]
    assert taps["guessed"] is True and taps["tapped_ids"] == taps["default_ids"] == [2, 4, 5]
    ignored = evidence["DRAFT_SETTING_IGNORED"]
    assert (ignored["setting"], ignored["asked"], ignored["runs_with"]) == ("speculative_config.max_model_len", 256, 512)
    statuses = dict(con.execute(
        "select field, status from config_fields where run_id = ? and model_role = 'draft' and status <> 'ok'",
        [result.run_id]).fetchall())
    assert (statuses["transformer_layer_config.norm_before_fc"], statuses["norm_before_residual"]) == ("overridden", "default_differs")
