"""`spectrace report` shows the audit's own judgement (no vLLM: rows written by the real segment writer)."""

from __future__ import annotations

import spectrace.store
from spectrace import audit
from spectrace.testing import store_pipeline
from spectrace.queries import report

S, F = "sliding_attention", "full_attention"

GEMMA3 = {"model_type": "gemma3_text", "num_hidden_layers": 12, "sliding_window": 512, "sliding_window_pattern": 6}
DERIVED = ([S] * 5 + [F]) * 2


def _store(tmp_path, plans: list[audit.LayerPlan]):
    writer = store_pipeline(tmp_path, retention_s=0, compact_interval_s=0)
    writer.append("runs", {"run_id": "r1", "process_role": "frontend", "started_at": 1, "target_model": "gemma"})
    writer.extend("attention_layout", [{"run_id": "r1", "model_role": "target", **plan.as_row()} for plan in plans])
    writer.flush()
    return spectrace.store.open(tmp_path)


def _flags(text: str) -> list[int]:
    """Layer indices the report marks with "!" in the target's layout table."""
    section = text.split("Attention layout (target)")[1].split("Attention layout (draft)")[0]
    return [int(line.split()[1]) for line in section.splitlines() if line.strip().startswith("!")]


def test_report_and_audit_agree_on_pattern_derived_sliding_layers(tmp_path):
    plans = audit.layer_plans(GEMMA3, {**GEMMA3, "layer_types": DERIVED})
    for plan in plans:  # runs as resolved: 5 sliding(512) : 1 full, twice
        plan.runtime_type, plan.runtime_window = plan.resolved_type, plan.resolved_window
    assert audit.audit_layout("target", plans, set()) == []
    text = report.render(_store(tmp_path, plans))
    assert "Attention layout (target): 12 layers\n" in text
    assert _flags(text) == []


def test_report_marks_exactly_the_layers_the_audit_finds(tmp_path):
    plans = audit.layer_plans(GEMMA3, {**GEMMA3, "layer_types": DERIVED})
    for plan in plans:  # a runtime that ignores the derived layout
        plan.runtime_type, plan.runtime_window = "full", None
    findings = audit.audit_layout("target", plans, set())
    found = sorted(layer["layer_index"] for f in findings for layer in f.evidence["layers"])
    text = report.render(_store(tmp_path, plans))
    assert found == list(range(12))
    assert _flags(text) == found
    assert "12 mismatched (!)" in text
