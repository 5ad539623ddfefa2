"""Reading the acceptance curve on real vLLM runs (CPU build): planted faults, each a real
acceptance fall, named by the finding made for it; and whether speculation pays.

Every planted drafter is the 8-layer zoo target itself (100 % greedy acceptance) but for
one fault, so a fall is the fault's doing, not random-weight noise:

- ``short64``: ``max_position_embeddings: 64``. vLLM 0.32 caps a ``draft_model`` drafter's
  max_model_len at it (``SpeculativeConfig._maybe_override_draft_max_model_len``), and once a
  batch's longest context + k passes that, skips the drafter for the whole batch and sends
  token-0 drafts (``GPUModelRunner._input_fits_in_drafter``, the length gate of vLLM #58080):
  acceptance falls from 100 % to 0 at 64 (batch-wide, so some steps just below 64 fall too).
- ``zero_norm``: the final norm zeroed, so every logit is 0 and every draft is token 0.
- ``parallel``: ``parallel_drafting`` (PARD) on a drafter not trained for it: position 0
  comes from the real last token, positions 1.. from the placeholder token's slots.

Whether speculation pays is measured against runs without speculation: ``cheap`` (a one-layer
drafter that, like its zero-norm target, always says token 0: every draft accepted at an eighth
of the target's cost) pays; the target drafting for itself costs as much per draft as it
saves (near 1 on CPU); a disagreeing drafter and the zero-norm drafter cost only.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import spectrace.store
from spectrace.audit.rules import acceptance
from spectrace.testing.engine import EngineSpec, run_engines
from spectrace.testing.models import build_target, derive_model

pytestmark = pytest.mark.vllm

K = 3
WINDOW = 32
PROMPTS = ["the quick brown fox", "hello world speculative decoding", "a b c d e f g", "once upon a time there was"]


@pytest.fixture(scope="session")
def curve_runs(zoo, scratch, cache_root):
    root = scratch / "curve-models"
    target = zoo["target"]
    drafters = {
        "short64": derive_model(root / "short64", target, config={"max_position_embeddings": 64}),
        "zero_norm": derive_model(root / "zero-norm", target, zero=["model.norm.weight"]),
        "parallel": derive_model(root / "parallel", target, config={"pard_token": 511}),
        "cheap": build_target(root / "cheap", tokenizer_dir=zoo["tokenizer"], num_layers=1, seed=5, zero_final_norm=True),
    }
    # a target whose layers slide (window 32), and two draft_model drafters for it
    sliding = derive_model(
        root / "target-sliding", target,
        config={"use_sliding_window": True, "sliding_window": WINDOW, "layer_types": ["sliding_attention"] * 8},
    )  # fmt: skip
    window_only = derive_model(
        root / "drafter-window-only", zoo["draft_seeded"], config={"sliding_window": WINDOW},
        drop=["layer_types", "use_sliding_window", "max_window_layers"],
    )  # fmt: skip

    def spec(name, draft=None, model=target, max_tokens=120, repeat=1, **extra):
        speculative = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": K, **extra} if draft else None
        return EngineSpec(name=name, target=str(model), speculative=speculative, prompts=PROMPTS, max_tokens=max_tokens,
                          repeat=repeat)  # fmt: skip

    # the speed-up runs generate three times: >= 50 verification steps even for the self-drafter
    # (the SPECULATION_NOT_PAYING window's minimum), and the fastest call of each is measured
    # (EngineResult.generate_seconds), which keeps other processes' bursts on this shared machine out
    specs = [
        spec("baseline", repeat=3),  # no speculation: the reference for the speed-up
        spec("self", target, repeat=3),
        spec("seeded", zoo["draft_seeded"], repeat=3),
        spec("short64", drafters["short64"]),
        spec("zero_norm", drafters["zero_norm"], repeat=3),
        spec("parallel", drafters["parallel"], parallel_drafting=True),
        spec("window_reapplied", window_only, model=sliding, max_tokens=16),
        spec("full_forced", zoo["draft_seeded"], model=sliding, max_tokens=16),
        spec("baseline_again", repeat=3),  # the baseline once more: how much the machine's noise moves it
        spec("baseline_zero", model=zoo["target_zero"], repeat=3),
        spec("cheap", drafters["cheap"], model=zoo["target_zero"], repeat=3),
    ]
    store = scratch / "curve-store"
    results = run_engines(specs, store=store, cache_root=cache_root, log_file=scratch / "curve.log")
    for name, result in results.items():
        assert result.ok, (name, result.error)
    return spectrace.store.open(store), results


def _findings(con, run_id):
    return {
        code: (severity, caused_by, message, json.loads(evidence))
        for code, severity, caused_by, message, evidence in con.execute(
            "select code, severity, caused_by, message, evidence from findings where run_id = ?", [run_id]
        ).fetchall()
    }


CURVE_CODES = {"CONTEXT_CLIFF", "POSITION_CLIFF", "DUMMY_DRAFTS"}


def test_planted_drafters_reproduce_the_target(curve_runs):
    _, results = curve_runs
    for name in ("self", "seeded", "short64", "zero_norm", "parallel"):
        assert results[name].tokens == results["baseline"].tokens, name
    assert results["cheap"].tokens == results["baseline_zero"].tokens


def test_context_cliff_at_the_drafters_max_position_embeddings(curve_runs):
    con, results = curve_runs
    run_id = results["short64"].run_id
    found = _findings(con, run_id)
    severity, caused_by, message, evidence = found["CONTEXT_CLIFF"]
    assert caused_by == "DRAFT_CONTEXT_SHORT" and found["DRAFT_CONTEXT_SHORT"][0] == "warning"
    assert severity == "warning"
    assert evidence["boundary"] == {"tokens": 64, "model_role": "draft", "field": "max_position_embeddings"}
    assert evidence["after"]["rate"] == 0.0 and evidence["after"]["drafted"] >= 100
    assert evidence["before"]["rate"] > 0.6  # the steps of 0-64 whose drafts reach past 64 pull it below 1
    # the run's boundary splits the fixed 0-512 bucket
    assert con.execute("select tokens, field from context_boundaries where run_id = ?", [run_id]).fetchall() == [
        (64, "max_position_embeddings")
    ]
    ranges = dict(
        con.execute(
            "select context_range, sum(accepted) / sum(drafted) from acceptance_by_context_range "
            "where run_id = ? group by context_range",
            [run_id],
        ).fetchall()
    )
    assert set(ranges) == {"0-64", "64-512"} and ranges["64-512"] == 0.0
    buckets = con.execute(
        "select distinct context_bucket from verify_counts where run_id = ? and source = 'engine_core'", [run_id]
    ).fetchall()
    assert buckets == [("0-512",)]  # the metric contract's label is unchanged
    # past it vLLM's length gate sends token 0: dummy drafts, explained by the same short context
    severity, caused_by, message, evidence = found["DUMMY_DRAFTS"]
    assert (severity, caused_by) == ("warning", "DRAFT_CONTEXT_SHORT")
    assert evidence["by_token"].keys() == {"0"} and evidence["length_gate"]["tokens"] == 64
    assert "max_model_len (64" in message


def test_dummy_drafts_of_one_repeated_token(curve_runs):
    con, results = curve_runs
    found = _findings(con, results["zero_norm"].run_id)
    severity, _, message, evidence = found["DUMMY_DRAFTS"]
    assert severity == "error" and evidence["share"] == 1.0 and evidence["by_token"].keys() == {"0"}
    assert "CONTEXT_CLIFF" not in found and "POSITION_CLIFF" not in found
    rows, repeated = con.execute(
        "select sum(rows), sum(repeated_rows) from draft_shapes where run_id = ?", [results["zero_norm"].run_id]
    ).fetchone()
    assert rows == repeated >= evidence["rows"] >= 50  # the finding fired once, at the first 50 rows or more
    tokens = con.execute("select count(*) from verify_steps where draft_token_ids is not null").fetchone()[0]
    assert tokens == 0  # counted from what vLLM holds, never stored without SPECTRACE_RECORD_TOKENS=1


def test_position_cliff_after_position_0(curve_runs):
    con, results = curve_runs
    result = results["parallel"]
    found = _findings(con, result.run_id)
    severity, _, message, evidence = found["POSITION_CLIFF"]
    assert severity == "error" and evidence["position"] == 0 and evidence["parallel_drafting"] is True
    accepted = result.metrics["vllm:spec_decode_num_accepted_tokens_per_pos"]
    recorded = [a for _, a in con.execute(
        "select position, accepted from acceptance_by_position where run_id = ? order by position", [result.run_id]
    ).fetchall()]  # fmt: skip
    assert recorded == accepted  # vLLM's own count; the finding's evidence is the count when it fired
    assert [a <= b for a, b in zip(evidence["accepted_by_position"], accepted)] == [True] * K
    assert accepted[0] == result.metrics["vllm:spec_decode_num_drafts"] and accepted[1] <= 0.05 * accepted[0]
    assert set(found) & CURVE_CODES == {"POSITION_CLIFF"}


def test_self_drafter_has_no_curve_finding_and_seeded_collapses(curve_runs):
    con, results = curve_runs
    # (whether it pays on CPU is close to 1 either way: test_speedup_estimate_...)
    assert set(_findings(con, results["self"].run_id)) <= {"SPECULATION_NOT_PAYING"}
    seeded = _findings(con, results["seeded"].run_id)
    assert not set(seeded) & CURVE_CODES
    severity, _, message, evidence = seeded["ACCEPTANCE_COLLAPSE"]
    assert severity == "error" and "it began at step" in message
    assert evidence["onset_step"] >= 1 and evidence["onset_context_len"] > 0 and evidence["onset_ts_ns"] > 0


def _speedup(con, run_id):
    return con.execute(
        "select speedup_estimate, mean_acceptance_length, draft_ms, verify_ms, steps from speculation_cost where run_id = ?",
        [run_id],
    ).fetchone()


# The estimate prices the same worker steps without drafts (verification fitted against the
# tokens each step scheduled; with a constant batch there is nothing to fit and the
# verification time itself is used). It leaves out host work outside the worker's step that
# speculation adds (the engine core's handling of drafts, its statistics, spectrace's own
# drain in the same process), so on this CPU it runs high: 7-54 % in our runs (once 29 %
# low, for the self-drafter whose fit is the noisiest). The measured ratio is the child's CPU
# time for the same prompts without and with speculation (the cheapest of three generate
# calls each; wall time is printed too). The test asserts the estimate's side of 1 where the
# answer is far from 1 and records the measured ratios; it asserts no timing (on a shared
# 2-core machine a "cheap" drafter once measured 0.98x under load).


def test_speedup_estimate_against_a_run_without_speculation(curve_runs, record_property):
    con, results = curve_runs
    baseline = min(results["baseline"].generate_cpu_seconds, results["baseline_again"].generate_cpu_seconds)
    baseline_wall = min(results["baseline"].generate_seconds, results["baseline_again"].generate_seconds)
    report = {}
    for name in ("cheap", "self", "seeded", "zero_norm"):
        estimate, length, draft_ms, verify_ms, steps = _speedup(con, results[name].run_id)
        reference = results["baseline_zero"] if name == "cheap" else None
        measured = (reference.generate_cpu_seconds if reference else baseline) / results[name].generate_cpu_seconds
        wall = (reference.generate_seconds if reference else baseline_wall) / results[name].generate_seconds
        report[name] = {"estimate": round(estimate, 3), "measured_cpu": round(measured, 3), "measured_wall": round(wall, 3),
                        "L": round(length, 3), "draft_ms": round(draft_ms, 2), "verify_ms": round(verify_ms, 2)}  # fmt: skip
    # The measured ratios are timings on a shared machine: recorded (pytest --junitxml, -s), never asserted
    # (no timed tests). The docs ("Does speculation pay?") state the estimate-vs-measured margins from quiet runs.
    record_property("speedup_estimate_vs_measured", report)
    print("speed-up:", report)
    assert _speedup(con, results["self"].run_id)[1] == pytest.approx(K + 1)
    assert _speedup(con, results["self"].run_id)[4] >= 50  # enough steps for the not-paying window to judge
    # the estimate's side of 1 where the real answer is far from 1 (measured ~2.3x, ~0.5x, ~0.3x)
    assert report["cheap"]["estimate"] > 1
    assert "SPECULATION_NOT_PAYING" not in _findings(con, results["cheap"].run_id)
    assert _speedup(con, results["cheap"].run_id)[4] >= 50  # judged, and found paying
    for name in ("seeded", "zero_norm"):
        assert report[name]["estimate"] < 1
        assert "SPECULATION_NOT_PAYING" in _findings(con, results[name].run_id)


def test_draft_model_drafter_running_its_declared_window_is_no_error(curve_runs):
    con, results = curve_runs
    run_id = results["window_reapplied"].run_id
    found = _findings(con, run_id)
    assert [code for code, f in found.items() if f[0] == "error"] == []
    severity, _, message, evidence = found["SWA_DROPPED"]
    assert severity == "warning" and "the window comes from the target" in message
    assert found["LAYOUT_MISMATCH"][:2] == ("info", "SWA_DROPPED")
    layout = con.execute(
        "select runtime_type, runtime_window from attention_layout where run_id = ? and model_role = 'draft'", [run_id]
    ).fetchall()
    assert layout == [("sliding", WINDOW)] * 2


def test_full_drafter_forced_to_the_targets_window_is_layout_mismatch(curve_runs):
    con, results = curve_runs
    found = _findings(con, results["full_forced"].run_id)
    assert found["LAYOUT_MISMATCH"][:2] == ("error", None)
    assert "SWA_DROPPED" not in found


def test_report_and_plot_show_the_cliff_at_its_boundary(curve_runs, tmp_path):
    from PIL import Image

    from spectrace.queries import report

    con, results = curve_runs
    png = tmp_path / "short64.png"
    text = report.render(con, run_id=results["short64"].run_id, plot=str(png))
    lines = text.splitlines()
    start = lines.index("By context length (ranges split at the run's boundaries, marked |)")
    table = "\n".join(lines[start : start + 5])
    assert "0-64" in table and "64-512" in table and "draft max_position_embeddings" in table
    row = next(line for line in lines[start:] if "64-512" in line)
    assert row.strip().startswith("|") and "0.0%" in row
    assert "pos 0" in table and "pos 2" in table  # the position x context view
    assert "Does speculation pay?" in text and "one-token draft rows" in text
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size == (1100, 420)
    seeded = report.render(con, run_id=results["seeded"].run_id)
    timeline = seeded[seeded.index("Collapse timeline:"):]
    assert "collapsed (began at step" in timeline and "(not recovered)" in timeline


def test_cliff_rules_unit():
    by_range = {(0, 64): (200, 200), (64, 512): (300, 0)}
    cliff = acceptance.context_cliff(by_range, 64)
    assert (cliff.before_rate, cliff.after_rate) == (1.0, 0.0)
    assert acceptance.context_cliff(by_range, 512) is None  # nothing past it
    assert acceptance.context_cliff({(0, 64): (200, 1), (64, 512): (300, 0)}, 64) is None  # never healthy
    assert acceptance.position_cliff(np.array([200, 200, 200]), np.array([200, 2, 0])) == 0
    assert acceptance.position_cliff(np.array([200, 200, 200]), np.array([150, 100, 60])) is None
