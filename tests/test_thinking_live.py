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


# -- the phase of each verify step, on a real run ------------------------------------------------------------
#
# The zoo's random target never writes "</think>", so the run's think end marker is a token the target does write,
# midway through several of the prompts left in thinking (read off the first run: greedy output is the same in both
# runs, the reasoning markers change nothing vLLM samples). Every verify step of those requests before the marker
# came out was drafted in reasoning, every one after it in the answer.

ON_PROMPTS = [p for p in PROMPTS if p.endswith("<think>\n")]


def _marker(tokenizer, prompts: list[str], outputs: list[list[int]]) -> int:
    """A token that several outputs write first between their 3rd and their 8th-last token, never first token of
    any, in no prompt, and that its own text tokenizes back to (vLLM tokenizes the marker string)."""
    in_prompts = {t for p in prompts for t in tokenizer.encode(p, add_special_tokens=False)}
    score: dict[int, int] = {}
    for out in outputs:
        for t in set(out) - in_prompts:
            first = out.index(t)
            if out[0] != t and 2 <= first <= len(out) - 8:
                score[t] = score.get(t, 0) + 1
    for t in sorted(score, key=lambda t: (-score[t], t)):
        if score[t] >= 2 and tokenizer.encode(tokenizer.decode([t]), add_special_tokens=False) == [t]:
            return t
    raise AssertionError(f"no token of the first run's outputs makes a marker: {score}")


@pytest.fixture(scope="module")
def phase_run(thinking_run, zoo, scratch, cache_root):
    from transformers import AutoTokenizer

    _, first = thinking_run
    tokenizer = AutoTokenizer.from_pretrained(zoo["target"])
    outputs = [tokens for prompt, tokens in zip(PROMPTS, first.tokens) if prompt in ON_PROMPTS]
    marker = _marker(tokenizer, PROMPTS, outputs)
    store = scratch / "thinking-phase-store"
    target = zoo["target"]
    spec = EngineSpec(name="phases", target=target, prompts=ON_PROMPTS, max_tokens=48,
                      speculative={"method": "draft_model", "model": target, "num_speculative_tokens": K},
                      extra_llm_kwargs={"reasoning_config": {"reasoning_start_str": "<think>",
                                                             "reasoning_end_str": tokenizer.decode([marker])}})
    results = run_engines([spec], store=store, cache_root=cache_root, log_file=scratch / "thinking-phases.log")
    result = results["phases"]
    assert result.ok and result.run_id, result.error
    return spectrace.store.open(store), result, marker


def test_each_verify_step_is_counted_in_the_phase_it_was_drafted_in(phase_run):
    con, result, marker = phase_run
    phases = {phase: tuple(int(x) for x in rest) for phase, *rest in con.execute(
        "select phase, sum(request_steps), sum(drafted), sum(accepted) from thinking_phases where run_id = ? "
        "group by phase", [result.run_id]).fetchall()}
    # vLLM's own output tokens say where each request's marker came out; spectrace's own per-step rows say what
    # each step emitted: a step began at the output position 1 (the prefill's token) + what its earlier steps emitted
    ids = dict(con.execute("select external_request_id, request_id from request_outputs").fetchall())
    expected = {"reasoning": [0, 0, 0], "answer": [0, 0, 0]}
    ended = 0
    for request, tokens in zip(result.requests, result.tokens):
        end = tokens.index(marker) if marker in tokens else None
        ended += end is not None
        position = 1
        for drafted, accepted, emitted in con.execute(
                "select num_drafted, num_accepted, num_emitted from verify_steps where run_id = ? and request_id = ? "
                "order by step", [result.run_id, ids[request["request_id"]]]).fetchall():
            counts = expected["reasoning" if end is None or position <= end else "answer"]
            counts[0], counts[1], counts[2] = counts[0] + 1, counts[1] + drafted, counts[2] + accepted
            position += emitted
    print(f"thinking live phases (request-steps, drafted, accepted): {phases}; marker {marker}, {ended} ended")
    assert ended >= 2 and phases == {phase: tuple(c) for phase, c in expected.items()}
    assert all(steps > 0 for steps, _, _ in phases.values())
    # the self-drafter accepts alike in both phases: THINKING_MODE_GAP stays quiet
    assert con.execute("select count(*) from findings where run_id = ? and code = ?",
                       [result.run_id, codes.THINKING_MODE_GAP]).fetchone()[0] == 0


