"""Dynamic speculation whose k flips between steps, without vLLM: the pure rule
(``spectrace.audit.dynamic_k``) on facts captured from a real run, the drain counting k switches on
whole records (the shapes vLLM 0.32's scheduler hands ``update_from_output``) through an in-memory
sink, the metrics it feeds, the store's column and the report. The live twin:
tests/test_dynamic_k_live.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource

import spectrace.store
from spectrace import audit
from spectrace.audit import codes
from spectrace.audit.dynamic_k import THRASHING_MIN_SWITCHES, THRASHING_SHARE
from spectrace.queries import report
from spectrace.sinks.metrics import Metrics
from spectrace.testing import memory_runtime, store_pipeline
from spectrace.recorder import runtime
from spectrace.recorder.verify import EngineStep
from spectrace.recorder.verify.capture import Proposal

RUN = "run-dynamic-k"
SCHEDULE = [(1, 3, 1), (4, 4, 4)]

# Captured from tests/test_dynamic_k_live.py's thrashing engine (max_num_seqs 4, max_num_batched_tokens 14, the
# schedule above, k 4, the target drafting for itself): (batch band, k) -> (verified steps, k switches), and the
# switches by (k before, k after).
THRASHING_SHAPES = {("2", 1): (25, 2), ("2", 4): (21, 19), ("3-4", 1): (8, 5), ("3-4", 3): (12, 12), ("3-4", 4): (2, 0)}
THRASHING_TRANSITIONS = {(3, 4): 12, (4, 3): 12, (1, 4): 7, (4, 1): 7}
# ... and its twin, whose batch crosses the threshold of [(1, 2, 1), (3, 4, 4)] once (half the requests finish early)
ONCE_SHAPES = {("2", 1): (9, 1), ("2", 4): (1, 0), ("3-4", 4): (5, 0)}
ONCE_TRANSITIONS = {(4, 1): 1}


# -- pure: the rule ----------------------------------------------------------------------


def test_rule_names_the_captured_thrashing_run():
    ev = audit.k_thrashing(THRASHING_SHAPES, THRASHING_TRANSITIONS, SCHEDULE)
    assert (ev["verified_steps"], ev["k_switches"], ev["share"]) == (68, 38, 0.5588)
    assert ev["k_steps"] == {"1": 33, "3": 12, "4": 23}
    assert ev["batch_bands"] == ["2", "3-4"]
    assert list(ev["transitions"].items()) == [("3->4", 12), ("4->3", 12), ("1->4", 7), ("4->1", 7)]  # most first
    assert [(s["batch_band"], s["k"], s["k_switches"]) for s in ev["switched_shapes"]] == [
        ("2", 1, 2), ("2", 4, 19), ("3-4", 1, 5), ("3-4", 3, 12)]  # the shape that never switched is left out
    assert ev["num_speculative_tokens_per_batch_size"] == [[1, 3, 1], [4, 4, 4]]
    json.dumps(ev)  # stored as the finding's evidence


def test_rule_is_quiet_for_the_twin_a_static_k_and_below_either_bound():
    assert audit.k_thrashing(ONCE_SHAPES, ONCE_TRANSITIONS, [(1, 2, 1), (3, 4, 4)]) is None
    assert audit.k_thrashing(THRASHING_SHAPES, THRASHING_TRANSITIONS, None) is None  # static k: not this rule's
    assert audit.k_thrashing(THRASHING_SHAPES, THRASHING_TRANSITIONS, []) is None
    n = THRASHING_MIN_SWITCHES
    at_bounds = {("2", 1): (int(n / THRASHING_SHARE), n)}  # 20 of 80: both bounds met exactly
    assert audit.k_thrashing(at_bounds, {(4, 1): n}, SCHEDULE)["share"] == THRASHING_SHARE
    assert audit.k_thrashing({("2", 1): (int(n / THRASHING_SHARE) + 1, n)}, {(4, 1): n}, SCHEDULE) is None  # 20 of 81
    assert audit.k_thrashing({("2", 1): (n - 1, n - 1)}, {(4, 1): n - 1}, SCHEDULE) is None  # every step, but 19


def test_finding_carries_the_drafts_never_verified_and_the_budget():
    ev = audit.k_thrashing(THRASHING_SHAPES, THRASHING_TRANSITIONS, SCHEDULE)
    [short] = audit.token_budget_findings(method="draft_model", k=4, max_num_seqs=4, max_num_batched_tokens=14,
                                          dynamic_k=SCHEDULE)
    f = audit.thrashing_finding(ev, {"proposed": 446, "verified": 323, "requests": 8, "num_speculative_tokens": 4}, [short],
                                max_num_seqs=4, max_num_batched_tokens=14)
    assert (f.code, f.severity, f.component, f.caused_by) == (codes.DYNAMIC_K_THRASHING, "warning", "scheduler", None)
    assert f.evidence["drafts"] == {"proposed": 446, "verified": 323, "unverified": 123, "finished_allowance_at_most": 32}
    assert f.evidence["token_budget"]["needed"] == 24 and f.evidence["max_num_batched_tokens"] == 14
    assert f.message.startswith("k switched in 38 of 68 verified steps (55.9%)")
    assert "between 1, 3 and 4" in f.message and "3→4 ×12" in f.message and "batch sizes 2, 3-4" in f.message
    assert "123 of 446 proposed draft tokens never verified" in f.message and codes.TOKEN_BUDGET_SHORT in f.message
    assert "around batch sizes 2, 3-4" in f.fix and "needs 24 tokens" in f.fix and "static num_speculative_tokens" in f.fix
    plain = audit.thrashing_finding(ev)  # asynchronous scheduling: nothing proposed was counted
    assert plain.evidence["drafts"] is None and "never verified" not in plain.message and "needs" not in plain.fix


# -- the drain: switches counted per run across flushes ------------------------------------


@pytest.fixture
def traced(tmp_path):
    rt, sink = memory_runtime(tmp_path, RUN)
    try:
        yield rt, sink
    finally:
        runtime.stop()


def vllm_config(schedule, *, k=4, max_num_seqs=4, max_num_batched_tokens=14):
    """The fields of a resolved VllmConfig that ``scheduler_facts`` reads."""
    return SimpleNamespace(
        speculative_config=SimpleNamespace(method="draft_model", num_speculative_tokens=k, parallel_drafting=False,
                                           num_speculative_tokens_per_batch_size=schedule),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                         enable_chunked_prefill=True),
    )


def step(step_no: int, batch: int, k: int, run: str = RUN) -> EngineStep:
    """A step of ``batch`` requests that drafted ``k`` each (the first request; the others one fewer when k > 1:
    the step's k is the most drafts one request got) and accepted them all."""
    drafts = {f"r{i}": [7] * (k if i == 0 or k == 1 else k - 1) for i in range(batch)}
    rows = {req: i for i, req in enumerate(drafts)}
    cached = SimpleNamespace(req_ids=list(drafts), num_computed_tokens=[20] * batch)
    return EngineStep(1_000 + step_no, step_no, run, drafts, [len(d) + 1 for d in drafts.values()], rows, cached, None, 1)


def shapes(sink) -> dict[tuple[str, int], list[int]]:
    got: dict[tuple[str, int], list[int]] = {}
    for r in sink.rows("step_shapes"):
        total = got.setdefault((r["batch_band"], r["k"]), [0, 0])
        total[0] += r["steps"]
        total[1] += r["k_switches"]
    return got


def test_drain_counts_switches_across_flushes_and_names_thrashing_once(traced):
    rt, sink = traced
    capture = rt.verify
    capture.run_configs[RUN] = vllm_config(SCHEDULE)
    # a full batch drafts 4, the budget admits two requests, two requests draft 1, the batch refills: 4, 1, 4, 1, ...
    sequence = [(4, 4) if i % 2 == 0 else (2, 1) for i in range(30)]
    for i, (batch, k) in enumerate(sequence[:15], start=1):
        capture.engine_steps.append(step(i, batch, k))
    capture.proposals.extend(Proposal(RUN, [[7] * 4] * 4) for _ in range(15))
    rt.flush()
    assert shapes(sink) == {("3-4", 4): [8, 7], ("2", 1): [7, 7]}  # the first step follows none
    assert not [f for f in sink.rows("findings") if f["code"] == codes.DYNAMIC_K_THRASHING]  # 14 switches so far
    for i, (batch, k) in enumerate(sequence[15:], start=16):
        capture.engine_steps.append(step(i, batch, k))
    capture.proposals.extend(Proposal(RUN, [[7] * 4] * 4) for _ in range(15))
    rt.flush()
    # the first step of the second flush (k 1) switched from the last of the first (k 4): the last k is kept
    assert shapes(sink) == {("3-4", 4): [15, 14], ("2", 1): [15, 15]}
    [f] = [f for f in sink.rows("findings") if f["code"] == codes.DYNAMIC_K_THRASHING]
    ev = json.loads(f["evidence"])
    assert (ev["verified_steps"], ev["k_switches"], ev["transitions"]) == (30, 29, {"4->1": 15, "1->4": 14})
    # 30 proposals of 4 x 4; verified: 15 steps of 4 + 3 x 3 drafts, 15 of 2 x 1; four requests, k 4 each at most
    assert ev["drafts"] == {"proposed": 480, "verified": 225, "unverified": 255, "finished_allowance_at_most": 16}
    assert ev["token_budget"]["needed"] == 24 and (ev["max_num_seqs"], ev["max_num_batched_tokens"]) == (4, 14)
    # once per run
    capture.engine_steps.extend(step(31 + i, *sequence[i % 2]) for i in range(10))
    rt.flush()
    assert sum(f["code"] == codes.DYNAMIC_K_THRASHING for f in sink.rows("findings")) == 1


def test_drain_keeps_runs_apart_and_a_static_k_is_never_named(traced):
    rt, sink = traced
    capture = rt.verify
    capture.run_configs[RUN] = vllm_config(None)  # static k: switches recorded, nothing to judge
    capture.run_configs["steady"] = vllm_config(SCHEDULE)
    for i in range(1, 41):
        capture.engine_steps.append(step(2 * i, 4, 4 if i % 2 else 1))
        capture.engine_steps.append(step(2 * i + 1, 4, 4, run="steady"))  # interleaved, never switching itself
    rt.flush()
    by_run: dict[str, int] = {}
    for r in sink.rows("step_shapes"):
        by_run[r["run_id"]] = by_run.get(r["run_id"], 0) + r["k_switches"]
    assert by_run == {RUN: 39, "steady": 0}
    assert not [f for f in sink.rows("findings") if f["code"] == codes.DYNAMIC_K_THRASHING]


def test_a_config_the_reader_does_not_know_costs_no_error(traced):
    rt, sink = traced
    spec = vllm_config(SCHEDULE).speculative_config
    rt.verify.run_configs[RUN] = SimpleNamespace(speculative_config=spec)  # no scheduler_config: facts unreadable
    rt.verify.engine_steps.extend(step(i, 4, 4 if i % 2 else 1) for i in range(1, 41))
    rt.flush()
    assert rt.pipeline.errors == {} and rt.errors == {}
    assert sum(r["k_switches"] for r in sink.rows("step_shapes")) == 39
    assert not [f for f in sink.rows("findings") if f["code"] == codes.DYNAMIC_K_THRASHING]


# -- metrics, store, report ------------------------------------------------------------------


def test_step_shapes_rows_feed_two_counters():
    reader = InMemoryMetricReader()
    m = Metrics([reader], Resource.create({}))
    labels = {"model": "t", "draft_model": "d", "method": "draft_model", "run_id": "r1"}
    m.step_shapes([{"batch_band": "3-4", "k": 4, "steps": 8, "k_switches": 7},
                   {"batch_band": "2", "k": 1, "steps": 7, "k_switches": 7}], labels)
    m.step_shapes([{"batch_band": "3-4", "k": 4, "steps": 7, "k_switches": 7}], labels)
    got = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name.startswith("spectrace.step_shapes."):
                    for p in metric.data.data_points:
                        got[(metric.name, p.attributes["batch_band"], p.attributes["k"])] = p.value
                        assert p.attributes["run_id"] == "r1"
    assert got == {("spectrace.step_shapes.steps", "3-4", "4"): 15, ("spectrace.step_shapes.k_switches", "3-4", "4"): 14,
                   ("spectrace.step_shapes.steps", "2", "1"): 7, ("spectrace.step_shapes.k_switches", "2", "1"): 7}
    m.provider.shutdown()


def test_older_step_shapes_segments_read_null_switches_and_the_report_says_so(tmp_path):
    old = tmp_path / "old"
    folder = old / "step_shapes" / "run=r0"
    folder.mkdir(parents=True)
    # a segment written before k_switches existed (same schema version: an added column reads NULL)
    pq.write_table(pa.table({"run_id": ["r0", "r0"], "process_role": ["engine_core"] * 2, "batch_band": ["1", "5-8"],
                             "k": pa.array([3, 1], pa.int32()), "steps": [4, 6], "request_steps": [4, 36],
                             "drafted": [12, 36], "accepted": [9, 18], "schema_version": pa.array([1, 1], pa.int32())}),
                   folder / "old.parquet")
    writer = store_pipeline(old, retention_s=0, compact_interval_s=0)
    writer.append("runs", {"run_id": "r0", "process_role": "frontend", "started_at": 1, "target_model": "t"})
    writer.append("step_shapes", {"run_id": "r1", "process_role": "engine_core", "ts": 3, "batch_band": "2", "k": 1,
                                  "steps": 5, "request_steps": 10, "drafted": 10, "accepted": 10, "k_switches": 4})
    writer.flush()
    con = spectrace.store.open(old)
    assert con.execute("select run_id, batch_band, k_switches from step_shapes order by all").fetchall() == [
        ("r0", "1", None), ("r0", "5-8", None), ("r1", "2", 4)]
    text = report.render(con, run_id="r0")
    table = text.split("The k each batch size drafted")[1].splitlines()
    assert [line.split()[:4] for line in table[3:5]] == [["1", "3", "4", "-"], ["5-8", "1", "6", "-"]]
    assert "k switched in" not in text  # not counted by the writer: no share claimed


def test_report_shows_switches_by_shape_and_the_share(tmp_path):
    writer = store_pipeline(tmp_path, retention_s=0, compact_interval_s=0)
    writer.append("runs", {"run_id": "r1", "process_role": "frontend", "started_at": 1, "target_model": "t"})
    for flush, rows in enumerate([THRASHING_SHAPES, ONCE_SHAPES]):  # two flushes of one run, summed per shape
        for (band, k), (steps, switches) in rows.items():
            writer.append("step_shapes", {"run_id": "r1", "process_role": "engine_core", "ts": 3 + flush, "batch_band": band,
                                          "k": k, "steps": steps, "request_steps": steps, "drafted": steps * k,
                                          "accepted": steps * k, "k_switches": switches})
    writer.flush()
    text = report.render(spectrace.store.open(tmp_path), run_id="r1")
    table = text.split("The k each batch size drafted")[1].splitlines()
    assert [line.split()[:4] for line in table[3:8]] == [
        ["2", "1", "34", "3"], ["2", "4", "22", "19"], ["3-4", "1", "8", "5"], ["3-4", "3", "12", "12"], ["3-4", "4", "7", "0"]]
    assert "  k switched in 39 of 83 verified steps (47.0%)" in text
