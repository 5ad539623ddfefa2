"""The verification counting rules and the findings the drain builds, on whole records (no vLLM).

A runtime as the plugin makes it, with an in-memory sink in place of the store: the capture is
fed the records the per-step hooks append (``EngineStep``, ``WorkerStep``, built from plain
objects in the shapes vLLM 0.32 hands the hooks), the pipeline flushes, and the test reads back
every row the sinks got. The same rules are checked against the real engine by
tests/test_verification_live.py and tests/test_acceptance_curve_live.py (counts equal vLLM's).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from spectrace.settings import Settings
from spectrace.sinks.memory import MemorySink
from spectrace.testing import memory_runtime
from spectrace.recorder import runtime, verify
from spectrace.recorder.verify import EngineStep, WorkerStep

RUN = "run-counting"
VOLATILE = ("schema_version", "ts", "pid", "host")  # clock, process and machine: not the rules'


@pytest.fixture
def traced(tmp_path):
    """(runtime, memory sink): exporters off, the memory sink the pipeline's only sink."""
    rt, sink = memory_runtime(tmp_path, RUN, collapse_window_tokens=100, collapse_min_tokens=50)
    try:
        yield rt, sink
    finally:
        runtime.stop()


def cached(contexts: dict[str, int]):
    """scheduler_output.scheduled_cached_reqs: request ids and their computed tokens."""
    return SimpleNamespace(req_ids=list(contexts), num_computed_tokens=list(contexts.values()))


def engine_step(step_no, drafts, sampled, *, contexts=None, invalid=None, num_sampled=1) -> EngineStep:
    """One engine-core step: ``drafts`` request -> draft ids; ``sampled`` request -> tokens sampled."""
    rows = {req: i for i, req in enumerate(sampled)}
    return EngineStep(1_000 + step_no, step_no, RUN, drafts, list(sampled.values()), rows,
                      cached(contexts or {}), invalid, num_sampled)


def rows(sink: MemorySink, table: str, **where) -> list[dict]:
    return [r for r in sink.rows(table, drop=VOLATILE) if all(r.get(k) == v for k, v in where.items())]


def test_engine_counts_follow_vllms_rules_per_position_and_request_step(traced):
    rt, sink = traced
    capture = rt.verify
    capture.request_flags.update({"a": (True, False), "b": (True, True)})
    capture.engine_steps.extend([
        # a: 3 drafts, 3 sampled -> 2 accepted; b: 3 drafts, one invalidated by the grammar, 1 sampled -> 0 accepted;
        # c: drafts but no row in the output (finished): skipped; d: no drafts: skipped
        engine_step(1, {"a": [5, 6, 7], "b": [1, 2, 3], "c": [9, 9], "d": []}, {"a": 3, "b": 1, "d": 1},
                    contexts={"a": 40, "b": 700}, invalid={"b": 1}),
        # a: 4 sampled of 3 drafts -> all 3 accepted; b: nothing sampled this step -> skipped
        engine_step(2, {"a": [5, 6, 7], "b": [1, 2]}, {"a": 4, "b": 0}, contexts={"a": 43, "b": 701}),
    ])
    rt.flush()

    steps = rows(sink, "verify_steps")
    assert steps == [
        {"run_id": RUN, "process_role": "engine_core", "rank": None, "step": 1, "request_id": "a", "context_len": 40,
         "num_drafted": 3, "num_accepted": 2, "num_emitted": 3, "greedy": True, "structured_output": False,
         "draft_token_ids": None},
        {"run_id": RUN, "process_role": "engine_core", "rank": None, "step": 1, "request_id": "b", "context_len": 700,
         "num_drafted": 2, "num_accepted": 0, "num_emitted": 1, "greedy": True, "structured_output": True,
         "draft_token_ids": None},
        {"run_id": RUN, "process_role": "engine_core", "rank": None, "step": 2, "request_id": "a", "context_len": 43,
         "num_drafted": 3, "num_accepted": 3, "num_emitted": 4, "greedy": True, "structured_output": False,
         "draft_token_ids": None},
    ]
    counts = {(r["position"], r["context_bucket"]): (r["drafted"], r["accepted"]) for r in rows(sink, "verify_counts", source="engine_core")}
    # positions: a drafted 3+3 (accepted 2+3: positions 0,1 twice and 2 once); b drafted 2 (positions 0, 1), accepted none
    assert counts == {(0, "0-512"): (2, 2), (1, "0-512"): (2, 2), (2, "0-512"): (2, 1), (0, "512-1k"): (1, 0), (1, "512-1k"): (1, 0)}
    lengths = {r["length"]: r["count"] for r in rows(sink, "acceptance_lengths", source="engine_core")}
    assert lengths == {1: 1, 3: 1, 4: 1}  # accepted + 1 per counted request-step
    assert rt.drain.judge.totals[("engine_core", RUN, None)] == [8, 5]


