"""The view ``request_spec_decode`` on stored records (no vLLM): a request's flushes summed into vLLM's per-request
schema (``RequestSpecDecodeMetrics.to_dict``), its dense histogram, the ids the user sees, its slice, its run's
findings. tests/test_request_metrics_live.py compares the same view with vLLM's own numbers on a real run."""

from __future__ import annotations

import json

import spectrace.store
from spectrace.testing import store_pipeline


def _rows(tmp_path):
    writer = store_pipeline(tmp_path, retention_s=0, compact_interval_s=0)
    engine = {"run_id": "r", "process_role": "engine_core", "ts": 2}
    writer.append("runs", {"run_id": "r", "process_role": "frontend", "started_at": 1, "method": "eagle3",
                           "num_speculative_tokens": 4})
    # request a over two flushes: steps accepting 4, 4 | 1, 0, 2 (the last one stopped after 1 token)
    writer.append("request_counts", {**engine, "request_id": "a-1f2e3d4c", "request_steps": 2, "drafted": 8,
                                     "accepted": 8, "emitted": 10, "histogram": json.dumps([0, 0, 0, 0, 2])})
    writer.append("request_counts", {**engine, "request_id": "a-1f2e3d4c", "request_steps": 3, "drafted": 12,
                                     "accepted": 3, "emitted": 4, "histogram": json.dumps([1, 1, 1])})
    # request b: drafts all rejected, no frontend row (a request still running)
    writer.append("request_counts", {**engine, "request_id": "b-00000000", "request_steps": 2, "drafted": 6,
                                     "accepted": 0, "emitted": 2, "histogram": json.dumps([2])})
    writer.append("request_outputs", {"run_id": "r", "process_role": "frontend", "ts": 3, "request_id": "a-1f2e3d4c",
                                      "external_request_id": "a", "output_tokens": 15, "finish_reason": "stop",
                                      "vllm_spec_decode": None})
    writer.append("request_slices", {**engine, "request_id": "a-1f2e3d4c", "slice": json.dumps({"temperature": "0"})})
    writer.append("findings", {**engine, "code": "SWA_DROPPED", "severity": "error", "component": "config",
                               "message": "m", "evidence": "{}", "fix": "f"})
    writer.append("findings", {**engine, "code": "LAYOUT_MISMATCH", "severity": "info", "component": "layout",
                               "message": "m", "evidence": "{}", "fix": "", "caused_by": "SWA_DROPPED"})
    writer.flush()
    con = spectrace.store.open(tmp_path)
    cursor = con.execute("select * from request_spec_decode order by request_id")
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def test_a_requests_flushes_sum_to_vllms_per_request_fields(tmp_path):
    a, b = _rows(tmp_path)
    assert a["request_id"] == "a-1f2e3d4c" and a["external_request_id"] == "a"
    assert a["acceptance_histogram"] == [1, 1, 1, 0, 2]  # dense to k = 4, summed across flushes
    assert (a["num_spec_steps"], a["num_accepted_draft_tokens"], a["num_draft_tokens"], a["num_spec_tokens"]) == (5, 11, 20, 4)
    assert a["mean_acceptance_length"] == 1 + 11 / 5 and a["draft_acceptance_rate"] == 11 / 20
    assert (a["emitted_tokens"], a["emitted_per_step"], a["output_tokens"], a["finish_reason"]) == (14, 14 / 5, 15, "stop")
    assert json.loads(a["slice"]) == {"temperature": "0"} and a["run_findings"] == ["SWA_DROPPED"]  # roots only
    assert b["acceptance_histogram"] == [2, 0, 0, 0, 0] and b["draft_acceptance_rate"] == 0.0
    assert b["mean_acceptance_length"] == 1.0 and b["external_request_id"] is None and b["output_tokens"] is None


def test_the_report_lists_the_runs_requests_in_that_schema(tmp_path):
    from spectrace.queries import report

    _rows(tmp_path)
    text = report.render(spectrace.store.open(tmp_path), run_id="r")
    line = next(x for x in text.splitlines() if "per request (2 requests" in x)
    assert "acceptance length 2.57, tokens emitted per verify step 2.29" in line  # (11 + 7) / 7, 16 / 7
    assert "stopped inside an accepted draft" in line


def test_the_view_and_the_report_keep_the_clients_response_id_and_tell_n_choices_apart(tmp_path):
    """Two choices of one n=2 completion (one engine request each, one response id): the view and the report's
    lowest-acceptance table carry the response id and each one's choice index."""
    from spectrace.queries import report

    writer = store_pipeline(tmp_path, retention_s=0, compact_interval_s=0)
    engine = {"run_id": "r", "process_role": "engine_core", "ts": 2}
    writer.append("runs", {"run_id": "r", "process_role": "frontend", "started_at": 1, "method": "eagle3",
                           "num_speculative_tokens": 2})
    for choice, accepted in ((0, 1), (1, 3)):
        rid = f"{choice}_cmpl-894f-0-1f2e3d4c"
        writer.append("request_counts", {**engine, "request_id": rid, "request_steps": 4, "drafted": 8,
                                         "accepted": accepted, "emitted": 4 + accepted, "histogram": None})
        writer.append("request_outputs", {"run_id": "r", "process_role": "frontend", "ts": 3, "request_id": rid,
                                          "external_request_id": "cmpl-894f", "choice_index": choice,
                                          "output_tokens": 4 + accepted})
    writer.flush()
    con = spectrace.store.open(tmp_path)
    rows = con.execute("select external_request_id, choice_index, num_accepted_draft_tokens from request_spec_decode "
                       "order by choice_index").fetchall()
    assert rows == [("cmpl-894f", 0, 1), ("cmpl-894f", 1, 3)]
    lines = report.render(con, run_id="r").splitlines()
    head = next(i for i, x in enumerate(lines) if "request (response id)" in x)
    assert lines[head].split()[:4] == ["request", "(response", "id)", "choice"]
    assert [x.split()[:3] for x in lines[head + 2:head + 4]] == [["cmpl-894f", "0", "4"], ["cmpl-894f", "1", "4"]]


def test_client_ids_undo_the_completions_endpoints_per_prompt_suffix():
    from spectrace.request_ids import client_ids

    assert client_ids("cmpl-894f", 0, 1) == ("cmpl-894f", 0)
    assert client_ids("cmpl-894f-0", 1, 2) == ("cmpl-894f", 1)  # n=2, the first prompt's second choice
    assert client_ids("cmpl-894f-1", 1, 2) == ("cmpl-894f", 3)  # the second prompt's: serving.py's i * n + index
    assert client_ids("cmpl-my-own-id-0", 0, None) == ("cmpl-my-own-id", 0)  # an X-Request-Id of the client's
    assert client_ids("chatcmpl-ab12-0", 1, 2) == ("chatcmpl-ab12-0", 1)  # chat passes its id through
