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


def test_report_shows_acceptance_by_request_slice_prefix_hits_and_drafts(tmp_path):
    """The views over request_slices / request_counts / draft_budget as the drain writes them."""
    import json

    writer = store_pipeline(tmp_path, retention_s=0, compact_interval_s=0)
    writer.append("runs", {"run_id": "r1", "process_role": "frontend", "started_at": 1, "target_model": "t"})
    for i in range(4):
        penalty = "1.5" if i % 2 else "off"
        writer.append("request_slices", {"run_id": "r1", "process_role": "engine_core", "ts": 2, "request_id": f"q{i}",
                                         "repetition_penalty": 1.5 if i % 2 else 1.0, "prompt_tokens": 600,
                                         "cached_tokens": 256 if i >= 2 else 0, "block_size": 256, "eagle_block_drop": True,
                                         "slice": json.dumps({"repetition_penalty": penalty, "temperature": "greedy"})})
        writer.append("request_counts", {"run_id": "r1", "process_role": "engine_core", "ts": 3, "request_id": f"q{i}",
                                         "request_steps": 10, "drafted": 30, "accepted": 6 if i % 2 else 30})
    writer.append("draft_budget", {"run_id": "r1", "process_role": "engine_core", "ts": 3, "proposed": 150, "verified": 120,
                                   "steps": 10, "new_requests": 4})
    for band, k, steps, drafted, accepted in (("1", 3, 4, 12, 9), ("5-8", 1, 6, 36, 18)):  # dynamic speculation
        writer.append("step_shapes", {"run_id": "r1", "process_role": "engine_core", "ts": 3, "batch_band": band, "k": k,
                                      "steps": steps, "request_steps": drafted // k, "drafted": drafted, "accepted": accepted})
    writer.flush()
    con = spectrace.store.open(tmp_path)
    rows = con.execute("select dimension, value, requests, drafted, accepted, rate, rest_rate from acceptance_by_slice "
                       "order by dimension, value").fetchall()
    assert rows == [("repetition_penalty", "1.5", 2, 60, 12, 0.2, 1.0), ("repetition_penalty", "off", 2, 60, 60, 1.0, 0.2),
                    ("temperature", "greedy", 4, 120, 72, 0.6, None)]
    hits = con.execute("select requests, requests_hit, cached_tokens, dropped_tokens_at_least, token_hit_rate, "
                       "token_hit_rate_without_drop_at_least from prefix_cache_hits").fetchone()
    assert hits == (4, 2, 512, 512, 512 / 2400, 1024 / 2400)
    text = report.render(con)
    section = text.split("Acceptance by request slice")[1]
    assert "repetition_penalty" in section and "20.0%" in section and "temperature" not in section  # one value: no row
    assert "prefix cache: 2 of 4 requests hit, 512 of 2400 prompt tokens restored" in text
    assert "drafts: 150 proposed, 120 verified (20.0% not" in text
    shapes = text.split("The k each batch size drafted")[1].splitlines()
    assert [line.split()[:3] for line in shapes[3:5]] == [["1", "3", "4"], ["5-8", "1", "6"]]


def test_report_names_every_hook_that_did_not_install_but_not_the_retired(tmp_path):
    """A vLLM outside the tested range: the hooks whose sites no longer fit are named with the reason; the V1
    runner's hooks that 0.34 removed on purpose are not failures."""
    writer = store_pipeline(tmp_path, retention_s=0, compact_interval_s=0)
    writer.append("runs", {"run_id": "r1", "process_role": "frontend", "started_at": 1, "target_model": "t"})
    rows = [("engine_core.verify", "unsupported", "vllm 0.35.0: ModelRunnerOutput has no req_ids"),
            ("worker.load_model", "missing", "vllm.v1.worker.gpu_worker has no Worker"),
            ("worker.verify", "retired", "vllm 0.35.0: vLLM 0.34 removed the V1 model runner"),
            ("frontend.get_config", "installed", "untested on vllm 0.35.0 (tested >=0.30, <0.35); its site fits")]
    writer.extend("hooks", [{"run_id": "r1", "process_role": "process", "hook": h, "status": s, "detail": d}
                            for h, s, d in rows])
    writer.flush()
    text = report.render(spectrace.store.open(tmp_path))
    section = text.split("Hooks not installed (that part of the audit is unavailable):\n")[1].split("\n\n")[0]
    assert section.splitlines() == ["  engine_core.verify (unsupported): vllm 0.35.0: ModelRunnerOutput has no req_ids",
                                    "  worker.load_model (missing): vllm.v1.worker.gpu_worker has no Worker"]


def test_report_on_an_engine_that_never_reached_a_step_says_so_and_points_to_vllms_log(tmp_path):
    """A run whose engine died while starting (its runs row and hooks written, no step, no layout): the report says
    so, not only "not recorded"; a run that stepped never gets the line."""
    writer = store_pipeline(tmp_path, retention_s=0, compact_interval_s=0)
    writer.append("runs", {"run_id": "dead", "process_role": "frontend", "started_at": 1, "target_model": "t",
                           "method": "dflash", "num_speculative_tokens": 3})
    writer.flush()
    text = report.render(spectrace.store.open(tmp_path), run_id="dead")
    assert "The engine never reached a step" in text and "its log has the error" in text and "run dead" in text
    writer.append("runs", {"run_id": "alive", "process_role": "frontend", "started_at": 2, "target_model": "t",
                           "method": "dflash", "num_speculative_tokens": 3})
    writer.extend("attention_layout", [{"run_id": "alive", "model_role": "target", **plan.as_row()}
                                       for plan in audit.layer_plans(GEMMA3, {})])
    writer.flush()
    assert "never reached a step" not in report.render(spectrace.store.open(tmp_path), run_id="alive")


def test_report_says_which_findings_a_later_one_cleared(tmp_path):
    """One rule of what is active (spectrace.audit.rules.active): the collapse a recovery ended is said cleared."""
    writer = store_pipeline(tmp_path, retention_s=0, compact_interval_s=0)
    writer.append("runs", {"run_id": "r1", "process_role": "engine_core", "started_at": 1, "target_model": "t"})
    writer.extend("findings", [
        {"run_id": "r1", "ts": 10, "code": "ACCEPTANCE_COLLAPSE", "severity": "error", "model_role": "draft",
         "message": "acceptance collapsed", "evidence": "{}"},
        {"run_id": "r1", "ts": 20, "code": "ACCEPTANCE_RECOVERED", "severity": "info", "model_role": "draft",
         "message": "acceptance recovered", "evidence": "{}", "caused_by": "ACCEPTANCE_COLLAPSE"},
    ])
    writer.flush()
    lines = report.render(spectrace.store.open(tmp_path), run_id="r1").splitlines()
    findings = lines[next(i for i, line in enumerate(lines) if line.startswith("Findings:")):][:3]
    assert findings == ["Findings: 1 error(s), 0 warning(s), 1 info; 1 cleared since, not active",
                        "  ERROR   ACCEPTANCE_COLLAPSE [draft] acceptance collapsed (cleared since: ACCEPTANCE_RECOVERED)",
                        "          ↳ ACCEPTANCE_RECOVERED (info): acceptance recovered"]
