"""Request slices and the token budget, without vLLM: the pure rules (spectrace.audit.rules.slices,
spectrace.audit.requests), and the drain on whole records through an in-memory sink (the shapes
vLLM 0.32's scheduler hands ``add_request`` and ``update_from_output``). The live twins:
tests/test_slices_live.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from spectrace import audit
from spectrace.audit.rules import slices
from spectrace.audit import codes
from spectrace.testing import memory_runtime
from spectrace.recorder import runtime
from spectrace.recorder.verify import EngineStep
from spectrace.recorder.verify.capture import RequestNote
from spectrace.vllm_objects.requests import defaults_in_force, request_parameters

RUN = "run-slices"


def params(**overrides):
    """A SamplingParams-shaped object with vLLM's neutral values."""
    base = dict(temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
                frequency_penalty=0.0, logit_bias=None, allowed_token_ids=None, bad_words=None, structured_outputs=None)
    base.update(overrides)
    return SimpleNamespace(**base)


def prefill(prompt: int, cached: int):
    return SimpleNamespace(num_prompt_tokens=prompt, num_cached_tokens=cached)


# -- pure: bands, labels, interval, the gap rule ---------------------------------------


def test_request_parameters_count_lists_and_keep_no_token_ids():
    p = request_parameters(params(logit_bias={5: -100.0, 9: 2.0}, bad_words=["x"], allowed_token_ids=[1, 2, 3],
                                  structured_outputs=SimpleNamespace(json=None, regex="a+", choice=None)),
                           SimpleNamespace(lora_name="sql-adapter"), prefill(40, 32))
    assert p["logit_bias_tokens"] == 2 and p["bad_words"] == 1 and p["allowed_tokens"] == 3
    assert p["structured_output"] == "regex" and p["lora_adapter"] == "sql-adapter"
    assert (p["prompt_tokens"], p["cached_tokens"]) == (40, 32)
    assert request_parameters(params(), None, prefill(0, 0))["prompt_tokens"] is None  # not scheduled yet


def test_request_slice_bands():
    neutral = slices.request_slice(request_parameters(params(), None, prefill(10, 0)))
    assert neutral == {
        "repetition_penalty": "off", "presence_penalty": "off", "frequency_penalty": "off", "logit_bias": "off",
        "bad_words": "off", "allowed_token_ids": "off", "min_p": "off", "temperature": "greedy", "top_p": "off",
        "top_k": "off", "structured_output": "off", "lora_adapter": "off", "prefix_cache": "miss", "prompt_len": "0-512",
        "thinking_mode": "unknown",
    }
    shaped = slices.request_slice(request_parameters(params(repetition_penalty=1.5, temperature=0.7, top_k=20), None,
                                                     prefill(600, 512)))
    assert (shaped["repetition_penalty"], shaped["temperature"], shaped["top_k"]) == ("1.5", "(0.5, 1]", "20")
    assert (shaped["prefix_cache"], shaped["prompt_len"]) == ("hit", "512-1k")
    assert [slices.temperature_band(t) for t in (0.0, 0.3, 1.0, 1.3)] == ["greedy", "(0, 0.5]", "(0.5, 1]", "> 1"]


def test_wilson_counts_a_request_step_as_one_trial():
    low, high = slices.wilson(50, 100, 1)
    low_k, high_k = slices.wilson(50, 100, 4)  # 25 trials, not 100: wider
    assert low < 0.5 < high and low_k < low and high_k > high
    assert round(low, 3) == 0.404 and round(high, 3) == 0.596