def test_worker_counts_and_agreement_with_the_engine_core(traced):
    rt, sink = traced
    capture = rt.verify
    capture.engine_steps.append(engine_step(1, {"a": [1, 2], "b": [3, 4]}, {"a": 3, "b": 2}))
    # V1 worker output for the same step: rows by request id; a yielded 3 (2 accepted), b yielded 2 (1 accepted)
    capture.worker_steps.append(WorkerStep(1_001, RUN, 0, {"a": [1, 2], "b": [3, 4], "c": []}, [3, 2, 1], {"a": 0, "b": 1, "c": 2}))
    rt.flush()
    assert {(r["position"], r["drafted"], r["accepted"]) for r in rows(sink, "verify_counts", source="worker")} == {(0, 2, 2), (1, 2, 1)}
    rt.drain.check_agreement(rt)
    rt.flush()
    assert rows(sink, "findings") == []  # both sides counted 4 drafted / 3 accepted

    # a worker that verified less than the engine core reports: one VERIFY_DISAGREEMENT for the run
    other = "run-disagree"
    capture.engine_steps.append(EngineStep(2_000, 2, other, {"a": [1, 2]}, [3], {"a": 0}, cached({}), None, 1))
    capture.worker_steps.append(WorkerStep(2_001, other, 0, [2], [1], None))  # V2 shape: counts per row
    rt.drain.check_agreement(rt)
    rt.flush()
    (finding,) = rows(sink, "findings")
    assert finding["run_id"] == other and finding["code"] == "VERIFY_DISAGREEMENT" and finding["severity"] == "error"
    assert json.loads(finding["evidence"]) == {"engine_core": [2, 2], "worker": [2, 0], "rank": 0, "run_id": other}


def test_what_k_pays_from_the_workers_counts_and_step_sums_over_flushes(traced):
    from spectrace.audit.rules import speedup
    from spectrace.recorder.verify.capture import StepTiming

    rt, sink = traced
    capture = rt.verify
    for flush in range(2):  # two flushes: the run's sums, not the last flush's
        for step in range(3):
            # 2 requests at k=3: a accepts 3 of 3, b accepts 1 of 3 (valid lengths 4 and 2)
            capture.worker_steps.append(WorkerStep(1_000 + step, RUN, 0, {"a": [1, 2, 3], "b": [4, 5, 6]}, [4, 2],
                                                   {"a": 0, "b": 1}))
            timing = StepTiming(RUN, 0, True, 8_000_000, True, 8 + 8 * (step == 2), 2)  # a prefill chunk in one step
            timing.sample_ns, timing.draft_ns = 3_000_000, 2_000_000
            capture.worker_timings.append(timing)
        rt.flush()
    got = rt.drain.step_times.speedup_by_k(rt, RUN, 0)
    cost = speedup.StepCost(steps=6, step_ns=6 * 11e6, draft_ns=6 * 2e6, scheduled_tokens=2 * (8 + 8 + 16),
                            scheduled_tokens_sq=2 * (64 + 64 + 256), tokens_x_verify_ns=2 * 9e6 * (8 + 8 + 16), requests=12)
    assert got == speedup.speedup_by_k([12, 6, 6], 12, cost)
    assert [r["expected_length"] for r in got][:4] == [1.0, 2.0, 2.5, 3.0]
    steps = rows(sink, "speculation_steps")
    assert sum(r["steps"] for r in steps) == 6 and sum(r["step_ns"] for r in steps) == 66_000_000


def test_decode_steps_hold_the_step_times_of_decode_only_shapes_and_chunk_steps_the_rest(traced):
    from spectrace.recorder.verify.capture import StepTiming

    rt, sink = traced
    capture = rt.verify

    def step(drafts: bool, tokens: int, requests: int, ns: int, draft_ns: int = 0) -> None:
        timing = StepTiming(RUN, 0, drafts, ns, True, tokens, requests)
        timing.draft_ns = draft_ns
        capture.worker_timings.append(timing)

    step(False, 8, 8, 10_000_000)  # decode without drafts: one token per request
    step(False, 8, 8, 12_000_000)
    step(False, 40, 8, 30_000_000)  # a prefill chunk on top: not decode-only
    step(True, 32, 8, 20_000_000, 6_000_000)  # 8 requests at 3 drafts each
    step(True, 33, 8, 21_000_000, 6_000_000)  # tokens that do not divide: a chunk
    step(True, 8, 2, 9_000_000, 2_000_000)  # 2 requests at 3 drafts
    step(True, 0, 0, 1_000_000)
    rt.flush()
    got = {(r["requests"], r["drafts"]): (r["steps"], r["step_ns"], r["draft_ns"]) for r in rows(sink, "decode_steps")}
    assert got == {(8, 0): (2, 22_000_000, 0), (8, 3): (1, 20_000_000, 6_000_000), (2, 3): (1, 9_000_000, 2_000_000)}
    chunks = {(r["requests"], r["verified"]): (r["steps"], r["step_ns"], r["draft_ns"], r["scheduled_tokens"])
              for r in rows(sink, "chunk_steps")}
    assert chunks == {(8, False): (1, 30_000_000, 0, 40), (8, True): (1, 21_000_000, 6_000_000, 33)}


