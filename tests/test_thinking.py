"""Thinking mode per request and the phase of a verify step (``spectrace.audit.rules.thinking``), and
``THINKING_MODE_GAP`` through the run judge and the drain. Pure and fast: no vLLM, no torch."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from spectrace import audit
from spectrace.audit import codes
from spectrace.audit.rules import slices, thinking
from spectrace.testing import memory_runtime
from spectrace.recorder import runtime
from spectrace.recorder.verify import EngineStep
from spectrace.recorder.verify.capture import ReadRequest
from spectrace.vllm_objects.requests import request_parameters

RUN = "run-thinking"
START, END, NL = 7, 8, 3  # think start / end token ids, "\n\n"


def test_mode_from_kwarg_then_default_then_prompt_tail():
    assert thinking.thinking_mode({"enable_thinking": False}) == ("off", "kwarg")
    assert thinking.thinking_mode({"thinking": True}, {"enable_thinking": False}) == ("on", "kwarg")
    assert thinking.thinking_mode({"thinking_mode": "high"}) == ("on", "kwarg")
    assert thinking.thinking_mode({"thinking_mode": "off"}) == ("off", "kwarg")
    # the request's kwargs win over the server's --default-chat-template-kwargs, else the default holds
    assert thinking.thinking_mode({}, {"enable_thinking": False}) == ("off", "default")
    assert thinking.thinking_mode({"other": 1}, {"enable_thinking": True}) == ("on", "default")
    # Qwen3 with thinking off renders "<think>\n\n</think>\n\n" at the prompt's end
    assert thinking.thinking_mode(None, None, [1, 2, START, NL, END, NL], START, END) == ("off", "prompt_tail")
    assert thinking.thinking_mode(None, None, [1, 2, START, NL], START, END) == ("on", "prompt_tail")
    assert thinking.thinking_mode(None, None, [1, 2, 5], START, END) == ("unknown", "none")
    assert thinking.thinking_mode(None, None, [1, 2, START, NL, END], None, None) == ("unknown", "none")  # no markers known
    # a closed block with reasoning in it (a previous turn) says nothing about this turn
    assert thinking.mode_from_prompt_tail([START, 9, 9, 9, 9, END, NL], START, END) is None


def test_phase_counts_sum_the_steps_of_each_phase():
    assert thinking.phase_counts([("reasoning", 3, 1), ("reasoning", 3, 0), ("answer", 3, 3)]) == {
        "reasoning": (2, 6, 1), "answer": (1, 3, 3)}


def test_phase_gap_names_the_phase_far_below_and_is_quiet_when_alike():
    by_phase = {"reasoning": (50, 150, 30), "answer": (50, 150, 140)}
    gap = thinking.phase_gap(by_phase, 3)
    assert (gap.dimension, gap.value, gap.accepted, gap.rest_accepted) == ("thinking_phase", "reasoning", 30, 140)
    f = audit.thinking_finding(gap)
    assert (f.code, f.severity) == (codes.THINKING_MODE_GAP, "warning")
    assert "phase reasoning accept 20.0%" in f.message and "trained with thinking off" in f.message
    assert thinking.phase_gap({"reasoning": (50, 150, 120), "answer": (50, 150, 125)}, 3) is None


def test_the_mode_is_a_slice_dimension():
    p = request_parameters(None, None, None)
    assert (p["thinking_mode"], p["thinking_source"]) == (None, None)
    assert slices.request_slice(p)["thinking_mode"] == "unknown"
    assert slices.request_slice({**p, "thinking_mode": "off"})["thinking_mode"] == "off"
    assert "thinking_mode" in slices.DIMENSIONS


def test_mode_finding_names_both_fixes():
    gap = slices.slice_gap("thinking_mode", "off", (4, 300, 90), (8, 600, 370), 3)
    f = audit.thinking_finding(gap)
    assert f.code == codes.THINKING_MODE_GAP and "requests with thinking off accept 30.0%" in f.message
    assert "trained with thinking on" in f.message
    assert "serve with the thinking mode the drafter was trained in" in f.fix and "retrain" in f.fix
    assert f.evidence["slice"]["accepted"] == 90 and f.evidence["rest"]["accepted"] == 280


# -- the drain on whole records -------------------------------------------------------------


@pytest.fixture
def traced(tmp_path):
    rt, sink = memory_runtime(tmp_path, RUN)
    try:
        yield rt, sink
    finally:
        runtime.stop()


def _steps(n_steps: int, requests: dict[str, int], k: int = 3) -> list[EngineStep]:
    rows = {req: i for i, req in enumerate(requests)}
    cached = SimpleNamespace(req_ids=list(requests), num_computed_tokens=[20] * len(requests))
    return [EngineStep(1_000 + s, s, RUN, {r: [1] * k for r in requests}, [a + 1 for a in requests.values()], rows,
                       cached, None, 1) for s in range(1, n_steps + 1)]


def _notes(rt, modes):
    for i, mode in enumerate(modes):
        params = {**request_parameters(None, None, SimpleNamespace(num_prompt_tokens=12, num_cached_tokens=0)),
                  "thinking_mode": mode, "thinking_source": "kwarg", "temperature": 0.0}
        rt.verify.new_requests.append(ReadRequest(RUN, f"r{i}", params))


def test_drain_names_the_mode_that_accepts_less(traced):
    rt, sink = traced
    _notes(rt, ["on", "off"] * 4)
    # thinking on accepts all 3 drafts, off 1 in 3 steps
    rt.verify.engine_steps.extend(_steps(20, {f"r{i}": 3 if i % 2 == 0 else 1 for i in range(8)}))
    rt.flush()
    rows = {r["request_id"]: r for r in sink.rows("request_slices")}
    assert (rows["r1"]["thinking_mode"], rows["r1"]["thinking_source"]) == ("off", "kwarg")
    assert json.loads(rows["r0"]["slice"])["thinking_mode"] == "on"
    [finding] = [f for f in sink.rows("findings") if f["code"] == codes.THINKING_MODE_GAP]
    evidence = json.loads(finding["evidence"])
    assert (evidence["dimension"], evidence["value"]) == ("thinking_mode", "off")
    assert (evidence["slice"]["drafted"], evidence["slice"]["accepted"]) == (240, 80)
    assert (evidence["rest"]["drafted"], evidence["rest"]["accepted"]) == (240, 240)
    assert not [f for f in sink.rows("findings") if f["code"] == codes.SLICE_ACCEPTANCE_LOW]
    rt.verify.engine_steps.extend(_steps(5, {f"r{i}": 0 for i in range(8)}))
    rt.flush()
    assert sum(f["code"] == codes.THINKING_MODE_GAP for f in sink.rows("findings")) == 1  # once per run


def test_drain_quiet_twin_modes_alike(traced):
    rt, sink = traced
    _notes(rt, ["on", "off"] * 4)
    rt.verify.engine_steps.extend(_steps(20, {f"r{i}": 2 for i in range(8)}))
    rt.flush()
    assert {json.loads(r["slice"])["thinking_mode"] for r in sink.rows("request_slices")} == {"on", "off"}
    assert not [f for f in sink.rows("findings") if f["code"] in (codes.THINKING_MODE_GAP, codes.SLICE_ACCEPTANCE_LOW)]


def test_prompt_tail_with_multi_token_markers():
    start, end = [40, 41], [42, 43, 44]  # a tokenizer where "<think>" / "</think>" are not single tokens
    assert thinking.mode_from_prompt_tail([1, 40, 41, NL, 42, 43, 44, NL], start, end) == "off"
    assert thinking.mode_from_prompt_tail([1, 40, 41, NL], start, end) == "on"
    assert thinking.mode_from_prompt_tail([1, 40, 42, 43, 44], start, end) is None


def test_request_parameters_read_the_mode_from_the_prompt_tail():
    markers = ([START], [END])
    off = request_parameters(None, None, None, [1, 2, START, NL, END, NL], markers)
    assert (off["thinking_mode"], off["thinking_source"]) == ("off", "prompt_tail")
    on = request_parameters(None, None, None, [1, 2, START, NL], markers)
    assert (on["thinking_mode"], on["thinking_source"]) == ("on", "prompt_tail")
    assert request_parameters(None, None, None, [1, 2, START, NL], None)["thinking_mode"] is None  # no parser


def test_think_markers_from_the_reasoning_config():
    from spectrace.vllm_objects.requests import think_markers

    config = SimpleNamespace(reasoning_config=SimpleNamespace(
        enabled=True, reasoning_start_token_ids=[7], natural_reasoning_end_token_ids=[8], reasoning_end_token_ids=[9, 8]))
    assert think_markers(config) == ([7], [8])
    assert think_markers(SimpleNamespace(reasoning_config=None)) is None
    assert think_markers(None) is None


# -- the phase of each verify step ------------------------------------------------------------

OPEN, CLOSE = [40, 41], [42, 43, 44]  # multi-token markers, as the zoo tokenizer splits "<think>" / "</think>"


def test_phase_tracker_follows_markers_across_steps():
    tracker = thinking.PhaseTracker(OPEN, CLOSE)
    assert tracker.phase("a", "on") == "reasoning" and tracker.phase("b", "off") == "answer"
    tracker.feed("a", "on", [5, 6, 42])  # the end marker split across two steps
    assert tracker.phase("a", "on") == "reasoning"
    tracker.feed("a", None, [43, 44, 7])
    assert tracker.phase("a", None) == "answer"
    tracker.feed("a", None, [8, 9])  # the marker left in the kept tokens is not read again as new
    assert tracker.phase("a", None) == "answer"
    tracker.feed("b", "off", [40, 41, 3])  # a think block opened in the output
    assert tracker.phase("b", None) == "reasoning"
    tracker.feed("b", None, [42, 43, 44, 40, 41])  # closed and opened again in one step: the last one counts
    assert tracker.phase("b", None) == "reasoning"
    tracker.feed("c", None, [1, 2])  # mode unknown: answer until a start marker
    assert tracker.phase("c", None) == "answer"
    tracker.finish("a")
    assert "a" not in tracker.state and tracker.phase("a", "on") == "reasoning"


def test_phase_tracker_with_a_start_marker_longer_than_the_end_marker():
    tracker = thinking.PhaseTracker([27, 274, 279, 74, 29], [46])  # the zoo's "<think>" against a one-token end
    tracker.feed("r", "on", [94, 57, 46, 123])
    assert tracker.phase("r", None) == "answer"
    tracker.feed("r", None, [134, 53, 378, 233])  # the end marker still among the tokens kept, no start: answer
    tracker.feed("r", None, [343, 194, 3, 413])
    assert tracker.phase("r", None) == "answer"
    tracker.feed("r", None, [1, 27, 274, 279, 74])  # a start marker split across two steps
    assert tracker.phase("r", None) == "answer"
    tracker.feed("r", None, [29, 5])
    assert tracker.phase("r", None) == "reasoning"


def test_phase_tracker_is_bounded():
    tracker = thinking.PhaseTracker(OPEN, CLOSE, limit=3)
    for i in range(10):
        tracker.feed(f"r{i}", "on", [1])
    assert len(tracker.state) == 3 and set(tracker.state) == {"r7", "r8", "r9"}


def test_kwarg_mode_request_over_default():
    assert thinking.kwarg_mode({"enable_thinking": False}, {"enable_thinking": True}) == ("off", "kwarg", "enable_thinking")
    assert thinking.kwarg_mode({"other": 1}, {"enable_thinking": True}) == ("on", "default", "enable_thinking")
    assert thinking.kwarg_mode(None, {"thinking_mode": "high"}) == ("on", "default", "thinking_mode")
    assert thinking.kwarg_mode({"thinking": "maybe"}, None) is None  # a value that says neither
    assert thinking.kwarg_mode("not a dict", ["nor this"]) is None


def _phase_steps(n_steps: int, requests: list[str], end_at: int, accepted: dict[str, int], k: int = 3):
    """Steps where every request emits plain tokens, and only the end marker at step ``end_at``; ``accepted``:
    per phase, the drafts each request-step accepts."""
    rows = {req: i for i, req in enumerate(requests)}
    cached = SimpleNamespace(req_ids=list(requests), num_computed_tokens=[20] * len(requests))
    out = []
    for s in range(1, n_steps + 1):
        a = accepted["reasoning" if s <= end_at else "answer"]
        sampled = [CLOSE if s == end_at else [7] * a + [8] for _ in requests]
        out.append(EngineStep(1_000 + s, s, RUN, {r: [1] * k for r in requests}, [len(x) for x in sampled], rows,
                              cached, None, 1, None, None, sampled))
    return out


def _with_markers(rt):
    from spectrace.recorder.verify.run_config import RunConfig

    facts = RunConfig.__new__(RunConfig)
    facts.__setstate__((None, {}, None, None, (OPEN, CLOSE)))
    rt.verify.run_facts[RUN] = facts


def test_drain_counts_each_step_in_the_phase_it_was_drafted_in(traced):
    rt, sink = traced
    _with_markers(rt)
    _notes(rt, ["on"] * 8)
    # reasoning accepts all 3 drafts, but step 10 emits the end marker alone (3 tokens: 2 accepted); the answer
    # accepts none
    rt.verify.engine_steps.extend(_phase_steps(20, [f"r{i}" for i in range(8)], 10, {"reasoning": 3, "answer": 0}))
    rt.flush()
    phases = {r["phase"]: (r["request_steps"], r["drafted"], r["accepted"]) for r in sink.rows("thinking_phases")}
    # steps 1-10 were drafted in reasoning (the marker came out in step 10), 11-20 in the answer
    reasoning_accepted = 8 * (9 * 3 + len(CLOSE) - 1)
    assert phases == {"reasoning": (80, 240, reasoning_accepted), "answer": (80, 240, 0)}
    [finding] = [f for f in sink.rows("findings") if f["code"] == codes.THINKING_MODE_GAP]
    evidence = json.loads(finding["evidence"])
    assert (evidence["dimension"], evidence["value"]) == ("thinking_phase", "answer")
    assert "trained with thinking on" in finding["message"]


def test_drain_phases_quiet_twin_and_none_without_markers(traced):
    rt, sink = traced
    _with_markers(rt)
    _notes(rt, ["on"] * 8)
    rt.verify.engine_steps.extend(_phase_steps(20, [f"r{i}" for i in range(8)], 10, {"reasoning": 2, "answer": 2}))
    rt.flush()
    assert {r["phase"] for r in sink.rows("thinking_phases")} == {"reasoning", "answer"}
    assert not [f for f in sink.rows("findings") if f["code"] == codes.THINKING_MODE_GAP]


def test_no_phases_without_a_reasoning_parser(traced):
    rt, sink = traced
    _notes(rt, ["on"] * 8)
    rt.verify.engine_steps.extend(_phase_steps(20, [f"r{i}" for i in range(8)], 10, {"reasoning": 3, "answer": 0}))
    rt.flush()
    assert sink.rows("thinking_phases") == [] and sink.rows("verify_counts")


def test_store_reads_each_requests_mode_from_kwarg_default_or_tail_and_reports_both_kinds(tmp_path):
    from spectrace.queries.report import render
    from spectrace.testing import store_pipeline
    import spectrace.store

    writer = store_pipeline(tmp_path, retention_s=0, compact_interval_s=0)
    engine = {"run_id": "r", "process_role": "engine_core", "ts": 2}
    frontend = {"run_id": "r", "process_role": "frontend", "ts": 3}
    writer.append("runs", {"run_id": "r", "process_role": "frontend", "started_at": 1, "method": "eagle3",
                           "num_speculative_tokens": 3})
    # a: its own kwarg says off (its prompt tail, read too, is not what vLLM was asked); b: the server's default;
    # c: only its prompt tail; d: nothing known
    for rid, drafted, accepted in (("a-1", 30, 6), ("b-1", 30, 27), ("c-1", 30, 24), ("d-1", 30, 15)):
        writer.append("request_counts", {**engine, "request_id": rid, "request_steps": 10, "drafted": drafted,
                                         "accepted": accepted, "emitted": accepted + 10, "histogram": "[0]"})
        writer.append("request_outputs", {**frontend, "request_id": rid, "external_request_id": f"chatcmpl-{rid[0]}"})
    writer.append("request_slices", {**engine, "request_id": "a-1", "thinking_mode": "on", "thinking_source": "prompt_tail"})
    writer.append("request_slices", {**engine, "request_id": "c-1", "thinking_mode": "on", "thinking_source": "prompt_tail"})
    writer.append("chat_requests", {**frontend, "external_request_id": "chatcmpl-a", "thinking_mode": "off",
                                    "thinking_source": "kwarg", "thinking_key": "enable_thinking"})
    writer.append("chat_requests", {**frontend, "external_request_id": "chatcmpl-b", "thinking_mode": "on",
                                    "thinking_source": "default", "thinking_key": "enable_thinking"})
    writer.append("thinking_phases", {**engine, "phase": "reasoning", "request_steps": 20, "drafted": 60, "accepted": 50})
    writer.append("thinking_phases", {**engine, "phase": "answer", "request_steps": 20, "drafted": 60, "accepted": 22})
    writer.flush()
    con = spectrace.store.open(tmp_path)
    modes = dict((r, (m, s)) for r, m, s in con.execute(
        "select request_id, thinking_mode, thinking_source from request_thinking").fetchall())
    assert modes == {"a-1": ("off", "kwarg"), "b-1": ("on", "default"), "c-1": ("on", "prompt_tail"),
                     "d-1": ("unknown", "none")}
    rows = {(kind, value): rest for kind, value, *rest in con.execute(
        "select kind, value, sources, requests, request_steps, drafted, accepted from acceptance_by_thinking").fetchall()}
    assert rows == {("mode", "off"): ["kwarg", 1, None, 30, 6], ("mode", "on"): ["default,prompt_tail", 2, None, 60, 51],
                    ("mode", "unknown"): ["none", 1, None, 30, 15],
                    ("phase", "answer"): [None, None, 20, 60, 22], ("phase", "reasoning"): [None, None, 20, 60, 50]}
    text = render(con, run_id="r")
    section = text[text.index("Acceptance by thinking mode"):]
    assert "default,prompt_tail" in section and "reasoning" in section and "83.3%" in section and "36.7%" in section
