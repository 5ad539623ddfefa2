"""Which findings are active (spectrace.audit.rules.active): the one rule /metrics, top and report read."""

from __future__ import annotations

from spectrace.audit import codes
from spectrace.audit.rules import active
from spectrace.audit.rules.active import Status

COLLAPSE, RECOVERED = codes.ACCEPTANCE_COLLAPSE, codes.ACCEPTANCE_RECOVERED


def row(code, role="draft", severity="error"):
    return {"code": code, "model_role": role, "severity": severity}


def test_a_recovery_clears_its_collapse_and_is_itself_never_active():
    rows = [row(codes.SWA_DROPPED), row(COLLAPSE), row(RECOVERED, severity="info")]
    assert active.statuses(rows) == [Status(True), Status(False, cleared_by=RECOVERED), Status(False, clears=COLLAPSE)]
    assert [r["code"] for r in active.active(rows)] == [codes.SWA_DROPPED]


def test_a_collapse_after_the_recovery_is_active_again():
    rows = [row(COLLAPSE), row(RECOVERED, severity="info"), row(COLLAPSE)]
    assert [s.active for s in active.statuses(rows)] == [False, False, True]
    assert active.active(rows) == [rows[2]]


def test_a_recovery_clears_only_its_own_model_role_and_nothing_before_a_collapse():
    rows = [row(RECOVERED, "draft", "info"), row(COLLAPSE, "target"), row(COLLAPSE, "draft"), row(RECOVERED, "target", "info")]
    assert active.statuses(rows) == [Status(False, clears=COLLAPSE), Status(False, cleared_by=RECOVERED),
                                     Status(True), Status(False, clears=COLLAPSE)]
    # a missing role is one role (the store's NULL, the gauge's "")
    assert active.active([row(COLLAPSE, None), row(RECOVERED, "", "info")]) == []


def test_the_latest_row_of_a_code_and_role_is_the_one_that_stands():
    rows = [row(codes.TAP_DEFAULTED, severity="info"), row(codes.TAP_DEFAULTED, severity="warning")]
    assert active.active(rows) == [rows[1]]
    assert active.statuses(rows) == [Status(False), Status(True)]


def test_effect_is_what_the_metrics_sink_applies():
    assert active.effect(RECOVERED) == ((COLLAPSE,), False)
    assert active.effect(COLLAPSE) == ((COLLAPSE,), True)
    assert active.effect(codes.SPECULATION_NOT_PAYING) == ((codes.SPECULATION_NOT_PAYING,), True)
    assert set(active.CLEARS) <= set(codes.REGISTRY)
    assert {c for cleared in active.CLEARS.values() for c in cleared} <= set(codes.REGISTRY)


def test_a_restoration_clears_the_time_signature_it_ends_and_nothing_else():
    step, decay, restored = codes.ACCEPTANCE_STEP_CHANGE, codes.ACCEPTANCE_DECAY, codes.ACCEPTANCE_RESTORED
    rows = [row(COLLAPSE), row(step, severity="warning"), row(restored, severity="info")]
    assert active.statuses(rows) == [Status(True), Status(False, cleared_by=restored), Status(False, clears=step)]
    rows = [row(decay, severity="warning"), row(restored, severity="info"), row(step, severity="warning")]
    assert active.statuses(rows) == [Status(False, cleared_by=restored), Status(False, clears=decay), Status(True)]
    assert active.effect(restored) == ((step, decay), False)