def test_step_shapes_record_the_k_each_batch_size_drafted(traced):
    rt, sink = traced
    capture = rt.verify
    capture.engine_steps.extend([  # dynamic speculation: k 3 for one request, k 1 for a batch of three
        engine_step(1, {"a": [1, 2, 3]}, {"a": 3}),
        engine_step(2, {"a": [1], "b": [2], "c": [3]}, {"a": 2, "b": 1, "c": 2}),
        engine_step(3, {"a": [1], "b": [2], "c": [3]}, {"a": 1, "b": 1, "c": 1}),
    ])
    rt.flush()
    got = {(r["batch_band"], r["k"]): (r["steps"], r["request_steps"], r["drafted"], r["accepted"], r["k_switches"])
           for r in rows(sink, "step_shapes")}
    assert got == {("1", 3): (1, 1, 3, 2, 0), ("3-4", 1): (2, 6, 6, 2, 1)}  # step 2 came right after a step at k 3
    # per position and band: what k pays by load (spectrace.audit.rules.speedup.by_band)
    positions = {(r["batch_band"], r["position"]): (r["drafted"], r["accepted"]) for r in rows(sink, "band_positions")}
    assert positions == {("1", 0): (1, 1), ("1", 1): (1, 1), ("1", 2): (1, 0), ("3-4", 0): (6, 2)}


def test_collapse_and_recovery_are_findings_with_their_onset(traced):
    rt, sink = traced
    capture = rt.verify
    step = 0
    for accepted in [3] * 20 + [0] * 40 + [3] * 60:  # healthy, collapsed, recovered (one request, k 3)
        step += 1
        capture.engine_steps.append(engine_step(step, {"a": [1, 2, 3]}, {"a": accepted + 1}, contexts={"a": 10 + step}))
        if step % 10 == 0:
            rt.flush()
    codes = [(r["code"], r["severity"], r["caused_by"]) for r in rows(sink, "findings")]
    assert codes == [("ACCEPTANCE_COLLAPSE", "error", None), ("ACCEPTANCE_RECOVERED", "info", "ACCEPTANCE_COLLAPSE")]
    collapse = json.loads(rows(sink, "findings", code="ACCEPTANCE_COLLAPSE")[0]["evidence"])
    assert collapse["onset_step"] == 21 and collapse["onset_context_len"] == 31  # the first step below the threshold
    assert collapse["position_0_rate"] < 0.1


def test_a_full_buffer_drops_steps_and_counts_them(traced):
    rt, sink = traced
    capture = rt.verify
    capture.dropped_steps = 7  # what the hooks counted when the deque was full
    rt.flush()
    assert rt.pipeline.dropped == 7 and capture.dropped_steps == 0


def test_steps_of_no_run_are_counted_without_an_error(tmp_path):
    """An engine whose start was not traced (a fault in the frontend's hook) still has its steps
    counted, and its series fed, with no run: the drain used to raise on the run's k."""
    rt = runtime.start(Settings(enabled=True, dir=tmp_path, exporters=("prometheus",), metrics_dir=tmp_path / "metrics",
                                span_every_steps=0, pipeline="thread"), hooks=[], make_capture=verify.VerifyCapture)
    try:
        sink = MemorySink()
        rt.pipeline.add_sink(sink)
        rt.enter_role("engine_core")  # telemetry built: the metrics are fed from the drain
        assert rt.metrics is not None and rt.run is None
        rt.verify.engine_steps.append(EngineStep(1, 1, None, {"a": [1, 2]}, [2], {"a": 0}, cached({}), None, 1))
        rt.flush()
        assert rt.pipeline.errors == {} and rt.errors == {}
        assert [(r["position"], r["drafted"], r["accepted"]) for r in rows(sink, "verify_counts")] == [(0, 1, 1), (1, 1, 0)]
    finally:
        runtime.stop()


