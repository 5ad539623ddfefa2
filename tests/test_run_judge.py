"""The run judge (``spectrace.audit.run_judge``) on record batches: counts in, whole findings rows out, no vLLM.

The live modules (test_acceptance_curve_live, test_slices_live, test_dynamic_k_live, test_run_agreement) prove the
same rules on real engines through the drain; here each rule is fed what a drain hands it, batch by batch."""

from __future__ import annotations

import json

import numpy as np

from spectrace.audit.rules import acceptance
from spectrace.audit import codes
from spectrace.audit.curve import ContextBoundary
from spectrace.audit.run_judge import ENGINE, WORKER, RunJudge


def _judge() -> RunJudge:
    return RunJudge(collapse_threshold=0.1, collapse_window_tokens=600, collapse_min_tokens=200)


def _batch(drafted: int, rate: float, k: int = 3) -> tuple[np.ndarray, np.ndarray]:
    drafted_at = np.full(k, drafted, dtype=np.int64)
    return drafted_at, (drafted_at * rate).astype(np.int64)


def test_collapse_is_said_once_then_recovery_once_as_whole_rows():
    judge = _judge()
    said = []
    for rate in (0.8, 0.8, 0.0, 0.0, 0.0, 0.0, 0.0, 0.9, 0.9, 0.9, 0.9):
        said += [f.as_row() for f in judge.observe_positions("r", *_batch(100, rate))]
    assert [(r["code"], r["severity"], r["component"], r["model_role"]) for r in said] == [
        (codes.ACCEPTANCE_COLLAPSE, "error", "verification", "draft"),
        (codes.ACCEPTANCE_RECOVERED, "info", "verification", "draft"),
    ]
    collapse = json.loads(said[0]["evidence"])
    assert collapse["position_0_rate"] < 0.1 and collapse["window_drafted_tokens"] >= 600
    assert said[0]["fix"] and said[0]["caused_by"] is None


def test_a_collapse_names_the_runs_root_causes_from_its_curve():
    judge = _judge()
    judge.curve("r", lambda: ([], {codes.SWA_DROPPED, codes.ROPE_DIFFERS}, "eagle3", False))
    findings = []
    for _ in range(4):
        findings += judge.observe_positions("r", *_batch(100, 0.0))
    (collapse, raised) = findings
    # a dropped window costs nothing below it, but a collapse past it is its doing first
    assert collapse.evidence["likely_causes"] == [codes.SWA_DROPPED, codes.ROPE_DIFFERS]
    assert collapse.caused_by == codes.SWA_DROPPED and "likely cause: SWA_DROPPED, ROPE_DIFFERS" in collapse.message
    # the RoPE difference was info (the configs could not tell): the collapse raises it to a warning
    assert (raised.code, raised.severity, raised.evidence["raised_by"]) == (codes.ROPE_DIFFERS, "warning", codes.ACCEPTANCE_COLLAPSE)
    assert judge.run("r").curve.drafted_at.tolist() == [400, 400, 400]  # the curve got every batch's positions


def test_a_context_cliff_is_said_once_per_run():
    boundary = ContextBoundary(tokens=512, model_role="draft", field="sliding_window", explained_by=(codes.SWA_DROPPED,))
    judge = _judge()
    curve, new = judge.curve("r", lambda: ([boundary], {codes.SWA_DROPPED}, "dflash", False))
    assert new and not judge.curve("r", lambda: ([], set(), None, None))[1]
    below, above = acceptance.range_bounds(curve.edges)[:2]
    for _ in range(2):
        curve.add_range(below, np.array([3000]), np.array([2400]))
        curve.add_range(above, np.array([3000]), np.array([150]))
        findings = judge.curve_findings("r")
        if findings:
            first = findings
    assert [f.code for f in first] == [codes.CONTEXT_CLIFF]
    assert first[0].evidence  # the ranges' rates ride along
    assert judge.curve_findings("r") == []  # said once
    assert judge.curve_findings("other") == []  # a run with no curve yet judges nothing


