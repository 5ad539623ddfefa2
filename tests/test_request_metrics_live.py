"""Per-request numbers in the field's schema on a real vLLM run (issue #36): spectrace's ``request_spec_decode``
equals vLLM's own ``--per-request-spec-decode-metrics`` request by request, under the ids the user sees, and says
what a request that ended inside an accepted draft really emitted (vLLM #56101).

The session's ``self`` engine (tests/conftest.py ``traced_methods``): the target drafting for itself (100 %
acceptance) at k = 3, greedy, 24 tokens a request, vLLM's per-request metrics on. After the prefill's token every
step verifies 3 drafts and emits 4 tokens: 1 + 5 x 4 = 21, so the sixth step accepts 3 drafts but the request
stops 3 tokens in, at max_tokens."""

from __future__ import annotations

import json

import pytest

import spectrace.store
from spectrace.testing.engine import K, EngineSpec

pytestmark = pytest.mark.vllm

MAX_TOKENS = EngineSpec.__dataclass_fields__["max_tokens"].default
VLLM_FIELDS = ("acceptance_histogram", "num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens",
               "num_spec_tokens", "mean_acceptance_length", "draft_acceptance_rate")


@pytest.fixture(scope="module")
def stopped_mid_draft(traced_methods):
    store, results = traced_methods
    result = results["self"]
    assert result.ok, result.error
    con = spectrace.store.open(store)
    cursor = con.execute("select * from request_spec_decode where run_id = ?", [result.run_id])
    names = [d[0] for d in cursor.description]
    rows = {r["external_request_id"]: r for r in (dict(zip(names, row)) for row in cursor.fetchall())}
    return result, rows, con


def test_every_request_equals_vllms_own_per_request_metrics(stopped_mid_draft):
    result, rows, _ = stopped_mid_draft
    assert sorted(rows) == sorted(r["request_id"] for r in result.requests)  # keyed by the id RequestOutput carries
    for i, request in enumerate(result.requests):
        vllm = request["spec_decode"]
        assert vllm is not None, "vLLM kept no per-request metrics (--per-request-spec-decode-metrics summary)"
        mine = rows[request["request_id"]]
        assert {f: mine[f] for f in VLLM_FIELDS} == {f: vllm[f] for f in VLLM_FIELDS}, request
        assert json.loads(mine["vllm_spec_decode"]) == vllm  # the frontend kept vLLM's own beside spectrace's
        assert mine["output_tokens"] == request["output_tokens"] == len(result.tokens[i])


def test_a_request_that_stops_inside_a_draft_emits_less_than_it_accepted(stopped_mid_draft):
    result, rows, _ = stopped_mid_draft
    steps = -(-(MAX_TOKENS - 1) // (K + 1))  # verify steps after the prefill's token, the last one cut
    for request in result.requests:
        r = rows[request["request_id"]]
        h = r["acceptance_histogram"]
        # the identities, on the real run
        assert sum(h) == r["num_spec_steps"]
        assert sum(j * n for j, n in enumerate(h)) == r["num_accepted_draft_tokens"]
        assert r["emitted_tokens"] <= r["num_accepted_draft_tokens"] + r["num_spec_steps"]
        # a drafter that drafts at every decode step: the output is the prefill's token and what the steps emitted
        assert r["output_tokens"] == r["emitted_tokens"] + 1 == MAX_TOKENS
        # vLLM #56101: every matched draft counts (acceptance length K + 1 at 100 %), though the last step's
        # request stopped inside it: the steps emitted fewer tokens per step than the acceptance length says
        assert r["num_spec_steps"] == steps and r["num_accepted_draft_tokens"] == steps * K
        assert r["mean_acceptance_length"] == K + 1
        assert r["emitted_tokens"] == MAX_TOKENS - 1 < steps * (K + 1)
        assert r["emitted_per_step"] == (MAX_TOKENS - 1) / steps
        assert r["finish_reason"] == "length"


def test_verify_steps_carry_what_each_step_emitted(stopped_mid_draft):
    result, rows, con = stopped_mid_draft
    steps = con.execute(
        "select request_id, list(num_accepted order by step), list(num_emitted order by step) from verify_steps "
        "where run_id = ? group by request_id", [result.run_id]).fetchall()
    assert len(steps) == len(result.requests)
    n = -(-(MAX_TOKENS - 1) // (K + 1))
    for _, accepted, emitted in steps:
        assert accepted == [K] * n and emitted == [K + 1] * (n - 1) + [MAX_TOKENS - 1 - (n - 1) * (K + 1)]
