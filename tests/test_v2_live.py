"""The live core of the suite on vLLM's Model Runner V2 (CUDA's default, vLLM 0.34's only runner).

The CPU build runs V2 through Triton's interpreter: a test harness, not a deployment
(``spectrace/testing/triton_interpreter``, put on the children's ``PYTHONPATH`` by
``run_engines(..., runner="v2")``; docs/versions.md). Every method V2 serves on this CPU runs once,
traced and untraced; the V1 runs of the same pairs are the suite's ``traced_methods``. Kernels are
interpreted (about 3x slower than V1), so each engine is small and started once for the module.

What V2 cannot run here, and why (said, never skipped): ngram's V2 proposer (``_ngram_scan_kernel``)
stops in Triton's interpreter ("mask has unsupported dtype"), untraced too, so its test asserts that
tracing changes nothing about that failure; the CPU platform turns async scheduling off on either
runner (``CpuPlatform``), so async scheduling on V2 is ``make gpu-check``'s; temperature > 0 stops in
V2's probabilistic rejection kernel under the interpreter, so the lane decodes greedily.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

import spectrace.store
from spectrace.testing.engine import K, EngineSpec, method_specs, run_engines
from spectrace.recorder import stages

pytestmark = pytest.mark.vllm

WINDOW = 32  # the seed-shaped drafters' sliding window (their prompts run past it)
SEED_LAYERS = ["sliding_attention"] * 4 + ["full_attention"]  # the seed's drafter: 4 sliding-window layers, 1 full
V2_METHODS = ("self", "seeded", "eagle3", "dflash", "mtp")  # what V2 decodes on this CPU (ngram: module docstring)
V2_HOOKS = ("worker.execute_model_v2", "worker.verify_v2.sample", "worker.verify_v2")  # the V2 runner's own hooks
FAULT_GROUPS = (("worker.execute_model_v2", "worker.verify_v2"), ("worker.verify_v2.sample",))  # an engine each
LONG_PROMPT = "once upon a time there was a b c d e f g the quick brown fox hello world speculative decoding"


def _v2_specs(zoo):
    return [spec for spec in method_specs(zoo) if spec.name in V2_METHODS]


def _seed_specs(zoo, root):
    """The seed's 5-layer DFlash drafter (4 sliding + 1 full, what only V2 builds), declared right, as the seed's
    team declared it (a window, no use_sliding_window, no layer_types) and with layer_types but no flag."""
    from spectrace.testing.models import build_dflash

    declared = {
        "seed_right": dict(layer_types=SEED_LAYERS, sliding_window=WINDOW, use_sliding_window=True,
                           extra_config={"dflash_config": {"causal": True}}),
        "seed_as_shipped": dict(sliding_window=WINDOW),
        "seed_no_flag": dict(layer_types=SEED_LAYERS, sliding_window=WINDOW),
    }
    specs = []
    for name, fields in declared.items():
        path = build_dflash(root / f"dflash-{name}", target_dir=zoo["target"], num_layers=5, **fields)
        specs.append(EngineSpec(name=name, target=zoo["target"], max_tokens=8, prompts=[LONG_PROMPT],
                                speculative={"method": "dflash", "model": str(path), "num_speculative_tokens": K}))
    return specs


@pytest.fixture(scope="module")
def v2_runs(zoo, scratch, cache_root):
    """Every V2 method and the seed's drafters, traced, in one child; the methods again untraced."""
    store = scratch / "v2-store"
    # sample_tokens' hook hands get_output's its rows: made to raise together, the second would have nothing to read
    self_spec = next(s for s in _v2_specs(zoo) if s.name == "self")
    faulted = [dataclasses.replace(self_spec, name=f"self_faulted{i}", inject_fault=",".join(hooks))
               for i, hooks in enumerate(FAULT_GROUPS)]
    specs = _v2_specs(zoo) + faulted + _seed_specs(zoo, scratch / "v2-models")
    # ngram last in each child: it stops in the interpreter (its own test below), and after it has loaded numba no
    # engine starts in the same child (run_engines)
    traced = run_engines(specs + [_ngram_spec(zoo)], store=store, cache_root=cache_root, log_file=scratch / "v2.log",
                         runner="v2")
    untraced = run_engines(_v2_specs(zoo) + [_ngram_spec(zoo)], store=None, traced=False, cache_root=cache_root,
                           scratch=scratch, runner="v2")
    return spectrace.store.open(store), traced, untraced