def test_gap_needs_counts_a_ratio_and_apart_intervals():
    run = (8, 600, 400)
    # 4 requests, 300 drafted, 100 accepted (33 %) vs the rest 300/300 (100 %)
    gap = slices.slice_gap("repetition_penalty", "1.5", (4, 300, 100), run, 3)
    assert gap is not None and round(gap.rate, 3) == 0.333 and gap.rest_rate == 1.0
    assert gap.interval[1] < gap.rest_interval[0]
    assert slices.slice_gap("repetition_penalty", "1.5", (1, 300, 100), (5, 600, 400), 3) is None  # one request
    assert slices.slice_gap("repetition_penalty", "1.5", (4, 60, 20), (8, 360, 320), 3) is None  # too few drafted
    assert slices.slice_gap("temperature", "> 1", (4, 300, 240), (8, 600, 540), 3) is None  # 80 % of the rest: not far
    # far below in rate, but few trials (k large): the intervals overlap
    assert slices.slice_gap("top_k", "20", (2, 100, 40), (4, 200, 100), 50) is None


def test_gaps_name_the_worst_value_per_dimension_and_skip_uniform_ones():
    by_slice = {("repetition_penalty", "1.5"): (4, 300, 60), ("repetition_penalty", "1.2"): (4, 300, 150),
                ("repetition_penalty", "off"): (4, 300, 300), ("temperature", "greedy"): (12, 900, 510)}
    gaps = slices.slice_gaps(by_slice, (12, 900, 510), 3)
    assert [(g.dimension, g.value) for g in gaps] == [("repetition_penalty", "1.5")]


def test_defaults_in_force_are_generation_config_values_the_request_holds():
    p = request_parameters(params(repetition_penalty=1.05, temperature=0.6), None, None)
    assert defaults_in_force(p, {"repetition_penalty": 1.05, "temperature": 0.6, "top_p": 0.95}) == ["repetition_penalty", "temperature"]
    assert defaults_in_force(p, {}) == []


def test_slice_finding_names_the_parameter_and_the_fix():
    gap = slices.slice_gap("repetition_penalty", "1.5", (4, 300, 100), (8, 600, 400), 3)
    f = audit.slice_finding(gap, {"repetition_penalty": 1.5})
    assert (f.code, f.severity) == (codes.SLICE_ACCEPTANCE_LOW, "warning")
    assert "repetition_penalty=1.5 accept 33.3%" in f.message and "unpenalized" in f.message
    assert "cannot see request penalties" in f.fix and "--generation-config vllm" in f.fix
    assert f.evidence["slice"]["drafted"] == 300 and f.evidence["rest"]["rate"] == 1.0 and f.evidence["from_generation_config"]
    lora = audit.slice_finding(slices.slice_gap("lora_adapter", "sql", (4, 300, 100), (8, 600, 400), 3))
    assert "drafter trained for the adapter" in lora.fix and not lora.evidence["from_generation_config"]


# -- pure: the token budget rule ------------------------------------------------------------


def test_token_budget_rule_follows_the_schedulers_budget():
    # draft_model: 1 drafting slot; 256 seqs x (1 + 3 + 1) = 1280 > 1024
    [f] = audit.token_budget_findings(method="draft_model", k=3, max_num_seqs=256, max_num_batched_tokens=1024,
                                      chunked_prefill=True)
    assert (f.code, f.severity, f.component) == (codes.TOKEN_BUDGET_SHORT, "warning", "scheduler")
    assert f.evidence["needed"] == 1280 and f.evidence["full_draft_requests"] == 204 and f.evidence["drafting_slots"] == 1
    assert "chunked prefill" in f.message and "1280" in f.fix
    assert audit.token_budget_findings(method="draft_model", k=3, max_num_seqs=256, max_num_batched_tokens=1280) == []
    assert audit.token_budget_findings(method="eagle3", k=3, max_num_seqs=256, max_num_batched_tokens=1024) == []  # 0 slots
    assert [audit.drafting_slots(m, 4, p) for m, p in [("dflash", False), ("eagle3", True), ("draft_model", True),
                                                       ("mtp", False), ("ngram", False)]] == [4, 3, 4, 0, 0]
    assert audit.token_budget_findings(method="ngram", k=None, max_num_seqs=8, max_num_batched_tokens=8) == []


# -- the drain on whole records -------------------------------------------------------------


