"""The run judge (``spectrace.audit.run_judge``) on record batches: ``observe(RunBatch)`` in, whole findings rows
out, no vLLM.

The live modules (test_acceptance_curve_live, test_slices_live, test_dynamic_k_live, test_run_agreement) prove the
same rules on real engines through the drain; here each rule is fed what a drain hands it, batch by batch."""

from __future__ import annotations

import json

import numpy as np

from spectrace.audit.rules import acceptance
from spectrace.audit import codes
from spectrace.audit.curve import ContextBoundary
from spectrace.audit.batch import ACCEPTANCE_SPAN, Positions, RunBatch, RunObservation
from spectrace.audit.run_judge import ENGINE, WORKER, RunJudge


def _judge() -> RunJudge:
    return RunJudge(collapse_threshold=0.1, collapse_window_tokens=600, collapse_min_tokens=200)


def _positions(drafted: int, rate: float, k: int = 3) -> Positions:
    drafted_at = np.full(k, drafted, dtype=np.int64)
    return Positions(drafted_at, (drafted_at * rate).astype(np.int64), None)


def _observe(judge: RunJudge, run_id: str = "r", *, closing: bool = False, running: str | None = None, **parts):
    """One batch of one run's ``parts`` (RunObservation's fields): its findings, in the order said."""
    judged = judge.observe(RunBatch({run_id: RunObservation(**parts)}, closing=closing, running=running))
    assert judged.errors == []
    return [f for verdict in judged.verdicts for f in verdict.findings]


def test_collapse_is_said_once_then_recovery_once_as_whole_rows():
    judge = _judge()
    said = []
    for rate in (0.8, 0.8, 0.0, 0.0, 0.0, 0.0, 0.0, 0.9, 0.9, 0.9, 0.9):
        judged = judge.observe(RunBatch({"r": RunObservation(positions=_positions(100, rate))}))
        assert all(v.span == ACCEPTANCE_SPAN for v in judged.verdicts)  # each an event on an acceptance span
        said += [f.as_row() for verdict in judged.verdicts for f in verdict.findings]
    assert [(r["code"], r["severity"], r["component"], r["model_role"]) for r in said] == [
        (codes.ACCEPTANCE_COLLAPSE, "error", "verification", "draft"),
        (codes.ACCEPTANCE_RECOVERED, "info", "verification", "draft"),
    ]
    collapse = json.loads(said[0]["evidence"])
    assert collapse["position_0_rate"] < 0.1 and collapse["window_drafted_tokens"] >= 600
    assert said[0]["fix"] and said[0]["caused_by"] is None


def test_a_collapse_names_the_runs_root_causes_from_its_curve():
    judge = _judge()
    context = ([], {codes.SWA_DROPPED, codes.ROPE_DIFFERS}, "eagle3", False)
    findings = []
    for _ in range(4):
        findings += _observe(judge, context=context, positions=_positions(100, 0.0))
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
    context = ([boundary], {codes.SWA_DROPPED}, "dflash", False)
    assert _observe(judge, context=context) == []
    curve = judge.run("r").curve
    assert _observe(judge, context=([], set(), None, None)) == [] and judge.run("r").curve is curve  # built once
    below, above = acceptance.range_bounds(curve.edges)[:2]
    said = [_observe(judge, context=context, by_range=[(below, 3000, 2400), (above, 3000, 150)]) for _ in range(2)]
    assert [[f.code for f in findings] for findings in said] == [[codes.CONTEXT_CLIFF], []]  # said once
    assert said[0][0].evidence["rates_by_context"] == {"0-512": 0.8, "512-1k": 0.05}  # the ranges' rates ride along
    assert _observe(judge, "other", by_range=[(below, 3000, 0), (above, 3000, 0)]) == []  # no curve yet: nothing


def test_engine_and_worker_disagree_once_per_finished_run():
    judge = _judge()
    assert _observe(judge, "a", totals=[(ENGINE, None, 10, 5), (WORKER, 0, 10, 4), (WORKER, 1, 10, 5)]) == []
    assert _observe(judge, "b", totals=[(ENGINE, None, 6, 3), (WORKER, 0, 6, 3)]) == []  # not closing: not judged
    closed = judge.observe(RunBatch(closing=True, running="a"))  # "a" still running, "b" agrees
    assert closed.verdicts and [(v.run_id, v.findings) for v in closed.verdicts] == [("b", [])]
    findings = _observe(judge, "c", closing=True)
    assert [f.as_row()["evidence"] for f in findings] == [
        json.dumps({"engine_core": [10, 5], "rank": 0, "run_id": "a", "worker": [10, 4]}, sort_keys=True)
    ]
    assert findings[0].code == codes.VERIFY_DISAGREEMENT and findings[0].severity == "error"
    assert judge.observe(RunBatch(closing=True)).verdicts == []  # each run judged once


