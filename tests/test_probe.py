"""`spectrace probe`'s pure logic (unit lane: no torch, no vLLM): candidates from a doctor report, the interval,
the verdict, the prompt file and the CLI's bad input."""

from __future__ import annotations

import json
import math

import pytest

from spectrace.audit import codes
from spectrace.cli import main
from spectrace.probe import candidates as cands
from spectrace.probe import run as probe_run
from spectrace.probe import stats


def _report(findings=(), taps=None, target_theta=10000.0, draft_theta=10000.0):
    return {"findings": list(findings), "taps": taps,
            "models": {"target": {"rope": {"theta": target_theta}}, "draft": {"rope": {"theta": draft_theta}}}}


TAPS = {"declared_field": "eagle_aux_hidden_state_layer_ids", "declared_ids": [0, 1, 2], "expected_ids": [0, 1, 2],
        "tapped_ids": [0, 1, 2], "input_taps": 3}


def test_the_tap_sweep_shifts_the_whole_set_and_skips_what_the_drafter_cannot_take():
    sweep = cands.tap_sweep([0, 1, 2], [0, 1, 2], 4, 3)
    assert [(c.name, c.skipped) for c in sweep] == [
        ("taps [-1, 0, 1]", "ids outside the target's 0..4"),
        ("taps [1, 2, 3]", None),
        ("taps [1, 2]", "2 distinct ids; the drafter's input takes 3"),  # (2, 4//2, 4-3) de-duplicated
        ("taps [2]", "1 distinct ids; the drafter's input takes 3"),
    ]
    deep = cands.tap_sweep([2, 18, 33], None, 36, 3)  # a 36-layer target: every convention a distinct set
    assert cands.vllm_default_taps(36) == [2, 18, 33] and cands.evenly_spaced_taps(36, 3) == [2, 18, 34]
    assert [c.taps for c in deep] == [[1, 17, 32], [3, 19, 34], [2, 18, 34]]  # the default is the served set: not again


def test_candidates_come_from_the_findings_fixes_the_rope_bases_and_the_sweep():
    swa = {"code": codes.SWA_DROPPED, "severity": "error", "evidence": {"declared": {"sliding_window": 32}}}
    draft = {"num_hidden_layers": 1, "sliding_window": 32, "rope_parameters": {"rope_theta": 1e6}, "dflash_config": {}}
    report = _report([swa, {"code": codes.ROPE_MISMATCH, "severity": "error"}], TAPS, draft_theta=1e6)
    found = cands.candidates(report, draft, {"num_hidden_layers": 4})
    assert [c.name for c in found] == ["served", "fix SWA_DROPPED", "rope 10000", "taps [-1, 0, 1]", "taps [1, 2, 3]",
                                       "taps [1, 2]", "taps [2]"]
    fix = cands.apply(draft, found[1], "dflash")
    assert (fix["use_sliding_window"], fix["layer_types"], fix["sliding_window"]) == (True, ["sliding_attention"], 32)
    assert "use_sliding_window" not in draft  # the input is never modified
    assert cands.apply(draft, found[2], "dflash")["rope_parameters"]["rope_theta"] == 10000.0
    assert found[2].source == codes.ROPE_MISMATCH
    assert [c.name for c in cands.candidates(report, draft, {"num_hidden_layers": 4}, ("rope",))] == ["served", "rope 10000"]
    assert cands.not_probed(report, found) == []