def test_engine_and_worker_disagree_once_per_finished_run():
    judge = _judge()
    judge.observe_counts(ENGINE, "a", None, 10, 5)
    judge.observe_counts(WORKER, "a", 0, 10, 4)
    judge.observe_counts(WORKER, "a", 1, 10, 5)
    judge.observe_counts(ENGINE, "b", None, 6, 3)
    judge.observe_counts(WORKER, "b", 0, 6, 3)
    assert judge.agreement(exclude="a") == [("b", [])]  # "a" still running
    ((run, findings),) = judge.agreement()
    assert run == "a" and [f.as_row()["evidence"] for f in findings] == [
        json.dumps({"engine_core": [10, 5], "rank": 0, "run_id": "a", "worker": [10, 4]}, sort_keys=True)
    ]
    assert findings[0].code == codes.VERIFY_DISAGREEMENT and findings[0].severity == "error"
    assert judge.agreement() == []


def test_not_paying_is_said_by_rank_0_only():
    judge = _judge()
    slow = dict(steps=60, step_ns=60 * 30_000_000, draft_ns=60 * 20_000_000, scheduled_tokens=60 * 8,
                scheduled_tokens_sq=60 * 64, tokens_x_verify_ns=60 * 8 * 10_000_000, requests=60 * 2,
                request_steps=120, tokens=130)
    ranks = {0: [], 1: []}
    for _ in range(5):
        for rank in ranks:
            window, findings = judge.observe_speculation("r", rank, slow)
            ranks[rank] += findings
    assert window is not None and window["speedup_estimate"] < 1
    assert [f.code for f in ranks[0]] == [codes.SPECULATION_NOT_PAYING] and ranks[1] == []


def test_a_low_slice_is_said_once_per_dimension():
    judge = _judge()
    run_slices = judge.run("r").slices
    for i in range(40):
        low = i % 2 == 0
        run_slices.add({"temperature": "0" if low else ">1", "structured_output": "none"}, True, 100, 5 if low else 70)
    (gap,) = judge.slice_findings("r", k=3, method="eagle3")
    assert gap.code == codes.SLICE_ACCEPTANCE_LOW and gap.evidence["dimension"] == "temperature"
    run_slices.add({"temperature": "0"}, True, 100, 5)
    assert judge.slice_findings("r", k=3, method="eagle3") == []
    assert judge.slice_findings("r", k=3, method="eagle3") == []  # nothing new: not judged again


def test_a_missing_vocabulary_map_causes_the_collapse_and_the_one_id_drafts():
    """The d2t-missing EAGLE-3 of the trained zoo: every draft on a wrong target id, so acceptance collapses; the
    drafts would only be named dummies where they are one id everywhere, and then as predictions on wrong ids."""
    judge = _judge()
    curve, _ = judge.curve("r", lambda: ([], {codes.DRAFT_VOCAB_MAP_MISSING}, "eagle3", False))
    findings = []
    for _ in range(4):
        findings += judge.observe_positions("r", *_batch(100, 0.0))
    (collapse,) = findings
    assert (collapse.severity, collapse.caused_by) == ("error", codes.DRAFT_VOCAB_MAP_MISSING)
    # the drafter's own mistakes in many ids (as measured): no dummy drafts
    curve.add_shapes({"rows": 186, "repeated": 127, "repeated_drafted": 381, "repeated_accepted": 0,
                      "by_token": {34: 83, 2: 9, 6: 8, 7: 8, 158: 6, 10: 4, 40: 2, 32: 2, 25: 2, 125: 2, 35: 1}})
    assert judge.curve_findings("r") == []
    # draft id 0 scored as target id 0 in every row: one id everywhere, caused by the map
    curve.add_shapes({"rows": 2000, "repeated": 2000, "repeated_drafted": 6000, "repeated_accepted": 0, "by_token": {0: 2000}})
    (dummy,) = judge.curve_findings("r")
    assert (dummy.code, dummy.severity, dummy.caused_by, dummy.fix) == (
        codes.DUMMY_DRAFTS, "warning", codes.DRAFT_VOCAB_MAP_MISSING, "")
    assert "predictions land on the wrong target ids" in dummy.message and "placeholder" not in dummy.message