def test_a_request_that_stops_inside_a_draft_counts_what_it_emitted_and_ends_in_a_span(traced):
    """vLLM #56101: a request that stopped 1 token into an accepted draft. The step's sampled list was trimmed by
    vLLM in place (``emitted_lens``), the request's id is among the step's finished ones: its counts say it
    accepted 3 + 3 drafts but emitted 4 + 1 tokens, and its ``spectrace.request`` span carries vLLM's per-request
    numbers under their own names."""
    rt, sink = traced
    rt.run.info["num_speculative_tokens"] = 3
    rt.verify.engine_steps.extend([
        engine_step(1, {"a": [5, 6, 7], "b": [1, 2, 3]}, {"a": 4, "b": 2}),
        EngineStep(1_002, 2, RUN, {"a": [5, 6, 7], "b": [1, 2, 3]}, [4, 1], {"a": 0, "b": 1}, cached({}), None, 1,
                   [1, 1], ["a"]),
    ])
    rt.flush()
    steps = [(r["request_id"], r["num_accepted"], r["num_emitted"]) for r in rows(sink, "verify_steps")]
    assert steps == [("a", 3, 4), ("b", 1, 2), ("a", 3, 1), ("b", 0, 1)]
    counts = {r["request_id"]: (r["request_steps"], r["accepted"], r["emitted"], json.loads(r["histogram"]))
              for r in rows(sink, "request_counts")}
    assert counts == {"a": (2, 6, 5, [0, 0, 0, 2]), "b": (2, 1, 3, [1, 1, 0, 0])}
    (span,) = [s for s in rows(sink, "spans") if s["name"] == "spectrace.request"]  # b has not finished
    attributes = json.loads(span["attributes"])
    assert {k.removeprefix("spectrace.spec_decode."): v for k, v in attributes.items() if "spec_decode" in k} == {
        "num_spec_tokens": 3, "acceptance_histogram": [0, 0, 0, 2], "num_spec_steps": 2,
        "num_accepted_draft_tokens": 6, "num_draft_tokens": 6, "mean_acceptance_length": 4.0,
        "draft_acceptance_rate": 1.0, "emitted_tokens": 5}
    assert attributes["spectrace.request.id"] == "a" and attributes["spectrace.run_id"] == RUN
    # b finishes in a later step that drafted nothing (its last token, or a step without speculation): its span too
    rt.verify.finished.append((RUN, 2_000, ["b"]))
    rt.flush()
    spans = {json.loads(s["attributes"])["spectrace.request.id"]: json.loads(s["attributes"])
             for s in rows(sink, "spans") if s["name"] == "spectrace.request"}
    assert set(spans) == {"a", "b"} and spans["b"]["spectrace.spec_decode.acceptance_histogram"] == [1, 1, 0, 0]
    assert not rt.drain.request_totals  # nothing left waiting for an end


def test_host_steps_sum_per_run_and_role_and_join_an_engine_steps_chunks(traced):
    """What k pays prices the host time outside the worker (issue #36): the engine core's steps count the tokens
    they sampled (rows' lengths, or one a row), the frontend's the tokens of the outputs it processed, and
    AsyncLLM's chunks of one engine step (the same timestamp) are one step."""
    from spectrace.recorder.verify.capture import ENGINE, FRONTEND, HostStep

    rt, sink = traced
    out = lambda *lens: [SimpleNamespace(new_token_ids=[0] * n) for n in lens]  # noqa: E731
    rt.verify.host_steps.extend([
        HostStep(RUN, ENGINE, 300, [4, 2]),  # a step that verified drafts: its rows' lengths
        HostStep(RUN, ENGINE, 100, 3),  # one without: one token a row
        HostStep(RUN, FRONTEND, 50, out(4, 2), 7.0),
        HostStep(RUN, FRONTEND, 30, out(1), 7.0),  # the same engine step, a second chunk
        HostStep(RUN, FRONTEND, 40, out(1, 1, 1), 8.0),
    ])
    rt.flush()
    got = {r["process_role"]: (r["steps"], r["host_ns"], r["tokens"], r["tokens_sq"], r["tokens_x_ns"])
           for r in rows(sink, "host_steps", run_id=RUN)}
    assert got == {"engine_core": (2, 400, 9, 6 * 6 + 3 * 3, 6 * 300 + 3 * 100),
                   "frontend": (2, 120, 10, 7 * 7 + 3 * 3, 7 * 80 + 3 * 40)}
    costs = rt.drain.step_times.host_costs(RUN)
    assert sorted(c.steps for c in costs) == [2.0, 2.0]


def test_a_request_histogram_is_written_as_json_writes_it():
    from spectrace.collector.drain import _int_list

    for values in ([], [0], [3, 0, 12], list(range(9))):
        assert _int_list(values) == json.dumps(values) and json.loads(_int_list(values)) == values