def _ngram_spec(zoo):
    spec = next(s for s in method_specs(zoo) if s.name == "ngram")
    spec.max_tokens, spec.prompts = 8, spec.prompts[:1]
    return spec


def _by_position(con, run_id, source="engine_core"):
    rows = con.execute("select position, sum(drafted), sum(accepted) from verify_counts where run_id = ? and source = ? "
                       "group by position order by position", [run_id, source]).fetchall()
    return [r[1] for r in rows], [r[2] for r in rows]


def _findings(con, run_id):
    return {r[0]: r[1:] for r in con.execute(
        "select code, severity, caused_by, message from findings where run_id = ?", [run_id]).fetchall()}


def test_every_engine_ran_on_model_runner_v2_with_every_hook_installed(v2_runs):
    con, traced, _ = v2_runs
    assert "Using V2 Model Runner" in traced["self"].log
    runners = dict(con.execute("select run_id, model_runner from runs").fetchall())
    assert {runners[traced[name].run_id] for name in V2_METHODS} == {"v2"}
    rows = con.execute("select distinct hook, status, detail from hooks").fetchall()
    later = {h.name for h in stages.all_hooks() if h.later}  # an API server's: elsewhere in an offline engine
    assert [r for r in rows if r[1] != ("elsewhere" if r[0] in later else "installed")] == []
    assert {"worker.execute_model_v2", "worker.verify_v2.sample", "worker.verify_v2"} <= {r[0] for r in rows}


