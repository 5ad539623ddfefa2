"""The plugin in real vLLM processes: runs, roles, one trace per engine start."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import spectrace.store
from spectrace.testing.engine import EngineSpec, base_env, run_engines
from spectrace.recorder import stages

pytestmark = pytest.mark.vllm

HOOKED = [
    ("vllm.engine.arg_utils", "EngineArgs", "create_engine_config"),
    ("vllm.config.model", None, "get_config"),
    ("vllm.v1.engine.llm_engine", "LLMEngine", "__init__"),
    ("vllm.v1.engine.core", "EngineCore", "_initialize_kv_caches"),
    ("vllm.v1.worker.gpu_worker", "Worker", "load_model"),
    ("vllm.v1.core.sched.scheduler", "Scheduler", "update_from_output"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_bookkeeping_sync"),
]

_IDENTITY_SCRIPT = textwrap.dedent(
    """
    import importlib, json, sys
    hooked = json.loads(sys.argv[1])
    def current():
        out = []
        for module, owner, attr in hooked:
            obj = importlib.import_module(module)
            if owner:
                obj = getattr(obj, owner)
            out.append(id(getattr(obj, attr)))
        return out
    before = current()
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    after = current()
    # with tracing off the plugin reads SPECTRACE through spectrace.settings (standard library only), nothing more
    heavy = sorted(m for m in sys.modules if m.startswith("spectrace.") and m not in ("spectrace.plugin", "spectrace.settings"))
    restored = None
    if "spectrace.recorder.runtime" in sys.modules:
        from spectrace.recorder import runtime
        runtime.stop()
        restored = current()
    print(json.dumps({"before": before, "after": after, "restored": restored, "heavy": heavy}))
    """
)


def _identity(env):
    proc = subprocess.run(
        [sys.executable, "-c", _IDENTITY_SCRIPT, json.dumps(HOOKED)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_tracing_off_patches_nothing(tmp_path):
    env = base_env(tmp_path / "store", traced=False)
    env["SPECTRACE"] = "0"
    result = _identity(env)
    assert result["after"] == result["before"]
    assert result["heavy"] == []
    assert not (tmp_path / "store").exists()


def test_tracing_on_patches_and_unpatches(tmp_path):
    result = _identity(base_env(tmp_path / "store"))
    assert all(a != b for a, b in zip(result["after"], result["before"]))
    assert result["restored"] == result["before"]
    con = spectrace.store.open(tmp_path / "store")
    statuses = dict(con.execute("select hook, status from hooks").fetchall())
    later = {h.name for h in stages.all_hooks() if h.later}  # an API server's: installed once an AsyncLLM is up
    assert statuses and {s for h, s in statuses.items() if h not in later} == {"installed"}
    assert {statuses[h] for h in later} == {"elsewhere"}


_INSPECTION_SCRIPT = textwrap.dedent(
    """
    import json, os
    from vllm.model_executor.models.registry import _run_in_subprocess

    def inspect():  # what vLLM's model-inspection child saw: it loaded the plugin, which started nothing
        import os, sys
        return {"pid": os.getpid(), "plugin": "spectrace.plugin" in sys.modules,
                "recorder": sorted(m for m in sys.modules if m.startswith("spectrace.recorder"))}

    print(json.dumps({"parent": os.getpid(), "child": _run_in_subprocess(inspect)}))
    """
)


def test_the_model_inspection_subprocess_loads_the_plugin_and_traces_nothing(tmp_path):
    """vLLM runs ``python -m vllm.model_executor.models.registry`` to inspect model classes when its registry cache
    is cold, and loads general plugins there; spectrace wrote ``hooks`` rows under that child's pid and the run it
    inherited. It runs no engine: the plugin stays off in it."""
    proc = subprocess.run([sys.executable, "-c", _INSPECTION_SCRIPT], env=base_env(tmp_path / "store"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    child = result["child"]
    assert child["pid"] != result["parent"] and child["plugin"]  # vLLM's own child, and it loaded the plugin
    assert child["recorder"] == []  # which started nothing
    assert not (tmp_path / "store").exists()  # and wrote nothing (the parent runs no engine either)


def test_runs_and_spans_of_several_engines_in_one_process(traced_methods):
    store, results = traced_methods
    con = spectrace.store.open(store)
    run_ids = [r.run_id for r in results.values()]
    assert len(set(run_ids)) == len(run_ids)  # one run per LLM object
    runs = {r[0]: r[1:] for r in con.execute(
        "select run_id, method, num_speculative_tokens, target_model, draft_model, vllm_version, model_runner from runs"
    ).fetchall()}
    assert set(runs) == set(run_ids)
    assert runs[results["eagle3"].run_id][0] == "eagle3"
    assert runs[results["ngram"].run_id][3] is None  # ngram has no draft model
    assert runs[results["self"].run_id][4] == "0.32.0" and runs[results["self"].run_id][5] == "v1"
    for run_id in run_ids:
        spans = con.execute(
            "select name, process_role, trace_id, parent_span_id from spans where run_id = ?", [run_id]
        ).fetchall()
        names = {s[0] for s in spans}
        assert {"spectrace.run", "spectrace.config.resolve", "spectrace.worker.load_model",
                "spectrace.engine_core.init_kv_caches"} <= names
        assert len({s[2] for s in spans}) == 1  # one trace per engine start
        root = [s for s in spans if s[0] == "spectrace.run"]
        assert len(root) == 1 and root[0][3] == ""
        roles = {s[1] for s in spans}
        assert {"frontend", "engine_core", "worker"} <= roles


def test_config_resolve_span_carries_declared_and_resolved(traced_methods):
    store, results = traced_methods
    con = spectrace.store.open(store)
    rows = con.execute(
        "select attributes->>'spectrace.model.role', attributes->>'spectrace.config.declared', "
        "attributes->>'spectrace.config.vllm_class' from spans "
        "where run_id = ? and name = 'spectrace.config.resolve'",
        [results["dflash"].run_id],
    ).fetchall()
    by_role = {r[0]: r for r in rows}
    assert set(by_role) == {"target", "draft"}
    declared = json.loads(by_role["draft"][1])
    assert declared["architectures"] == ["DFlashDraftModel"]
    assert by_role["draft"][2] == "EAGLEConfig"  # vLLM wraps DFlash drafters


def test_multiprocess_engine_is_one_run_across_processes(zoo, scratch, cache_root):
    store = scratch / "mp-store"
    spec = EngineSpec(
        name="mp",
        target=zoo["target"],
        speculative={"method": "draft_model", "model": zoo["draft_self"], "num_speculative_tokens": 2},
        prompts=["the quick brown fox"],
        max_tokens=8,
    )
    result = run_engines(
        [spec], store=store, multiprocessing=True, cache_root=cache_root, env={"SPECTRACE_RUN_ID": "canary-7"}
    )["mp"]
    assert result.ok, result.error
    assert result.run_id == "canary-7"  # SPECTRACE_RUN_ID names the run in every process
    con = spectrace.store.open(store)
    assert con.execute("select count(*) from runs").fetchone()[0] == 1
    assert con.execute("select distinct run_id from spans").fetchall() == [("canary-7",)]
    rows = con.execute("select distinct pid, process_role, trace_id from spans where run_id = ?", [result.run_id]).fetchall()
    pids = {r[0] for r in rows}
    assert len(pids) >= 2
    assert len({r[2] for r in rows}) == 1
    frontend_pids = {r[0] for r in rows if r[1] == "frontend"}
    worker_pids = {r[0] for r in rows if r[1] == "worker"}
    assert frontend_pids and worker_pids and not (frontend_pids & worker_pids)
    # every span but the root has a parent inside the same trace
    orphans = con.execute(
        "select count(*) from spans s where run_id = ? and parent_span_id != '' and parent_span_id not in "
        "(select span_id from spans where run_id = ?)",
        [result.run_id, result.run_id],
    ).fetchone()[0]
    assert orphans == 0
    drafted = con.execute(
        "select sum(drafted) from verify_counts where run_id = ? and source = 'engine_core'", [result.run_id]
    ).fetchone()[0]
    assert drafted == result.metrics["vllm:spec_decode_num_draft_tokens"]
