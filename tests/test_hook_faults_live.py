"""Every hook, made to raise (SPECTRACE_INJECT_FAULT), on real vLLM runs: vLLM finishes with the
untraced tokens, and the fault is one counted internal error of that hook, nothing else."""

from __future__ import annotations

import dataclasses

import pytest

import spectrace.store
from spectrace.testing.engine import method_specs, run_engines
from spectrace.recorder import stages

pytestmark = pytest.mark.vllm

# every hook that fires in an engine on CPU, plus the three recording steps of worker.load_model that
# have their own guard. Elsewhere: the API server's own hooks (api_server.*, frontend.chat_request) fire only under
# `vllm serve` (tests/test_serve_metrics_live.py, tests/test_thinking_live.py); the V2 model runner's (worker.verify_v2*, worker.execute_model_v2)
# on V2 through Triton's interpreter (tests/test_v2_live.py) and on a GPU (`make gpu-check`).
ALL = [hook.name for hook in stages.all_hooks()]
ELSEWHERE = ("api_server.", "frontend.chat_request", "worker.verify_v2", "worker.execute_model_v2")
HOOKS = [name for name in ALL if not name.startswith(ELSEWHERE)] + ["worker.layout", "worker.taps", "worker.weights"]
ASYNC_ONLY = {"frontend.async_llm_started"}  # AsyncLLM's start: `vllm serve`, not the offline LLM


# Hooks that share an engine: each is called by vLLM whatever the others did (the wrapped call always
# runs), and none of them starts the run, installs other hooks or records what another records. The rest
# run alone: a run that never began, a load that recorded nothing, changes what later hooks see.
ALONE = {"frontend.create_engine_config", "frontend.llm_engine_started", "worker.load_model", *ASYNC_ONLY}
GROUPS = 3


def _engines() -> dict[str, list[str]]:
    """Engine name -> the hooks it faults."""
    shared = [h for h in HOOKS if h not in ALONE]
    engines = {f"group{i}": shared[i::GROUPS] for i in range(GROUPS)}
    engines.update({h: [h] for h in sorted(ALONE, key=lambda h: h in ASYNC_ONLY)})  # the AsyncLLM engine last
    return engines


ENGINE_OF = {hook: name for name, hooks in _engines().items() for hook in hooks}


@pytest.fixture(scope="module")
def faulted(zoo, scratch, cache_root):
    """eagle3 engines with hooks made to raise (taps and worker verification included), all in one child."""
    eagle3 = next(s for s in method_specs(zoo) if s.name == "eagle3")
    specs = [
        dataclasses.replace(eagle3, name=name, inject_fault=",".join(hooks), async_engine=bool(set(hooks) & ASYNC_ONLY))
        for name, hooks in _engines().items()
    ]
    store = scratch / "hook-faults-store"
    results = run_engines(specs, store=store, cache_root=cache_root, log_file=scratch / "hook-faults.log")
    return spectrace.store.open(store), results


def test_every_hook_is_covered():
    assert len(HOOKS) == len(set(HOOKS))
    assert {"engine_core.verify", "worker.verify", "frontend.get_config", "worker.load_model"} <= set(HOOKS)
    assert set(ALL) - set(HOOKS) == {name for name in ALL if name.startswith(ELSEWHERE)}


@pytest.mark.parametrize("hook", HOOKS)
def test_a_raising_hook_leaves_vllm_unchanged_and_is_counted(faulted, untraced_methods, hook):
    con, results = faulted
    result = results[ENGINE_OF[hook]]
    assert result.ok, result.error
    assert result.tokens == untraced_methods["eagle3"].tokens
    # internal_errors names the hook: its count is its own whichever hooks shared its engine
    errors = con.execute("select sum(count), count(distinct pid) from internal_errors where hook = ?", [hook]).fetchone()
    assert errors[0] >= 1 and errors[1] == 1
    assert f"hook {hook} raised InjectedFault" in result.log


def test_nothing_but_the_injected_faults_was_counted(faulted):
    con, results = faulted
    assert {row[0] for row in con.execute("select distinct hook from internal_errors").fetchall()} == set(HOOKS)
    assert "generator didn't yield" not in next(iter(results.values())).log
