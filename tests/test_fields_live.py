"""Every drafter field vLLM drops or replaces, the vocabulary map and the guessed taps (issue #35), named while
vLLM 0.32 serves a speculators-format EAGLE-3 drafter on CPU.

One engine carries every case (the frontend's field audit and vocabulary map, the worker's taps): a drafter
written in the JSON shape the speculators library writes (``build_speculators_eagle3``) with its norms
declared inside ``transformer_layer_config``, ``norm_before_residual`` left out, ``rope_scaling`` at the top
level, a 200-token draft vocabulary without ``d2t``, and no tap ids. Its clean twins are judged by doctor
(test_doctor_fields.py) and the session's healthy engines (test_model_audit_live.py) stay quiet.
"""

from __future__ import annotations

import json

import pytest

import spectrace.store
from spectrace.testing.engine import EngineSpec, run_engines

pytestmark = pytest.mark.vllm

CODES = ("DRAFT_FIELD_DROPPED", "DRAFT_FIELD_CHANGED", "DRAFT_FIELD_OVERRIDDEN", "DRAFT_FIELD_DEFAULT_DIFFERS",
         "DRAFT_VOCAB_MAP_MISSING", "DRAFT_VOCAB_MAP_INVALID", "DRAFT_WEIGHTS_UNLOADED", "DRAFT_TENSORS_UNUSED",
         "TAP_DEFAULTED")  # fmt: skip


@pytest.fixture(scope="module")
def fields_run(zoo, scratch, cache_root):
    from spectrace.testing.models import build_speculators_eagle3

    draft = build_speculators_eagle3(
        scratch / "fields-live" / "speculators-eagle3", target_dir=zoo["target"], aux_layer_ids=None,
        layer={"norm_before_fc": True}, top={"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        draft_vocab_size=200, d2t="missing",
    )
    spec = EngineSpec(name="fields", target=zoo["target"], max_tokens=4, prompts=["the quick brown fox"],
                      speculative={"method": "eagle3", "model": str(draft), "num_speculative_tokens": 2})
    store = scratch / "fields-live-store"
    results = run_engines([spec], store=store, cache_root=cache_root, log_file=scratch / "fields-live.log")
    return spectrace.store.open(store), results["fields"]


def test_each_field_case_is_named_while_vllm_serves_the_drafter(fields_run):
    con, result = fields_run
    assert result.ok, result.error
    assert result.tokens and len(result.tokens[0]) == 4  # the engine served
    rows = con.execute(
        "select code, severity, caused_by, process_role, evidence from findings "
        "where run_id = ? and list_contains(?, code) order by code, evidence",
        [result.run_id, list(CODES)],
    ).fetchall()
    found = sorted((code, severity, caused_by, role, json.loads(evidence).get("field")) for code, severity, caused_by, role, evidence in rows)
    assert found == [
        ("DRAFT_FIELD_CHANGED", "error", None, "frontend", "rope_scaling.rope_type"),
        ("DRAFT_FIELD_DEFAULT_DIFFERS", "error", None, "frontend", "norm_before_residual"),
        ("DRAFT_FIELD_DROPPED", "error", None, "frontend", "rope_scaling.factor"),
        ("DRAFT_FIELD_OVERRIDDEN", "error", None, "frontend", "transformer_layer_config.norm_before_fc"),
        # the worker cannot see the frontend's field findings: the unused norm weight stays a warning there
        ("DRAFT_TENSORS_UNUSED", "warning", None, "worker", None),
        ("DRAFT_VOCAB_MAP_MISSING", "error", None, "frontend", None),
        ("TAP_DEFAULTED", "warning", None, "worker", None),
    ]
    evidence = {code: json.loads(e) for code, _, _, _, e in rows}
    assert evidence["DRAFT_FIELD_OVERRIDDEN"]["vllm_rule"].endswith("algos.update_eagle3")
    assert (evidence["DRAFT_FIELD_DEFAULT_DIFFERS"]["resolved"], evidence["DRAFT_FIELD_DEFAULT_DIFFERS"]["trainer_default"]) == (True, False)
    assert evidence["DRAFT_VOCAB_MAP_MISSING"]["d2t"] is None and evidence["DRAFT_VOCAB_MAP_MISSING"]["draft_vocab_size"] == 200
    assert evidence["DRAFT_TENSORS_UNUSED"]["unused"] == ["input_norm.weight"]
    taps = evidence["TAP_DEFAULTED"]
    assert taps["guessed"] is True and taps["tapped_ids"] == taps["default_ids"] == [2, 4, 5]
    # the field rows of the config audit, beside the findings
    statuses = dict(con.execute(
        "select field, status from config_fields where run_id = ? and model_role = 'draft' and status <> 'ok'",
        [result.run_id]).fetchall())
    assert statuses["transformer_layer_config.norm_before_fc"] == "overridden"
    assert statuses["norm_before_residual"] == "default_differs"
