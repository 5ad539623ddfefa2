"""doctor on published drafters (issue #55): quiet (no error, no warning) on every correct pair of the corpus
(``tests/published_corpus.py``), under both model runners; each finding it still says is info, says what would settle
it, and names the vLLM function or trainer behind it.

The pairs' configs are transcribed from their sources (SpecForge, the EAGLE reference, speculators' zoo drafters);
doctor runs the installed vLLM's own resolution and builds on the meta device (no engine, no weight read).
"""

from __future__ import annotations

import pytest

import published_corpus as corpus
from spectrace import doctor

pytestmark = pytest.mark.vllm  # doctor runs vLLM's config and model code in this process (no engine)

# the info each pair is left with, and why it stays (the vLLM function or the trainer behind it)
EXPECTED_INFO = {
    # SpecForge's and the EAGLE-3 reference's Llama-3.1 drafter: RoPE base 10000 (the reference's own,
    # cnets.py), max_position_embeddings 2048 raised by SpeculativeConfig._maybe_override_draft_max_position_embeddings,
    # torch_dtype float16 with no checkpoint to read, no taps: vLLM's default is the trainers' (2, N//2, N-3)
    "specforge-llama3.1-8b-eagle3": {"DRAFT_CONTEXT_SHORT", "ROPE_DIFFERS", "DRAFT_DTYPE_LOSSY", "TAP_DEFAULTED"},
    "eagle3-reference-llama3.1-8b": {"DRAFT_CONTEXT_SHORT", "ROPE_DIFFERS", "DRAFT_DTYPE_LOSSY", "TAP_DEFAULTED"},
    "specforge-llama3.3-70b-eagle3": {"DRAFT_CONTEXT_SHORT", "ROPE_DIFFERS", "DRAFT_DTYPE_LOSSY", "TAP_DEFAULTED"},
    "specforge-qwen3-8b-eagle3": {"TAP_DEFAULTED"},
    "specforge-qwen3-4b-eagle3": {"TAP_DEFAULTED"},
    "specforge-qwen3-32b-eagle3": {"TAP_DEFAULTED"},
    "specforge-qwen2.5-7b-eagle3": {"TAP_DEFAULTED"},
    # z-lab's layout declares no causality: qwen3_dflash._dflash_layer_causal's fallback (full layers bidirectional)
    "specforge-qwen3-8b-dflash": {"CAUSAL_INFERRED"},
    "specforge-qwen3-4b-dflash": {"CAUSAL_INFERRED"},
    "specforge-qwen2.5-0.5b-dflash": {"CAUSAL_INFERRED"},
    "eagle1-reference-llama2-7b": set(),
    # speculators' DFlash: block_size, which update_dflash does not carry and vLLM's DFlash never reads
    "speculators-zoo-dflash": {"DRAFT_FIELD_DROPPED"},
    "speculators-zoo-eagle3": set(),
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[tuple[str, str], doctor.Report]:
    root = tmp_path_factory.mktemp("corpus")
    found = {}
    for runner in ("v2", "v1"):
        for name in corpus.NAMES:
            method, target, draft = corpus.write_pair(root, name)
            found[runner, name] = doctor.diagnose(target, draft, method=method, runner=runner)
    return found


def test_the_corpus_holds_at_least_twelve_published_pairs():
    assert len(corpus.NAMES) >= 12 and set(EXPECTED_INFO) == set(corpus.NAMES)
    methods = {corpus.PAIRS[n][0] if n in corpus.PAIRS else corpus.ZOO_PAIRS[n][0] for n in corpus.NAMES}
    assert methods == {"eagle", "eagle3", "dflash"}


@pytest.mark.parametrize("runner", ["v2", "v1"])
@pytest.mark.parametrize("name", corpus.NAMES)
def test_doctor_is_quiet_on_a_published_pair(reports, runner, name):
    report = reports[runner, name]
    loud = [(f.code, f.severity, f.message) for f in report.findings if f.severity != "info"]
    assert loud == [] and not report.has_error
    assert {f.code for f in report.findings} == EXPECTED_INFO[name]


def test_what_stays_says_what_would_settle_it_and_breaks_nothing(reports):
    for (runner, name), report in reports.items():
        for f in report.findings:
            if f.code == "DRAFT_FIELD_DROPPED":  # block_size: nothing to move, nothing to fix
                assert (f.evidence["field"], f.fix) == ("block_size", "") and "only DSpark" in f.message
                continue
            assert f.evidence.get("settled_by"), (name, f.code)
            # no fix that would rewrite a working drafter: RoPE and context fixes only if acceptance says so
            assert f.fix == "" or f.fix.startswith("only if") or f.code in ("TAP_DEFAULTED", "CAUSAL_INFERRED", "DRAFT_DTYPE_LOSSY"), (name, f.code, f.fix)


def test_eagle3_rope_differs_cites_the_reference_trainer(reports):
    rope = next(f for f in reports["v2", "specforge-llama3.1-8b-eagle3"].findings if f.code == "ROPE_DIFFERS")
    assert rope.evidence["differs"][0] == "theta" and rope.evidence["method"] == "eagle3"
    assert "SafeAILab/EAGLE" in rope.message and "acceptance" in rope.message


def test_speculators_dflash_fields_are_followed_where_update_dflash_moves_them(reports):
    report = reports["v2", "speculators-zoo-dflash"]
    assert not [f for f in report.findings if f.code == "CAUSAL_INFERRED"]  # update_dflash set dflash_config.causal
    assert [f.evidence["field"] for f in report.findings if f.code == "DRAFT_FIELD_DROPPED"] == ["block_size"]
    assert [row["causal"] for row in report.layout["draft"]] == [True]  # sliding_window_non_causal false: causal