@pytest.mark.parametrize("name", V2_METHODS)
def test_counts_equal_vllms_and_the_worker_counts_what_the_engine_core_did(v2_runs, name):
    con, traced, _ = v2_runs
    result = traced[name]
    assert result.ok, result.error
    drafted, accepted = _by_position(con, result.run_id)
    assert drafted and drafted[0] > 0, "no verification step recorded"
    vllm_accepted = result.metrics["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert accepted + [0] * (len(vllm_accepted) - len(accepted)) == vllm_accepted
    assert sum(drafted) == result.metrics["vllm:spec_decode_num_draft_tokens"]
    assert drafted[0] == result.metrics["vllm:spec_decode_num_drafts"]
    # the V2 worker hooks (sample_tokens' host draft counts, AsyncOutput.get_output's rows) count the same
    assert _by_position(con, result.run_id, "worker") == (drafted, accepted)
    assert "VERIFY_DISAGREEMENT" not in _findings(con, result.run_id)


@pytest.mark.parametrize("name", V2_METHODS)
def test_v2_and_v1_agree_token_for_token_and_count_for_count(v2_runs, traced_methods, name):
    con, traced, _ = v2_runs
    v1_store, v1 = traced_methods
    assert traced[name].tokens == v1[name].tokens
    assert _by_position(con, traced[name].run_id) == _by_position(spectrace.store.open(v1_store), v1[name].run_id)
    assert traced[name].metrics == v1[name].metrics


@pytest.mark.parametrize("name", V2_METHODS)
def test_tracing_never_changes_what_v2_generates(v2_runs, name):
    _, traced, untraced = v2_runs
    assert untraced[name].ok, untraced[name].error
    assert traced[name].tokens == untraced[name].tokens


def test_a_raising_v2_hook_leaves_vllm_unchanged_and_is_counted(v2_runs):
    """Every V2 hook made to raise (SPECTRACE_INJECT_FAULT): vLLM generates what it does untraced, and each hook's
    errors are counted under its name, in its own engine's run."""
    con, traced, untraced = v2_runs
    assert sorted(sum(FAULT_GROUPS, ())) == sorted(V2_HOOKS)
    for i, hooks in enumerate(FAULT_GROUPS):
        result = traced[f"self_faulted{i}"]
        assert result.ok, result.error
        assert result.tokens == untraced["self"].tokens
        counted = dict(con.execute("select hook, sum(count) from internal_errors where run_id = ? group by hook",
                                   [result.run_id]).fetchall())
        assert set(counted) == set(hooks) and all(n >= 1 for n in counted.values()), counted
        assert all(f"hook {hook} raised InjectedFault" in result.log for hook in hooks)
    # no other hook raised in these engines (each count above is its injected hooks' alone)


def test_per_request_numbers_equal_vllms_own_on_v2(v2_runs):
    con, traced, _ = v2_runs
    result = traced["self"]
    cursor = con.execute("select * from request_spec_decode where run_id = ?", [result.run_id])
    names = [d[0] for d in cursor.description]
    rows = {r["external_request_id"]: r for r in (dict(zip(names, row)) for row in cursor.fetchall())}
    assert sorted(rows) == sorted(r["request_id"] for r in result.requests)
    for i, request in enumerate(result.requests):
        vllm = request["spec_decode"]
        assert vllm is not None
        mine = rows[request["request_id"]]
        assert mine["num_draft_tokens"] == vllm["num_draft_tokens"] and mine["num_spec_steps"] == vllm["num_spec_steps"]
        assert mine["num_accepted_draft_tokens"] == vllm["num_accepted_draft_tokens"]
        assert mine["output_tokens"] == len(result.tokens[i])
    steps = con.execute("select count(*), min(context_len) from verify_steps where run_id = ?", [result.run_id]).fetchone()
    assert steps[0] == result.metrics["vllm:spec_decode_num_drafts"] and steps[1] > 0


def test_worker_step_times_come_from_the_v2_runner(v2_runs):
    con, traced, _ = v2_runs
    run_id = traced["self"].run_id
    steps, step_ns, draft_ns = con.execute(
        "select sum(steps), sum(step_ns), sum(draft_ns) from speculation_steps where run_id = ?", [run_id]).fetchone()
    # one timed worker step per step that verified drafts (every request of a step shares it)
    engine_steps = con.execute("select count(distinct step) from verify_steps where run_id = ?", [run_id]).fetchone()[0]
    assert steps == engine_steps and step_ns > 0
    assert draft_ns == 0  # V2 drafts inside sample_tokens: not timed apart (hooks_v2)


@pytest.mark.parametrize(("name", "tap_status"), [("eagle3", "ok"), ("dflash", "ok")])
def test_taps_and_layout_are_recorded_on_v2(v2_runs, name, tap_status):
    con, traced, _ = v2_runs
    run_id = traced[name].run_id
    taps = con.execute("select status, tapped_ids, expected_ids from hidden_state_taps where run_id = ?", [run_id]).fetchall()
    assert taps and {t[0] for t in taps} == {tap_status}
    assert all(json.loads(t[1]) == json.loads(t[2]) for t in taps)
    layout = con.execute("select model_role, runtime_type from attention_layout where run_id = ?", [run_id]).fetchall()
    assert {r[0] for r in layout} == {"target", "draft"} and all(r[1] is not None for r in layout)


def _layout(con, run_id):
    return con.execute(
        "select declared_type, resolved_type, runtime_type, runtime_window, causal from attention_layout "
        "where run_id = ? and model_role = 'draft' order by layer_index", [run_id]).fetchall()


def test_the_seeds_drafter_declared_right_runs_four_sliding_layers_and_one_full(v2_runs):
    con, traced, _ = v2_runs
    result = traced["seed_right"]
    assert result.ok, result.error
    assert _layout(con, result.run_id) == [("sliding", "sliding", "sliding", WINDOW, True)] * 4 + [("full", "full", "full", None, True)]
    loud = {code: f for code, f in _findings(con, result.run_id).items() if f[0] in ("error", "warning")}
    assert loud == {}


def test_the_seeds_declaration_is_swa_dropped_before_the_first_step_with_the_layout_it_got(v2_runs):
    con, traced, _ = v2_runs
    result = traced["seed_as_shipped"]
    assert result.ok, result.error
    findings = _findings(con, result.run_id)
    assert findings["SWA_DROPPED"][0] == "error" and "use_sliding_window is absent" in findings["SWA_DROPPED"][2]
    assert findings["LAYOUT_MISMATCH"][1] == "SWA_DROPPED"
    assert [r[2:4] for r in _layout(con, result.run_id)] == [("full", None)] * 5  # the window really is gone
    first_step = con.execute("select min(ts) from verify_steps where run_id = ?", [result.run_id]).fetchone()[0]
    named = con.execute("select ts from findings where run_id = ? and code = 'SWA_DROPPED'", [result.run_id]).fetchone()[0]
    assert named < first_step


def test_layer_types_without_the_flag_is_refused_by_v2_and_named_as_the_dropped_window(v2_runs):
    con, traced, _ = v2_runs
    result = traced["seed_no_flag"]
    assert not result.ok and "requires a window size" in result.error  # V2's DFlash refuses the nulled window
    findings = _findings(con, result.run_id)
    assert findings["SWA_DROPPED"][0] == "error"
    assert findings["LOAD_FAILED"][1] == "SWA_DROPPED"


def test_ngram_on_v2_fails_in_the_interpreter_the_same_way_traced_and_untraced(v2_runs):
    """The harness's limit, asserted rather than skipped: vLLM's V2 ngram kernel stops in Triton's interpreter."""
    _, traced, untraced = v2_runs
    traced, untraced = traced["ngram"], untraced["ngram"]
    assert not untraced.ok and "mask has unsupported dtype" in untraced.error
    assert (traced.ok, traced.error) == (untraced.ok, untraced.error)


@pytest.mark.server  # the OTLP receiver
def test_v2_with_multiprocessing_the_pipeline_process_and_otlp(zoo, scratch, cache_root, traced_methods):
    """vLLM's production shape on V2: frontend, engine core and worker processes (the harness reaches each through
    PYTHONPATH), each shipping to a pipeline process, exporting to the store and to a real OTLP receiver; one run,
    counts equal vLLM's, V1's and the receiver's."""
    from spectrace.testing.otlp import OtlpReceiver

    store = scratch / "v2-mp-store"
    spec = [s for s in method_specs(zoo) if s.name == "self"][0]
    with OtlpReceiver() as receiver:
        result = run_engines([spec], store=store, multiprocessing=True, cache_root=cache_root, runner="v2",
                             env={"SPECTRACE_PIPELINE": "process", "SPECTRACE_EXPORTER": "duckdb,otlp",
                                  "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
                                  "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_METRIC_EXPORT_INTERVAL": "500"},
                             log_file=scratch / "v2-mp.log")["self"]
        sent = receiver.latest("spectrace.verify.accepted_tokens", ("position", "run_id"))
        spans = receiver.spans()
    assert result.ok, result.error
    con = spectrace.store.open(store)
    assert con.execute("select model_runner from runs").fetchall() == [("v2",)]
    roles = {r[0] for r in con.execute("select distinct process_role from spans where run_id = ?", [result.run_id]).fetchall()}
    assert {"frontend", "engine_core", "worker"} <= roles
    drafted, accepted = _by_position(con, result.run_id)
    assert accepted == result.metrics["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert _by_position(con, result.run_id, "worker") == (drafted, accepted)
    v1_store, v1 = traced_methods
    assert result.tokens == v1["self"].tokens
    assert (drafted, accepted) == _by_position(spectrace.store.open(v1_store), v1["self"].run_id)
    assert [sent[(str(p), result.run_id)] for p in range(K)] == accepted  # the receiver got the same counts
    assert {"spectrace.run", "spectrace.worker.load_model"} <= {s["name"] for s in spans}
    # the start-up line once in each traced vLLM process (frontend, engine core, worker); pipeline processes hook nothing
    starts = [line for line in result.log.splitlines() if "spectrace: tracing on in pid" in line]
    assert len({line.split("tracing on in pid ")[1].split()[0] for line in starts}) == len(starts) == 3, starts
    assert all("(vLLM 0.32.0): 27 of 27 hooks active; store " in line and "pipeline process" in line for line in starts)
    assert sum(f"; run {result.run_id}" in line for line in starts) == 1  # the frontend's, said once its run began