def test_not_paying_is_said_by_rank_0_only():
    judge = _judge()
    slow = dict(steps=60, step_ns=60 * 30_000_000, draft_ns=60 * 20_000_000, scheduled_tokens=60 * 8,
                scheduled_tokens_sq=60 * 64, tokens_x_verify_ns=60 * 8 * 10_000_000, requests=60 * 2,
                request_steps=120, tokens=130)
    said = []
    for _ in range(5):
        judged = judge.observe(RunBatch({"r": RunObservation(speculation={0: slow, 1: slow})}))
        said += [(v.role, v.rank, f.code) for v in judged.verdicts for f in v.findings]
    assert set(judged.windows) == {("r", 0), ("r", 1)} and judged.windows[("r", 1)]["speedup_estimate"] < 1
    assert said == [(WORKER, 0, codes.SPECULATION_NOT_PAYING)]  # rank 1 times the same steps: quiet


def test_a_low_slice_is_said_once_per_dimension():
    judge = _judge()
    requests = [({"temperature": "0" if i % 2 == 0 else ">1", "structured_output": "none"}, True, 100,
                 5 if i % 2 == 0 else 70) for i in range(40)]
    (gap,) = _observe(judge, k=3, method="eagle3", slices=requests)
    assert gap.code == codes.SLICE_ACCEPTANCE_LOW and gap.evidence["dimension"] == "temperature"
    assert _observe(judge, k=3, method="eagle3", slices=[({"temperature": "0"}, True, 100, 5)]) == []  # said once
    assert _observe(judge, k=3, method="eagle3") == []


def test_a_missing_vocabulary_map_causes_the_collapse_and_the_one_id_drafts():
    """The d2t-missing EAGLE-3 of the trained zoo: every draft on a wrong target id, so acceptance collapses; the
    drafts would only be named dummies where they are one id everywhere, and then as predictions on wrong ids."""
    judge = _judge()
    context = ([], {codes.DRAFT_VOCAB_MAP_MISSING}, "eagle3", False)
    findings = []
    for _ in range(4):
        findings += _observe(judge, context=context, positions=_positions(100, 0.0))
    (collapse,) = findings
    assert (collapse.severity, collapse.caused_by) == ("error", codes.DRAFT_VOCAB_MAP_MISSING)
    # the drafter's own mistakes in many ids (as measured): no dummy drafts
    assert _observe(judge, context=context, draft_shapes={
        "rows": 186, "repeated": 127, "repeated_drafted": 381, "repeated_accepted": 0,
        "by_token": {34: 83, 2: 9, 6: 8, 7: 8, 158: 6, 10: 4, 40: 2, 32: 2, 25: 2, 125: 2, 35: 1}}) == []
    # draft id 0 scored as target id 0 in every row: one id everywhere, caused by the map
    (dummy,) = _observe(judge, context=context, draft_shapes={
        "rows": 2000, "repeated": 2000, "repeated_drafted": 6000, "repeated_accepted": 0, "by_token": {0: 2000}})
    assert (dummy.code, dummy.severity, dummy.caused_by, dummy.fix) == (
        codes.DUMMY_DRAFTS, "warning", codes.DRAFT_VOCAB_MAP_MISSING, "")
    assert "predictions land on the wrong target ids" in dummy.message and "placeholder" not in dummy.message


def test_drafts_never_verified_count_requests_only_once_the_run_proposes():
    """The budget's requests (each allowed its last k drafts) count from the first flush with proposals: before it,
    nothing is compared (asynchronous scheduling, or the proposal hook off)."""
    from spectrace.audit.batch import Budget

    judge = _judge()
    assert _observe(judge, k=3, budget=Budget(0, 300), new_requests=50) == []  # no proposals: 50 requests not counted
    assert (judge.run("r").budget.requests, judge.run("r").budget.verified) == (0, 300)
    scheduler = dict(method="draft_model", k=3, max_num_seqs=256, max_num_batched_tokens=1024)
    (unverified,) = _observe(judge, k=3, scheduler=scheduler, budget=Budget(3000, 600), new_requests=10)
    assert unverified.code == codes.DRAFTS_UNVERIFIED
    # 3000 proposed, 900 verified, 10 requests x 3 allowed: the 50 requests before the proposals are not in it
    assert (unverified.evidence["requests"], unverified.evidence["unverified"]) == (10, 3000 - 900 - 30)
    assert unverified.evidence["token_budget"]["max_num_batched_tokens"] == 1024  # its cause, from the scheduler facts
    assert _observe(judge, k=3, scheduler=scheduler, budget=Budget(3000, 0)) == []  # said once per run


def test_a_rule_that_fails_is_reported_and_the_others_still_judge():
    from spectrace.audit.batch import Drift

    judge = _judge()
    said, errors = [], []
    for _ in range(4):  # a drift batch the detector cannot read, beside positions that collapse
        judged = judge.observe(RunBatch({"r": RunObservation(positions=_positions(100, 0.0),
                                                             drift=Drift(0, {("0-512", 0): None}, {}, 3))}))
        said += [f.code for v in judged.verdicts for f in v.findings]
        errors += [name for name, _ in judged.errors]
    assert said == [codes.ACCEPTANCE_COLLAPSE] and errors == ["drift"] * 4
