"""The config-resolution and attention-layout audit on real vLLM runs.

The CPU build uses vLLM's V1 model runner, which refuses drafters that mix
sliding and full layers, so the live drafters here are all-sliding or all-full.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm

WINDOW = 64  # the window the audit drafters declare (conftest.audit_runs)


def _findings(con, run_id):
    return con.execute(
        "select code, severity, model_role, caused_by, message, fix from findings where run_id = ? order by ts",
        [run_id],
    ).fetchall()


def _layout(con, run_id, role="draft"):
    return con.execute(
        "select declared_type, declared_window, resolved_type, resolved_window, runtime_type, runtime_window, "
        "kv_cache_spec, causal from attention_layout where run_id = ? and model_role = ? order by layer_index",
        [run_id, role],
    ).fetchall()


def test_window_only_is_swa_dropped_and_runs_full(audit_runs):
    con, results, _ = audit_runs
    result = results["window_only"]
    assert result.ok, result.error
    findings = _findings(con, result.run_id)
    errors = [f for f in findings if f[1] == "error"]
    assert [e[0] for e in errors] == ["SWA_DROPPED"]
    assert "use_sliding_window is absent" in errors[0][4] and "use_sliding_window" in errors[0][5]
    consequences = {f[0]: f for f in findings if f[3] == "SWA_DROPPED"}
    assert set(consequences) == {"LAYER_TYPES_DEFAULTED", "FIELD_CHANGED", "LAYOUT_MISMATCH"}
    assert all(f[1] == "info" for f in consequences.values())
    layout = _layout(con, result.run_id)
    assert layout == [("unspecified", WINDOW, "full", None, "full", None, "FullAttentionSpec", False)]


def test_each_finding_is_an_event_on_a_span_under_the_span_it_was_read_in(audit_runs):
    """The collector judges what the hooks read: the frontend's findings hang on a ``spectrace.audit`` span under the
    run's root span, the worker's under its ``spectrace.worker.load_model`` span; each finding is one event there."""
    import json

    con, results, _ = audit_runs
    # every run its own trace, and no span id twice (vLLM seeds `random` at each engine start: the SDK's default ids
    # repeated, and three runs of this one process shared a trace)
    assert con.execute("select trace_id from spans group by trace_id having count(distinct run_id) > 1").fetchall() == []
    assert con.execute("select span_id from spans group by span_id having count(*) > 1").fetchall() == []
    run_id = results["window_only"].run_id
    spans = {span_id: (name, parent, json.loads(attributes), json.loads(events or "[]")) for span_id, name, parent,
             attributes, events in con.execute("select span_id, name, parent_span_id, attributes, events from spans "
                                               "where run_id = ?", [run_id]).fetchall()}
    audits = {span_id: span for span_id, span in spans.items() if span[0] == "spectrace.audit"}
    by_role = {}
    for name, parent, attributes, events in audits.values():
        role = attributes["spectrace.process.role"]
        assert spans[parent][0] == {"frontend": "spectrace.run", "worker": "spectrace.worker.load_model"}[role]
        by_role.setdefault(role, []).extend(e["name"].removeprefix("spectrace.finding.") for e in events)
    rows = {}
    for code, role in con.execute("select code, process_role from findings where run_id = ?", [run_id]).fetchall():
        rows.setdefault(role, []).append(code)
    assert {role: sorted(codes) for role, codes in by_role.items()} == {
        role: sorted(codes) for role, codes in rows.items() if role in ("frontend", "worker")}
    assert "SWA_DROPPED" in by_role["frontend"] and "LAYOUT_MISMATCH" in by_role["worker"]


def test_refused_drafter_still_leaves_its_findings(audit_runs):
    con, results, _ = audit_runs
    result = results["layer_types_no_flag"]
    assert not result.ok and "window size" in result.error
    findings = _findings(con, result.run_id)
    codes = {f[0]: f for f in findings}
    assert codes["SWA_DROPPED"][1] == "error"
    assert codes["FIELD_CHANGED"][3] == "SWA_DROPPED"
    load = codes["LOAD_FAILED"]
    assert load[1] == "info" and load[3] == "SWA_DROPPED"
    assert "use_sliding_window" in load[4]  # the cause in config terms
    assert [f for f in findings if f[1] == "error"] == [codes["SWA_DROPPED"]]


@pytest.mark.parametrize("name", ["flagged", "swa_window_size"])
def test_correct_sliding_drafter_slides(audit_runs, name):
    con, results, _ = audit_runs
    result = results[name]
    assert result.ok, result.error
    # the drafter declares no causality: vLLM made its sliding layer causal, and says so -- as info (the severity
    # policy: from configs alone "trained so" cannot be told from "misdeclared"; a collapse after position 0 raises it)
    [(code, severity, role, caused_by, message, _)] = _findings(con, result.run_id)
    assert (code, severity, role, caused_by) == ("CAUSAL_INFERRED", "info", "draft", None)
    assert "every layer causal" in message
    [(declared, declared_w, resolved, resolved_w, runtime, runtime_w, spec, causal)] = _layout(con, result.run_id)
    assert (declared, declared_w, runtime, runtime_w) == ("sliding", WINDOW, "sliding", WINDOW)
    assert (resolved, resolved_w) == ("sliding", WINDOW)
    assert spec == "SlidingWindowSpec" and causal is True


def test_target_audit_is_clean(audit_runs):
    con, results, _ = audit_runs
    result = results["flagged"]
    target = _layout(con, result.run_id, "target")
    assert len(target) == 8
    assert {row[4] for row in target} == {"full"}
    fields = con.execute(
        "select count(*) from config_fields where run_id = ? and model_role = 'target'", [result.run_id]
    ).fetchone()[0]
    assert fields > 0


def test_dflash_in_plain_directory_without_method_is_method_mismatch(audit_runs):
    con, results, _ = audit_runs
    result = results["no_method"]
    findings = _findings(con, result.run_id)
    codes = {f[0]: f for f in findings}
    assert codes["METHOD_MISMATCH"][1] == "error"
    assert "draft_model" in codes["METHOD_MISMATCH"][4]
    assert codes["METHOD_INFERRED"][3] == "METHOD_MISMATCH"
    method = con.execute("select method, method_inferred from runs where run_id = ?", [result.run_id]).fetchone()
    assert method == ("draft_model", True)
