"""A hybrid target (Qwen3-Next: Gated DeltaNet linear-attention layers + full attention), the
architecture of the deployment that started spectrace: its linear layers are their own type
everywhere — the live store, `spectrace report`, `spectrace doctor` — and a healthy one has no
finding. Real vLLM on CPU (bf16, as vLLM's GDN kernel requires)."""

from __future__ import annotations

import json

import pytest

import spectrace.store
from spectrace import doctor
from spectrace.queries import report
from spectrace.testing.engine import EngineSpec, run_engines
from spectrace.testing.models import build_qwen3_next, build_tokenizer

pytestmark = pytest.mark.vllm

LAYER_TYPES = ["linear_attention"] * 3 + ["full_attention"]
EXPECTED = [("linear", "linear", "linear", "MambaSpec")] * 3 + [("full", "full", "full", "FullAttentionSpec")]


@pytest.fixture(scope="module")
def hybrid(scratch):
    root = scratch / "hybrid-models"
    path = build_qwen3_next(root / "qwen3-next", tokenizer_dir=build_tokenizer(root / "tokenizer"), layer_types=LAYER_TYPES)
    # the same checkpoint declaring its MTP head (Qwen3-Next ships one): config only, for doctor
    mtp = root / "qwen3-next-mtp"
    mtp.mkdir(exist_ok=True)
    (mtp / "config.json").write_text(json.dumps({**json.loads((path / "config.json").read_text()), "num_nextn_predict_layers": 1}))
    return path, mtp


@pytest.fixture(scope="module")
def served(hybrid, scratch, cache_root):
    path, _ = hybrid
    spec = EngineSpec(name="hybrid", target=str(path), max_tokens=8, prompts=["the quick brown fox", "a b c d e f g"],
                      extra_llm_kwargs={"dtype": "bfloat16"})
    store = scratch / "hybrid-store"
    traced = run_engines([spec], store=store, cache_root=cache_root, log_file=scratch / "hybrid.log")["hybrid"]
    untraced = run_engines([spec], store=None, traced=False, cache_root=cache_root, scratch=scratch)["hybrid"]
    return spectrace.store.open(store), traced, untraced


def test_linear_attention_layers_are_recorded_as_linear(served):
    con, traced, untraced = served
    assert traced.ok, traced.error
    assert traced.tokens == untraced.tokens
    rows = con.execute(
        "select declared_type, resolved_type, runtime_type, kv_cache_spec, runtime_window from attention_layout "
        "where run_id = ? and model_role = 'target' order by layer_index", [traced.run_id]
    ).fetchall()
    assert [row[:4] for row in rows] == EXPECTED
    assert {row[4] for row in rows} == {None}
    assert con.execute("select code from findings where run_id = ?", [traced.run_id]).fetchall() == []


def test_report_shows_linear_layers_and_no_mismatch(served):
    con, traced, _ = served
    text = report.render(con, run_id=traced.run_id)
    assert "Attention layout (target): 4 layers\n" in text  # no "mismatched (!)"
    assert text.count("linear") >= 9  # declared, resolved and runtime of three layers
    assert "Findings: none" in text


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_doctor_reads_the_hybrid_target_and_its_mtp_drafter(hybrid, runner):
    _, mtp = hybrid
    result = doctor.diagnose(str(mtp), str(mtp), method="mtp", runner=runner)
    assert result.method == "mtp"
    target = [(r["declared_type"], r["resolved_type"], r["runtime_type"], r["kv_cache_spec"]) for r in result.layout["target"]]
    assert target == EXPECTED
    # the MTP head's own layer is attention; the target's layer_types do not describe it
    assert [(r["declared_type"], r["runtime_type"]) for r in result.layout["draft"]] == [("unspecified", "full")]
    assert result.findings == [], [f.code for f in result.findings]
