"""Per-request numbers in the field's schema on a real vLLM run (issue #36): spectrace's ``request_spec_decode``
equals vLLM's own ``--per-request-spec-decode-metrics`` request by request, under the ids the user sees, and says
what a request that ended inside an accepted draft really emitted (vLLM #56101)."""

from __future__ import annotations

import json

import pytest

import spectrace.store
from spectrace.testing.engine import EngineSpec, run_engines

pytestmark = pytest.mark.vllm

K = 7
MAX_TOKENS = 10  # a 100 % drafter at k 7: the second verify step accepts 7 drafts but the request stops 1 token in


@pytest.fixture(scope="module")
def stopped_mid_draft(zoo, scratch, cache_root):
    store = scratch / "request-metrics-store"
    spec = EngineSpec(
        name="self-k7",
        target=zoo["target"],
        speculative={"method": "draft_model", "model": zoo["draft_self"], "num_speculative_tokens": K},
        max_tokens=MAX_TOKENS,
        extra_llm_kwargs={"per_request_spec_decode_metrics": "summary"},
    )
    result = run_engines([spec], store=store, cache_root=cache_root, log_file=scratch / "request-metrics.log")[spec.name]
    assert result.ok, result.error
    con = spectrace.store.open(store)
    cursor = con.execute("select * from request_spec_decode where run_id = ?", [result.run_id])
    names = [d[0] for d in cursor.description]
    rows = {r["external_request_id"]: r for r in (dict(zip(names, row)) for row in cursor.fetchall())}
    return result, rows, con


VLLM_FIELDS = ("acceptance_histogram", "num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens",
               "num_spec_tokens", "mean_acceptance_length", "draft_acceptance_rate")


def test_every_request_equals_vllms_own_per_request_metrics(stopped_mid_draft):
    result, rows, _ = stopped_mid_draft
    assert sorted(rows) == sorted(r["request_id"] for r in result.requests)  # keyed by the id RequestOutput carries
    for request in result.requests:
        vllm = request["spec_decode"]
        assert vllm is not None, "vLLM kept no per-request metrics (--per-request-spec-decode-metrics summary)"
        mine = rows[request["request_id"]]
        assert {f: mine[f] for f in VLLM_FIELDS} == {f: vllm[f] for f in VLLM_FIELDS}, request
        assert json.loads(mine["vllm_spec_decode"]) == vllm  # the frontend kept vLLM's own beside spectrace's
        assert mine["output_tokens"] == request["output_tokens"] == len(result.tokens[result.requests.index(request)])


def test_a_request_that_stops_inside_a_draft_emits_less_than_it_accepted(stopped_mid_draft):
    result, rows, _ = stopped_mid_draft
    for request in result.requests:
        r = rows[request["request_id"]]
        h = r["acceptance_histogram"]
        # the identities, on the real run
        assert sum(h) == r["num_spec_steps"]
        assert sum(j * n for j, n in enumerate(h)) == r["num_accepted_draft_tokens"]
        assert r["emitted_tokens"] <= r["num_accepted_draft_tokens"] + r["num_spec_steps"]
        # the 100 % drafter: its first token comes from the prefill (no drafts), every later step verifies k
        # drafts, so the verify steps emitted all but that first token of the output
        assert r["output_tokens"] == r["emitted_tokens"] + 1
        # vLLM #56101: it counts every matched draft (mean acceptance length 8 at k 7), though the request
        # returned MAX_TOKENS tokens: the steps emitted fewer tokens per step than the acceptance length says
        assert r["num_spec_steps"] == 2 and r["num_accepted_draft_tokens"] == 2 * K
        assert r["mean_acceptance_length"] == K + 1
        assert r["emitted_tokens"] == MAX_TOKENS - 1 and r["emitted_per_step"] == (MAX_TOKENS - 1) / 2
        assert r["finish_reason"] == "length"


def test_verify_steps_carry_what_each_step_emitted(stopped_mid_draft):
    result, rows, con = stopped_mid_draft
    steps = con.execute(
        "select request_id, list(num_accepted order by step), list(num_emitted order by step) from verify_steps "
        "where run_id = ? group by request_id", [result.run_id]).fetchall()
    assert len(steps) == len(result.requests)
    for _, accepted, emitted in steps:
        assert accepted == [K, K] and emitted == [K + 1, MAX_TOKENS - 1 - (K + 1)]