def test_the_report_shows_acceptance_by_phase(phase_run):
    from spectrace.queries.report import render

    con, result, _ = phase_run
    text = render(con, run_id=result.run_id)
    section = text[text.index("Acceptance by thinking mode"):].splitlines()
    assert any(line.split()[:2] == ["phase", "reasoning"] for line in section)
    assert any(line.split()[:2] == ["phase", "answer"] for line in section)
    assert any(line.split()[:3] == ["mode", "on", "prompt_tail"] for line in section)


# -- the mode a chat request asked for, on a real server -------------------------------------------------------


@pytest.fixture(scope="module")
def served_chats(zoo, scratch, cache_root):
    """``vllm serve`` with thinking on by default (``--default-chat-template-kwargs``): three chats turn it off
    (their own ``chat_template_kwargs``), three keep the default, one names its own id (``X-Request-Id``). The zoo's
    chat template renders ``enable_thinking`` as Qwen3's does, and the server knows the think markers
    (``--reasoning-config``), so the engine core reads each prompt's tail too."""
    from spectrace.testing import wait_until
    from spectrace.testing.engine import base_env
    from spectrace.testing.prometheus import free_port
    from spectrace.testing.serve import Server

    store = scratch / "thinking-serve-store"
    env = base_env(store, multiprocessing=True, cache_root=cache_root)
    env.update(SPECTRACE_FLUSH_INTERVAL="0.5")
    args = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "512", "--kv-cache-memory-bytes", str(64 << 20),
            "--speculative-config", json.dumps({"method": "draft_model", "model": zoo["target"],
                                                "num_speculative_tokens": K}),
            "--default-chat-template-kwargs", json.dumps({"enable_thinking": True}),
            "--reasoning-config", json.dumps({"reasoning_start_str": "<think>", "reasoning_end_str": "</think>"})]
    server = Server(zoo["target"], args, env, scratch / "thinking-serve.log", free_port())
    ids = {}
    try:
        server.start()
        for question in QUESTIONS[:3]:
            ids[server.chat(question, chat_template_kwargs={"enable_thinking": False})["id"]] = ("off", "kwarg")
        for question in QUESTIONS[:2]:
            ids[server.chat(question)["id"]] = ("on", "default")
        ids[server.chat(QUESTIONS[3], headers={"X-Request-Id": "own-id-7"})["id"]] = ("on", "default")
        # with the server up: vLLM's Ctrl-C SIGKILLs the engine core, and what it had not shipped yet is lost
        wait_until(lambda: _stored(store, len(ids)), 120, "every chat's mode and counts in the store")
    finally:
        server.stop()
    return spectrace.store.open(store), ids


def _stored(store, n):
    try:
        con = spectrace.store.open(store)
        got = con.execute("select count(*) from request_thinking where thinking_source in ('kwarg', 'default')").fetchone()[0]
    except Exception:
        return None
    return con if got >= n else None


def test_each_chats_mode_is_read_from_its_kwargs_or_the_servers_default(served_chats):
    con, ids = served_chats
    rows = con.execute("select o.external_request_id, t.thinking_mode, t.thinking_source from request_thinking t "
                       "join (select distinct request_id, external_request_id from request_outputs) o using (request_id)"
                       ).fetchall()
    print(f"thinking live chats: {rows}")
    assert {rid: (mode, source) for rid, mode, source in rows} == ids
    assert "chatcmpl-own-id-7" in ids  # vLLM's response id from the X-Request-Id header, as the hook builds it
    # the engine core read the same mode off each rendered prompt's tail: the template rendered what was asked
    tails = con.execute("select o.external_request_id, s.thinking_mode, s.thinking_source from request_slices s "
                        "join (select distinct request_id, external_request_id from request_outputs) o "
                        "using (request_id)").fetchall()
    assert {rid: (mode, source) for rid, mode, source in tails} == {rid: (mode, "prompt_tail")
                                                                   for rid, (mode, _) in ids.items()}
    keys = {k for (k,) in con.execute("select distinct thinking_key from chat_requests").fetchall()}
    assert keys == {"enable_thinking"}
    # the hook runs in the API server only: installed there, elsewhere in the engine core
    statuses = {status for (status,) in con.execute(
        "select distinct status from hooks where hook = 'frontend.chat_request'").fetchall()}
    assert statuses == {"installed", "elsewhere"}