@pytest.fixture
def traced(tmp_path):
    rt, sink = memory_runtime(tmp_path, RUN)
    try:
        yield rt, sink
    finally:
        runtime.stop()


def _steps(n_steps: int, requests: dict[str, int], k: int = 3) -> list[EngineStep]:
    """``n_steps`` steps where each request drafts k and accepts ``requests[id]``."""
    rows = {req: i for i, req in enumerate(requests)}
    cached = SimpleNamespace(req_ids=list(requests), num_computed_tokens=[20] * len(requests))
    return [EngineStep(1_000 + s, s, RUN, {r: [1] * k for r in requests}, [a + 1 for a in requests.values()], rows,
                       cached, None, 1) for s in range(1, n_steps + 1)]


def test_drain_writes_slices_and_counts_and_names_the_penalty(traced):
    rt, sink = traced
    capture = rt.verify
    for i in range(8):
        penalized = i % 2 == 1
        capture.new_requests.append(RequestNote(RUN, f"r{i}", params(repetition_penalty=1.5 if penalized else 1.0),
                                                None, prefill(12, 0)))
    # plain requests accept all 3 drafts, penalized ones 0 or 1
    capture.engine_steps.extend(_steps(20, {f"r{i}": (3 if i % 2 == 0 else i % 3 % 2) for i in range(8)}))
    rt.flush()

    slice_rows = sink.rows("request_slices")
    assert sorted(r["request_id"] for r in slice_rows) == [f"r{i}" for i in range(8)]
    r1 = next(r for r in slice_rows if r["request_id"] == "r1")
    assert r1["repetition_penalty"] == 1.5 and r1["prompt_tokens"] == 12 and r1["cached_tokens"] == 0
    assert json.loads(r1["slice"])["repetition_penalty"] == "1.5" and json.loads(r1["generation_defaults"]) == []
    counts = {r["request_id"]: (r["request_steps"], r["drafted"], r["accepted"]) for r in sink.rows("request_counts")}
    assert counts["r0"] == (20, 60, 60) and counts["r1"] == (20, 60, 20) and counts["r3"] == (20, 60, 0)

    [finding] = [f for f in sink.rows("findings") if f["code"] == codes.SLICE_ACCEPTANCE_LOW]
    evidence = json.loads(finding["evidence"])
    assert evidence["dimension"] == "repetition_penalty" and evidence["value"] == "1.5"
    assert evidence["slice"] == {"requests": 4, "drafted": 240, "accepted": 40, "rate": 0.1667,
                                 "interval_95": evidence["slice"]["interval_95"]}
    assert evidence["rest"]["rate"] == 1.0
    # once per run and dimension
    capture.engine_steps.extend(_steps(5, {f"r{i}": 0 for i in range(8)}))
    rt.flush()
    assert sum(f["code"] == codes.SLICE_ACCEPTANCE_LOW for f in sink.rows("findings")) == 1
    assert len(sink.rows("request_slices")) == 8  # a request's slice is written once


def test_drain_healthy_twin_raises_nothing(traced):
    rt, sink = traced
    for i in range(8):
        rt.verify.new_requests.append(RequestNote(RUN, f"r{i}", params(), None, prefill(12 + 100 * i, 0)))
    rt.verify.engine_steps.extend(_steps(20, {f"r{i}": 3 for i in range(8)}))
    rt.flush()
    assert len(sink.rows("request_slices")) == 8
    assert not [f for f in sink.rows("findings") if f["code"] == codes.SLICE_ACCEPTANCE_LOW]


