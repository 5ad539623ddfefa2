"""One rule decides which findings are active (spectrace.audit.rules.active), wherever they are read: a real
`vllm serve` (CPU build) whose acceptance collapses and recovers, read by `spectrace top` on its API port and on its
store, and by `spectrace report`.

The drafter is the target itself (``draft_model``): greedy requests accept every draft. Hot requests (temperature 2
and the strongest repetition, frequency and presence penalties) accept a draft only as often as the target, after
penalties the drafter does not see, samples the drafter's greedy pick. So the request mix alone moves acceptance:
greedy, then hot (ACCEPTANCE_COLLAPSE), then greedy again (ACCEPTANCE_RECOVERED), on one engine and one run, with a
collapse window small enough for a few requests and a threshold between the two mixes.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

import spectrace.store
from spectrace import top
from spectrace.audit import codes
from spectrace.testing import wait_until
from spectrace.testing.engine import base_env
from spectrace.testing.prometheus import free_port
from spectrace.testing.serve import Server

pytestmark = pytest.mark.vllm

PROMPTS = ["the quick brown fox", "once upon a time there", "in a hole in the ground", "it was a bright cold day"]
COLLAPSE, RECOVERED = codes.ACCEPTANCE_COLLAPSE, codes.ACCEPTANCE_RECOVERED
HOT = {"temperature": 2.0, "repetition_penalty": 2.0, "frequency_penalty": 2.0, "presence_penalty": 2.0}


def _vllm_acceptance(server) -> tuple[float, float]:
    """vLLM's own (accepted, drafted) draft tokens so far, from its /metrics."""
    sums = {}
    for line in server.metrics().splitlines():
        for name in ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total"):
            if line.startswith(name + "{") or line.startswith(name + " "):
                sums[name] = sums.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return (sums.get("vllm:spec_decode_num_accepted_tokens_total", 0.0),
            sums.get("vllm:spec_decode_num_draft_tokens_total", 0.0))


def _rate(before, after) -> float | None:
    drafted = after[1] - before[1]
    return (after[0] - before[0]) / drafted if drafted else None


def _episodes(store) -> list[str]:
    con = spectrace.store.open(store)
    return [c for (c,) in con.execute("select code from findings where code in (?, ?) order by ts", [COLLAPSE, RECOVERED]).fetchall()]


def _found(frame) -> set[tuple[str, str, str]]:
    return {(severity, code, role) for severity, code, role, *_ in frame.findings}


def _agreeing(url: str, store) -> tuple[set, set]:
    """(URL findings, store findings) once the two agree: the API port's page lags the store by a flush."""
    def agree():
        by_url = _found(top.MetricsSource([url], window_s=60).frame())
        by_store = _found(top.StoreSource(str(store), window_s=60).frame())
        return (by_url, by_store) if by_url == by_store else None

    try:
        return wait_until(agree, 30, "top URL and top --dir to agree")
    except Exception:
        # what each said, for the assertion below to show
        return (_found(top.MetricsSource([url], window_s=60).frame()),
                _found(top.StoreSource(str(store), window_s=60).frame()))


@pytest.fixture(scope="module")
def recovered(zoo, scratch, cache_root):
    store = scratch / "active-store"
    env = base_env(store, multiprocessing=True, cache_root=cache_root)
    env.update(SPECTRACE_FLUSH_INTERVAL="0.5", SPECTRACE_COLLAPSE_WINDOW="120", SPECTRACE_COLLAPSE_MIN_TOKENS="60",
               SPECTRACE_COLLAPSE_THRESHOLD="0.4")
    args = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "512", "--kv-cache-memory-bytes", str(64 << 20),
            "--speculative-config", json.dumps({"method": "draft_model", "model": zoo["target"], "num_speculative_tokens": 3})]
    server = Server(zoo["target"], args, env, scratch / "active-serve.log", free_port())
    url = f"http://127.0.0.1:{server.port}"
    seen = {}
    try:
        server.start()
        marks = [_vllm_acceptance(server)]
        for p in PROMPTS:
            server.complete(p, max_tokens=32)
        marks.append(_vllm_acceptance(server))
        # hot: until the collapse is in the store
        for i in range(40):
            server.complete(PROMPTS[i % len(PROMPTS)], max_tokens=32, seed=i, **HOT)
            if COLLAPSE in _episodes(store):
                break
        marks.append(_vllm_acceptance(server))
        seen["rates"] = [_rate(a, b) for a, b in zip(marks, marks[1:])]  # vLLM's own: greedy, hot
        wait_until(lambda: COLLAPSE in _episodes(store), 30, f"ACCEPTANCE_COLLAPSE in the store (rates {seen['rates']})")
        seen["collapsed"] = _agreeing(url, store)
        # greedy again: until the recovery is in the store
        for i in range(40):
            server.complete(PROMPTS[i % len(PROMPTS)], max_tokens=48)
            if RECOVERED in _episodes(store):
                break
        marks.append(_vllm_acceptance(server))
        seen["rates"].append(_rate(marks[-2], marks[-1]))
        print(f"vLLM's own acceptance, greedy / hot / greedy again: {seen['rates']}")
        wait_until(lambda: RECOVERED in _episodes(store), 30, f"ACCEPTANCE_RECOVERED in the store (rates {seen['rates']})")
        seen["episodes"] = _episodes(store)
        seen["recovered"] = _agreeing(url, store)
        seen["page"] = server.metrics()
    finally:
        server.stop()
    con = spectrace.store.open(store)
    [(run_id,)] = con.execute("select distinct run_id from findings where code = ?", [COLLAPSE]).fetchall()
    seen["run_id"] = run_id
    out = io.StringIO()
    from spectrace.cli import main

    with contextlib.redirect_stdout(out):
        seen["report_code"] = main(["report", "--dir", str(store), "--run", run_id])
    seen["report"] = out.getvalue()
    return seen


def test_top_on_the_api_port_and_on_the_store_agree_while_collapsed(recovered):
    greedy, hot, again = recovered["rates"]  # vLLM's own acceptance in each phase: the mix moved it
    assert greedy > 0.9 and hot < 0.4 and again > 0.9, recovered["rates"]
    by_url, by_store = recovered["collapsed"]
    assert by_url == by_store
    assert ("error", COLLAPSE, "draft") in by_store


def test_top_on_the_api_port_and_on_the_store_agree_on_a_recovered_collapse(recovered):
    assert recovered["episodes"][:2] == [COLLAPSE, RECOVERED]  # the store keeps both rows: the history
    by_url, by_store = recovered["recovered"]
    assert by_url == by_store
    assert not {code for _, code, _ in by_store} & {COLLAPSE, RECOVERED}
    assert 'code="ACCEPTANCE_COLLAPSE"' not in recovered["page"]


def test_report_says_the_collapse_was_cleared(recovered):
    text = recovered["report"]
    assert recovered["report_code"] == 0, text
    assert f"(cleared since: {RECOVERED})" in text
    assert "1 cleared since, not active" in text
    assert "recovered" in text.split("Collapse timeline:")[1]
