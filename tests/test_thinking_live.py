"""Thinking mode per request on a real vLLM run (CPU build).

The zoo target drafting for itself (``draft_model``, 100 % greedy acceptance), with vLLM's reasoning
markers set (``ReasoningConfig(reasoning_start_str="<think>", reasoning_end_str="</think>")``: the zoo
tokenizer splits each marker into several tokens, which no reasoning *parser* accepts, so no parser is
named). Prompts are rendered as Qwen3's chat template renders them: thinking off ends the prompt in an
empty, closed block (``<think>\\n\\n</think>\\n\\n``), thinking on in an open ``<think>\\n``. The engine
core reads each request's mode from its prompt's token tail; both modes accept alike (the self-drafter),
so ``THINKING_MODE_GAP`` stays quiet.
"""

from __future__ import annotations

import json
import time

import pytest

import spectrace.store
from spectrace.audit import codes
from spectrace.testing.engine import EngineSpec, run_engines

pytestmark = pytest.mark.vllm

K = 3
QUESTIONS = ["the quick brown fox", "hello world speculative decoding", "once upon a time there was",
             "one two three four five"]
OFF = "user: {q}\nassistant: <think>\n\n</think>\n\n"
ON = "user: {q}\nassistant: <think>\n"
PROMPTS = [template.format(q=q) for q in QUESTIONS for template in (ON, OFF)]  # on, off, on, off, ...


@pytest.fixture(scope="module")
def thinking_run(zoo, scratch, cache_root):
    store = scratch / "thinking-store"
    target = zoo["target"]
    spec = EngineSpec(name="thinking", target=target, prompts=PROMPTS, max_tokens=48,
                      speculative={"method": "draft_model", "model": target, "num_speculative_tokens": K},
                      extra_llm_kwargs={"reasoning_config": {"reasoning_start_str": "<think>",
                                                             "reasoning_end_str": "</think>"},
                                        "per_request_spec_decode_metrics": "summary"})
    started = time.perf_counter()
    results = run_engines([spec], store=store, cache_root=cache_root, log_file=scratch / "thinking.log")
    print(f"thinking live child: {time.perf_counter() - started:.1f} s")
    result = results["thinking"]
    assert result.ok and result.run_id, result.error
    return spectrace.store.open(store), result


def test_each_requests_mode_is_read_from_its_prompt_tail(thinking_run):
    con, result = thinking_run
    rows = con.execute("select request_id, thinking_mode, thinking_source, \"slice\" from request_slices "
                       "where run_id = ? order by request_id", [result.run_id]).fetchall()
    assert len(rows) == len(PROMPTS)
    modes = sorted((mode, source, json.loads(s)["thinking_mode"]) for _, mode, source, s in rows)
    assert modes == [("off", "prompt_tail", "off")] * 4 + [("on", "prompt_tail", "on")] * 4


def test_acceptance_per_mode_is_the_runs_counts_and_quiet(thinking_run):
    con, result = thinking_run
    per_mode = {value: (requests, drafted, accepted) for value, requests, drafted, accepted in con.execute(
        "select value, requests, drafted, accepted from acceptance_by_slice where run_id = ? and dimension = "
        "'thinking_mode'", [result.run_id]).fetchall()}
    counted = {mode: tuple(int(x) for x in row) for mode, *row in con.execute(
        "select s.thinking_mode, count(distinct c.request_id), sum(c.drafted), sum(c.accepted) from request_counts c "
        "join (select distinct run_id, request_id, thinking_mode from request_slices) s using (run_id, request_id) "
        "where c.run_id = ? group by s.thinking_mode", [result.run_id]).fetchall()}
    assert set(per_mode) == {"on", "off"} and {m: tuple(int(x) for x in v) for m, v in per_mode.items()} == counted
    # vLLM's own per-request counters (--per-request-spec-decode-metrics), by the mode each prompt was rendered in
    vllm = {"on": [0, 0, 0], "off": [0, 0, 0]}
    for prompt, request in zip(PROMPTS, result.requests):
        own = request["spec_decode"]
        mode = vllm["off" if prompt.endswith("</think>\n\n") else "on"]
        mode[0], mode[1], mode[2] = mode[0] + 1, mode[1] + own["num_draft_tokens"], mode[2] + own["num_accepted_draft_tokens"]
    print(f"thinking live per mode (requests, drafted, accepted): {counted}")
    assert {m: tuple(v) for m, v in vllm.items()} == counted
    for requests, drafted, accepted in counted.values():
        assert requests == 4 and drafted > 0 and accepted == drafted  # the self-drafter: both modes accept alike
    assert con.execute("select count(*) from findings where run_id = ? and code in (?, ?)",
                       [result.run_id, codes.THINKING_MODE_GAP, codes.SLICE_ACCEPTANCE_LOW]).fetchone()[0] == 0
