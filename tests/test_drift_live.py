"""Acceptance that changes in time, on real vLLM runs (CPU build; issue #58 item 6): a served stream of requests whose
drafter's weights change in place between engine steps, as a reload or a swap gone wrong would change them.

Three runs of the zoo target drafted by itself (``draft_model``, k = 3), each drafter given the same small noise at
the start (acceptance about 40 %), 48 requests of 128 tokens, 8 in flight (spectrace.testing.engine ``_stream``):
- ``step``: noise in the drafter's final norm at engine step 150, the loaded weights (and the start's noise) back at
  step 230: a step change that the requests in flight ran across, then its recovery;
- ``decay``: a little more noise in the final norm every 5 steps from step 60: a steady decline;
- ``steady``: nothing after the start: the quiet twin, the same requests and the same acceptance throughout.
Greedy verification keeps the target's output whatever the drafter drafts; the target's weights are never touched.
"""

from __future__ import annotations

import pytest

import spectrace.store
from spectrace.audit import codes
from spectrace.queries import named, report
from spectrace.testing.engine import EngineSpec, run_engines

pytestmark = pytest.mark.vllm

PROMPTS = ["the quick brown fox", "hello world speculative decoding", "a b c d e f g", "once upon a time there was",
           "in the beginning", "one two three four", "to be or not to be", "lorem ipsum dolor"]
START = {"at_step": 0, "noise": 0.03, "seed": 1}
# the later changes touch the drafter's final norm only: what it drafts changes at once for every request, with
# nothing left in the requests' KV caches from before (noise in the layers would fade in as the caches turn over)
HEAD = "model.norm."
SIGNATURES = (codes.ACCEPTANCE_STEP_CHANGE, codes.ACCEPTANCE_DECAY, codes.ACCEPTANCE_RESTORED)


@pytest.fixture(scope="module")
def runs(zoo, scratch, cache_root):
    def spec(name, changes):
        return EngineSpec(name, zoo["target"], prompts=PROMPTS, max_tokens=128, stream_requests=48,
                          speculative={"method": "draft_model", "model": zoo["draft_self"], "num_speculative_tokens": 3},
                          drafter_changes=[START, *changes])

    specs = [
        spec("step", [{"at_step": 150, "noise": 0.8, "seed": 2, "only": HEAD},
                      {**START, "at_step": 230, "restore": True}]),
        spec("decay", [{"at_step": 60 + 5 * i, "noise": 0.06, "seed": 10 + i, "only": HEAD} for i in range(140)]),
        spec("steady", []),
    ]
    store = scratch / "drift-store"
    results = run_engines(specs, store=store, cache_root=cache_root, env={"SPECTRACE_FLUSH_INTERVAL": "0.2"},
                          log_file=scratch / "drift.log")
    assert all(r.ok for r in results.values()), {n: r.error for n, r in results.items()}
    return spectrace.store.open(store), results


def _signatures(con, run_id):
    import json

    rows = con.execute("select code, evidence, message from findings where run_id = ? and code in (?, ?, ?) order by ts",
                       [run_id, *SIGNATURES]).fetchall()
    return [(code, json.loads(evidence), message) for code, evidence, message in rows]


def _rate(con, run_id, where, *args):
    """Acceptance of the run's verified request-steps (``verify_steps``: each with its step's time) ``where``."""
    drafted, accepted = con.execute(f"select sum(num_drafted), sum(num_accepted) from verify_steps where run_id = ? "
                                    f"and {where}", [run_id, *args]).fetchone()
    return round(accepted / drafted, 4)


