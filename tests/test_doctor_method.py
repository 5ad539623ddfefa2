"""`spectrace doctor`: the method chain (the algorithm a drafter declares → what vLLM builds → the method it runs) and
the rejection sampler (a synthetic one makes every acceptance number fake), from config.json files alone (#58).

The drafter is the trained zoo's EAGLE-3 (speculators 0.9.0's format, ``spectrace/testing/zoo``); doctor runs the
installed vLLM's own resolution and builds on the meta device.
"""

from __future__ import annotations

import json
import shutil

import pytest

from spectrace import cli
from published_corpus import ZOO

pytestmark = pytest.mark.vllm  # doctor runs vLLM's config and model code in this process (no engine)

RUNNERS = ("v1", "v2")
EAGLE3_CLASS = "vllm.model_executor.models.llama_eagle3.Eagle3LlamaForCausalLM"


def run_json(capsys, *args: str) -> tuple[int, dict]:
    rc = cli.main(["doctor", *args, "--json"])
    out, err = capsys.readouterr()
    assert err == "", err
    return rc, json.loads(out)


def triples(report: dict) -> list[tuple]:
    return sorted((f["code"], f["severity"], f["caused_by"]) for f in report["findings"])


def finding(report: dict, code: str) -> dict:
    return next(f for f in report["findings"] if f["code"] == code)


@pytest.mark.parametrize("runner", RUNNERS)
def test_an_eagle3_drafter_served_as_eagle_is_a_downgrade(capsys, runner):
    """vLLM 0.32 builds the speculators EAGLE-3 drafter (update_eagle3: Eagle3LlamaForCausalLM) and runs method eagle,
    which feeds it no hidden-state taps: its fc never runs (sglang#21272's shape). Nothing fails."""
    rc, report = run_json(capsys, "--target", str(ZOO / "target"), "--draft", str(ZOO / "eagle3"), "--method", "eagle",
                          "--runner", runner)
    assert rc == 1 and report["method"] == "eagle" and report["taps"] is None  # method eagle taps nothing
    assert triples(report) == [("METHOD_DOWNGRADED", "error", None), ("METHOD_MISMATCH", "info", "METHOD_DOWNGRADED")]
    downgraded = finding(report, "METHOD_DOWNGRADED")
    assert {k: downgraded["evidence"][k] for k in ("declared_algorithm", "declared_in", "built_architecture",
                                                   "model_class", "method")} == {
        "declared_algorithm": "eagle3", "declared_in": "speculators_model_type",
        "built_architecture": "Eagle3LlamaForCausalLM", "model_class": EAGLE3_CLASS, "method": "eagle"}
    assert "fc" in downgraded["message"] and "sglang#21272" in downgraded["message"]
    assert downgraded["fix"] == 'pass "method": "eagle3" in --speculative-config'
    assert finding(report, "METHOD_MISMATCH")["fix"] == ""


def test_a_path_that_reads_eagle_dash_downgrades_silently(capsys, tmp_path):
    """No method given: vLLM infers 'eagle' from "eagle-" in the path, whatever the checkpoint declares."""
    draft = tmp_path / "zoo-eagle-3-drafter"
    shutil.copytree(ZOO / "eagle3", draft)
    rc, report = run_json(capsys, "--target", str(ZOO / "target"), "--draft", str(draft), "--runner", "v1")
    assert rc == 1 and report["method"] == "eagle" and not report["method_given"]
    assert triples(report) == [("METHOD_DOWNGRADED", "error", None), ("METHOD_INFERRED", "info", "METHOD_MISMATCH"),
                               ("METHOD_MISMATCH", "info", "METHOD_DOWNGRADED")]


@pytest.mark.parametrize("runner", RUNNERS)
def test_the_method_its_algorithm_names_is_quiet(capsys, runner):
    rc, report = run_json(capsys, "--target", str(ZOO / "target"), "--draft", str(ZOO / "eagle3"), "--method", "eagle3",
                          "--runner", runner)
    assert (rc, report["findings"]) == (0, [])


@pytest.mark.parametrize("runner", RUNNERS)
def test_synthetic_acceptance_is_named_before_the_first_request(capsys, runner):
    """vLLM 0.32's SpeculativeConfig resolves the synthetic sampler on this build (the CPU worker refuses to run it);
    every acceptance number of such a run is drawn: a warning, and the acceptance alerts hold off for it."""
    rc, report = run_json(capsys, "--target", str(ZOO / "target"), "--draft", str(ZOO / "eagle3"), "--method", "eagle3",
                          "--runner", runner, "--speculative-config",
                          '{"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.5}')
    assert rc == 0 and triples(report) == [("SYNTHETIC_ACCEPTANCE", "warning", None)]
    synthetic = finding(report, "SYNTHETIC_ACCEPTANCE")
    # vLLM resolved the length 2.5 into per-position rates: 1 + 1.0 + 0.5 + 0.0 = 2.5 tokens a step
    assert synthetic["evidence"]["synthetic_acceptance_rates"] == [1.0, 0.5, 0.0]
    assert synthetic["evidence"]["vllm_rule"].endswith("_resolve_synthetic_acceptance_rates")
    assert "not the drafter's" in synthetic["message"]


def test_a_synthetic_length_vllm_refuses_is_its_refusal(capsys):
    rc, report = run_json(capsys, "--target", str(ZOO / "target"), "--draft", str(ZOO / "eagle3"), "--method", "eagle3",
                          "--speculative-config", '{"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 9}')
    assert rc == 1 and [f["code"] for f in report["findings"]] == ["LOAD_FAILED"]
    assert "synthetic_acceptance_length must be in [1, 4]" in finding(report, "LOAD_FAILED")["message"]


@pytest.mark.parametrize("value,line", [
    ("{not json", "--speculative-config is not JSON"),
    ("[1, 2]", "--speculative-config must be a JSON object, got list"),
    ('{"method": "eagle"}', "--speculative-config: give 'method' with --method"),
])
def test_bad_speculative_config_is_one_line(capsys, value, line):
    rc = cli.main(["doctor", "--target", str(ZOO / "target"), "--draft", str(ZOO / "eagle3"),
                   "--speculative-config", value])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and line in err and len(err.strip().splitlines()) == 1