def test_unverified_rule_allows_each_requests_last_proposal():
    assert audit.unverified_drafts(400, 0, 1, 3) is None  # too few proposed
    assert audit.unverified_drafts(1000, 950, 10, 3) is None  # 50 unverified, 30 allowed: 2 %
    ev = audit.unverified_drafts(1000, 700, 10, 3)
    assert ev == {"proposed": 1000, "verified": 700, "requests": 10, "num_speculative_tokens": 3,
                  "finished_allowance": 30, "unverified": 270, "share": 0.27}
    [short] = audit.token_budget_findings(method="draft_model", k=3, max_num_seqs=16, max_num_batched_tokens=32)
    f = audit.unverified_finding(ev, [short])
    assert (f.code, f.caused_by) == (codes.DRAFTS_UNVERIFIED, codes.TOKEN_BUDGET_SHORT)
    assert "27.0% of the drafting work" in f.message and f.evidence["token_budget"]["needed"] == 80
    assert audit.unverified_finding(ev, []).caused_by is None


def test_drain_counts_proposed_against_verified_drafts(traced):
    from spectrace.recorder.verify.capture import Proposal

    rt, sink = traced
    capture = rt.verify
    # 4 requests, each proposal 3 drafts, but the scheduler verified only one per request-step
    for s in range(1, 61):
        capture.proposals.append(Proposal(RUN, [[1, 2, 3]] * 4))
    rows = {f"r{i}": i for i in range(4)}
    cached = SimpleNamespace(req_ids=list(rows), num_computed_tokens=[20] * 4)
    capture.engine_steps.extend(EngineStep(1_000 + s, s, RUN, {r: [1] for r in rows}, [2] * 4, rows, cached, None, 1)
                                for s in range(1, 61))
    rt.flush()
    [row] = sink.rows("draft_budget")
    assert (row["proposed"], row["verified"], row["steps"], row["new_requests"]) == (720, 240, 60, 4)
    [f] = [f for f in sink.rows("findings") if f["code"] == codes.DRAFTS_UNVERIFIED]
    evidence = json.loads(f["evidence"])
    assert (evidence["unverified"], evidence["finished_allowance"]) == (720 - 240 - 4, 4)  # k unknown here: 1


def test_dropped_hits_is_a_lower_bound_from_the_block_size():
    assert audit.dropped_hits(4000, 8, 16, 8000) is None  # 128 of 4128: 3 %
    assert audit.dropped_hits(0, 3, 1024, 8000) is None  # too few hit requests
    ev = audit.dropped_hits(4 * 528, 4, 528, 8000)  # hybrid, large blocks: half the hits dropped
    assert (ev["lost_tokens_at_least"], ev["share_of_hits_lost"]) == (2112, 0.5)
    assert (ev["hit_rate"], ev["hit_rate_without_drop_at_least"]) == (0.264, 0.528)
    f = audit.dropped_hits_finding(ev, "eagle3")
    assert f.code == codes.PREFIX_HITS_DROPPED and "disable_eagle_block_drop" in f.fix and "at least 50%" in f.message


def test_drain_names_dropped_hits_for_an_eagle_run(traced):
    rt, sink = traced
    capture = rt.verify
    config = SimpleNamespace(
        cache_config=SimpleNamespace(enable_prefix_caching=True, block_size=256),
        speculative_config=SimpleNamespace(use_eagle_block_drop=lambda: True),
        model_config=SimpleNamespace(get_diff_sampling_param=lambda: {"repetition_penalty": 1.0}),
    )
    capture.run_configs[RUN] = config
    for i in range(6):
        capture.new_requests.append(RequestNote(RUN, f"r{i}", params(), None, prefill(600, 256 if i else 0)))
    capture.engine_steps.extend(_steps(10, {f"r{i}": 3 for i in range(6)}))
    rt.flush()
    [f] = [f for f in sink.rows("findings") if f["code"] == codes.PREFIX_HITS_DROPPED]
    ev = json.loads(f["evidence"])
    assert (ev["requests_hit"], ev["cached_tokens"], ev["lost_tokens_at_least"], ev["share_of_hits_lost"]) == (5, 1280, 1280, 0.5)
    rows = sink.rows("request_slices")
    assert {(r["block_size"], r["eagle_block_drop"]) for r in rows} == {(256, True)}