def test_a_step_change_is_named_at_its_moment_with_the_requests_across_it_then_its_recovery(runs):
    con, results = runs
    run = results["step"]
    _, changed, restored = run.drafter_changed_ns
    (step_code, step, message), (restored_code, back, _) = _signatures(con, run.run_id)
    assert (step_code, restored_code) == (codes.ACCEPTANCE_STEP_CHANGE, codes.ACCEPTANCE_RESTORED), message
    # when: the change lies between the last step before the onset and the onset, to within a flush or two
    assert step["onset_after_ts_ns"] <= step["onset_ts_ns"]
    assert step["onset_after_ts_ns"] - 3e9 <= changed <= step["onset_ts_ns"] + 3e9, (step, changed)
    # the rate before it is what the run's request-steps up to then accepted (verify_steps, each at its step's time)
    assert step["rate_before"] == _rate(con, run.run_id, "ts <= make_timestamp_ns(?)", step["onset_after_ts_ns"])
    assert step["rate_after"] < 0.6 * step["rate_before"] and step["after_level"] < 0.7 * step["before_level"]
    # the requests in flight across it are their own control: each accepted less after it
    assert step["carried_requests"] >= 4 and step["carried_rate_after"] < 0.6 * step["carried_rate_before"], step
    assert "the engine changed, not the requests" in message
    # back after the restore
    assert back["signature"] == "step" and back["onset_ts_ns"] == step["onset_ts_ns"]
    assert back["recovered_ts_ns"] >= restored - 3e9 and back["rate_now"] > 0.7 * back["rate_before"], back
    text = report.render(con, run_id=run.run_id)
    assert "Acceptance in time:" in text and "stepped down" in text and "restored" in text, text
    assert "(not restored)" not in text


def test_a_slow_decay_is_told_from_a_step_with_its_start(runs):
    con, results = runs
    run = results["decay"]
    first = run.drafter_changed_ns[1]  # the first noise after the start's
    found = _signatures(con, run.run_id)
    assert [code for code, _, _ in found] == [codes.ACCEPTANCE_DECAY], found
    ev = found[0][1]
    assert ev["slope_per_hour"] < 0 and ev["end_level"] < 0.7 * ev["start_level"]
    # it began around the first change: after the run's first steps, before the decline's midpoint
    assert first - 3e9 <= ev["onset_ts_ns"] <= (first + run.drafter_changed_ns[-1]) / 2, (ev, first)
    if ev["rate_before"] is None:  # a decline fitted from the run's first block (its start is within a block of it)
        assert ev["onset_ts_ns"] == ev["onset_after_ts_ns"] and "from the run's start" in found[0][2]
    else:
        assert ev["rate_before"] == _rate(con, run.run_id, "ts <= make_timestamp_ns(?)", ev["onset_after_ts_ns"])
    # the run really declined: its last 2 s against its steps before the first change
    last = con.execute("select max(epoch_ns(ts)) from verify_steps where run_id = ?", [run.run_id]).fetchone()[0]
    assert _rate(con, run.run_id, "ts > make_timestamp_ns(?)", int(last - 2e9)) < 0.7 * _rate(
        con, run.run_id, "ts < make_timestamp_ns(?)", first)
    assert "(not restored)" in report.render(con, run_id=run.run_id)


def test_steady_acceptance_stays_quiet(runs):
    con, results = runs
    run = results["steady"]
    assert _signatures(con, run.run_id) == []
    text = report.render(con, run_id=run.run_id)
    assert "Acceptance in time: steady" in text
    # the twin drafted as much as the others, at the start's acceptance
    step = results["step"]
    assert _rate(con, run.run_id, "true") > 0.3
    assert abs(_rate(con, run.run_id, "true") - _signatures(con, step.run_id)[0][1]["rate_before"]) < 0.1


def test_the_target_was_never_touched(runs):
    """Greedy verification: the drafter's changes change what is accepted, never what is generated."""
    _, results = runs
    assert results["step"].tokens == results["steady"].tokens == results["decay"].tokens


def test_the_named_query_lists_each_signature_and_its_restoration(runs):
    """``spectrace query --named acceptance_in_time`` (the alert's SQL twin) over the three runs' store."""
    con, results = runs
    rows = con.execute(named.load("acceptance_in_time")).fetchall()
    by_run = {row[0]: row for row in rows}
    assert set(by_run) == {results["step"].run_id, results["decay"].run_id}, rows
    step, decay = by_run[results["step"].run_id], by_run[results["decay"].run_id]
    assert step[1] == codes.ACCEPTANCE_STEP_CHANGE and step[8] is not None  # restored
    assert decay[1] == codes.ACCEPTANCE_DECAY and decay[8] is None  # not restored
    found = _signatures(con, results["step"].run_id)[0][1]
    assert (step[3], step[4], step[5]) == (found["rate_before"], found["rate_after"], found["carried_requests"])