def test_taps_are_written_where_vllm_reads_them_verbatim():
    taps = cands.Candidate("taps [1, 2, 3]", "taps", "", patch={"taps": [1, 2, 3]}, taps=[1, 2, 3])
    speculators = {"speculators_config": {}, "aux_hidden_state_layer_ids": [0, 1, 2], "transformer_layer_config": {}}
    assert cands.apply(speculators, taps, "dflash")["aux_hidden_state_layer_ids"] == [1, 2, 3]
    plain = {"dflash_config": {"target_layer_ids": [0, 1, 2]}}
    out = cands.apply(plain, taps, "dflash")
    assert out["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3] and out["dflash_config"]["target_layer_ids"] == [0, 1, 2]


def test_causal_inferred_serves_both_ways():
    found = cands.fixes(_report([{"code": codes.CAUSAL_INFERRED, "severity": "info"}]), {})
    assert [(c.name, c.patch) for c in found] == [("causal true", {"dflash_config.causal": True}),
                                                  ("causal false", {"dflash_config.causal": False})]


def _requests(pairs, k=3):
    return [stats.Request(a, d, d // k, [d // k - min(a, d // k), min(a, d // k), 0, 0]) for a, d in pairs]


def test_the_interval_is_the_ratio_estimators_with_students_t():
    reqs = _requests([(3, 30), (9, 30), (6, 30), (12, 30)])
    s = stats.summarize(reqs, 3)
    assert s.acceptance == pytest.approx(30 / 120)
    # residuals (a - R d) / mean(d): -0.15, 0.05, -0.05, 0.15; se = sqrt(0.05 / 12); t(3) = 3.182
    half = 3.182 * math.sqrt(0.05 / 12)
    assert (s.low, s.high) == (pytest.approx(0.25 - half), pytest.approx(0.25 + half))
    assert stats.summarize(reqs[:1], 3).low == 0.0  # one request: no spread, no interval


def test_the_verdict_pairs_requests_and_says_whether_the_best_beats_the_served_reading():
    served = _requests([(3, 30), (6, 30), (9, 30), (3, 30)])
    better = _requests([(12, 30), (15, 30), (18, 30), (12, 30)])  # +9 on every prompt: a tight paired interval
    noisy = _requests([(3, 30), (15, 30), (9, 30), (3, 30)])  # +9 on one prompt only: +7.5 points pooled
    readings = {"served": "as served", "taps [1, 2, 3]": "trained on taps [1, 2, 3]", "noisy": "trained noisy"}
    sums = {n: stats.summarize(r, 3) for n, r in (("served", served), ("taps [1, 2, 3]", better))}
    v = stats.verdict({"served": served, "taps [1, 2, 3]": better}, sums, readings)
    assert v.best == "taps [1, 2, 3]" and v.beats_served and v.delta == pytest.approx(0.3) and v.half_width == pytest.approx(0)
    assert v.text == "trained on taps [1, 2, 3] (48% against 18% as served, +30.0 points, 95 % interval ±0.0)"
    sums = {n: stats.summarize(r, 3) for n, r in (("served", served), ("noisy", noisy))}
    v = stats.verdict({"served": served, "noisy": noisy}, sums, readings)
    assert v.best == "noisy" and not v.beats_served
    assert v.text.startswith("no candidate beats the served reading beyond the interval (18%; best: trained noisy, +7.5 points")
    sums = {"served": stats.summarize(better, 3), "noisy": stats.summarize(noisy, 3)}
    v = stats.verdict({"served": better, "noisy": noisy}, sums, readings)
    assert v.best == "served" and not v.beats_served and v.text.startswith("no candidate beats the served reading (48%)")


def test_prompt_files_jsonl_text_and_what_is_not_text(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"prompt": "a b"}) + "\n\n" + json.dumps({"prompt": "c"}) + "\n")
    assert probe_run.read_prompts(str(jsonl)) == ["a b", "c"]
    text = tmp_path / "p.txt"
    text.write_text("one\ntwo\n")
    assert probe_run.read_prompts(str(text)) == ["one", "two"]
    assert len(probe_run.read_prompts(None)) == 12
    binary = tmp_path / "p.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    with pytest.raises(probe_run.ProbeInputError, match="not text"):
        probe_run.read_prompts(str(binary))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x"}\n')
    with pytest.raises(probe_run.ProbeInputError, match=r'bad.jsonl:1: no "prompt" string'):
        probe_run.read_prompts(str(bad))


@pytest.mark.parametrize("extra, message", [
    (["--max-tokens", "0"], "--max-tokens must be a positive integer, not 0 (a budget of zero measures nothing)"),
    (["--k", "0"], "--k must be a positive integer, not 0"),
    (["--prompts", "BINARY"], "is not text (it holds NUL bytes)"),
    (["--readings", "taps,vibes"], "unknown readings ['vibes']"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, extra, message):
    for role in ("target", "draft"):
        (tmp_path / role).mkdir()
        (tmp_path / role / "config.json").write_text("{}")
    (tmp_path / "BINARY").write_bytes(b"\x00\x01\x02")
    extra = [str(tmp_path / "BINARY") if x == "BINARY" else x for x in extra]
    rc = main(["probe", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"), "--method", "eagle3",
               "--no-store", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1, err


def test_a_missing_model_directory_is_bad_input(tmp_path, capsys):
    rc = main(["probe", "--target", str(tmp_path / "nowhere"), "--draft", str(tmp_path), "--method", "eagle3", "--no-store"])
    assert rc == 2 and "no config.json there" in capsys.readouterr().err


FAKE_CHILD = r'''
import json, os, sys
MARK = "@@spectrace-probe "
for line in sys.stdin:
    job = json.loads(line)
    print(MARK + json.dumps({"started": job["name"]}), flush=True)
    if job["name"] == "crash":
        print("Fatal Python error: Segmentation fault", flush=True)
        os._exit(139)
    print("INFO a log line", flush=True)
    print(MARK + json.dumps({"result": {"name": job["name"], "ok": True, "requests": [], "pid": os.getpid()}}), flush=True)
'''


def test_a_child_that_dies_takes_only_the_candidate_it_was_serving(tmp_path):
    """The restart logic with a stand-in child (the real one needs vLLM): the process dies on its second job; that
    job fails in one line, a new process serves the third."""
    script = tmp_path / "child.py"
    script.write_text(FAKE_CHILD)
    lines = []
    results = probe_run.serve([{"name": "a"}, {"name": "crash"}, {"name": "b"}], env=dict(__import__("os").environ),
                              log=tmp_path / "log", say=lines.append, command=[__import__("sys").executable, str(script)])
    assert results["a"]["ok"] and results["b"]["ok"] and results["a"]["pid"] != results["b"]["pid"]
    crash = results["crash"]
    assert not crash["ok"] and crash["crashed"]
    assert crash["error"] == "the engine process died (exit 139) serving it: Fatal Python error: Segmentation fault"
    assert lines == ["[1/3] serving a ...", "[2/3] serving crash ...", "[3/3] serving b ..."]
    assert "INFO a log line" in (tmp_path / "log").read_text()


def _outcome(name, kind, rates, source=None, taps=None):
    requests = _requests([(a, 30) for a in rates])
    c = cands.Candidate(name, kind, f"reading {name}", patch={"rope_theta": 10000.0} if kind == "rope" else {},
                        source=source, taps=taps)
    return probe_run.Outcome(c, "/x", status="ok", requests=requests, summary=stats.summarize(requests, 3))


def test_a_better_reading_is_a_finding_and_raises_the_info_doubt_it_settles():
    rope_differs = {"code": codes.ROPE_DIFFERS, "severity": "info", "model_role": "draft", "message": "bases differ",
                    "evidence": {"settled_by": "acceptance"}, "fix": "f"}
    report = _report([rope_differs], None, draft_theta=1e6)
    probe = probe_run.Probe("/t", "/d", "eagle3", ["a", "b", "c", "d"])
    outcomes = [_outcome("served", "served", [3, 6, 9, 3]), _outcome("rope 10000", "rope", [12, 15, 18, 12], codes.ROPE_DIFFERS)]
    result = probe_run._conclude(probe, report, outcomes, [])
    assert [(f.code, f.severity) for f in result.findings] == [(codes.PROBE_BETTER_READING, "warning"),
                                                               (codes.ROPE_DIFFERS, "warning")]
    better, raised = result.findings
    assert better.evidence["delta"] == pytest.approx(0.3) and better.evidence["source"] == codes.ROPE_DIFFERS
    assert better.fix == "set in the drafter's config.json: rope_theta = 10000.0"
    assert raised.evidence["raised_by"] == codes.PROBE_BETTER_READING and raised.evidence["settled_by"] == "acceptance"
    run_id, rows = probe_run.rows(result)
    assert run_id == result.probe_id  # untraced: the probe's own id
    assert [(r["candidate"], r["best"], r["delta"]) for r in rows] == [("served", False, None),
                                                                      ("rope 10000", True, pytest.approx(0.3))]
    # the same readings, the other way round: nothing better, no finding
    outcomes = [_outcome("served", "served", [12, 15, 18, 12]), _outcome("rope 10000", "rope", [3, 6, 9, 3], codes.ROPE_DIFFERS)]
    assert probe_run._conclude(probe, report, outcomes, []).findings == []
