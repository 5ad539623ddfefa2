"""Every hook's error boundary: with every vLLM object it is handed raising on any read, each
hook returns what vLLM's own function returned, unchanged, and counts its error (no vLLM: the
hooks' real wrappers around a stand-in for the wrapped function)."""

from __future__ import annotations

import inspect

import pytest

from spectrace.settings import Settings
from spectrace.testing import fresh_run_env
from spectrace.recorder import runtime, stages, verify


class Hostile:
    """A vLLM object from a vLLM whose shape changed: every read raises."""

    def __getattr__(self, name):
        raise RuntimeError(f"read of .{name}")

    def __bool__(self):
        raise RuntimeError("truth value")

    def __len__(self):
        raise RuntimeError("len")

    def __iter__(self):
        raise RuntimeError("iteration")

    def __getitem__(self, key):
        raise RuntimeError("item")


def _positional(fn) -> int:
    """How many hostile arguments to hand the wrapper: its own positional ones, at least three
    when it takes ``*args`` (self and the arguments of the vLLM function it wraps)."""
    params = inspect.signature(fn).parameters.values()
    named = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty for p in params)
    return max(named, 3) if any(p.kind is p.VAR_POSITIONAL for p in params) else named


@pytest.fixture
def rt(tmp_path):
    with fresh_run_env():  # the frontend's hook starts a run and hands it on through the environment
        rt = runtime.start(Settings(enabled=True, dir=tmp_path, exporters=("duckdb",), pipeline="thread"), hooks=[],
                           make_capture=verify.VerifyCapture)
        rt.enter_role("worker", 0)  # a role and a rank, as in a worker process
        try:
            yield rt
        finally:
            runtime.stop()


HOOKS = stages.all_hooks()


@pytest.mark.parametrize("hook", HOOKS, ids=[h.name for h in HOOKS])
def test_a_hostile_vllm_object_never_costs_vllm_its_result(rt, hook):
    result = object()
    calls = []

    def original(*args, **kwargs):
        calls.append(args)
        return result

    wrapped = hook.make(original, hook.name)
    args = [Hostile() for _ in range(_positional(wrapped))]
    returned = wrapped(*args)
    # vLLM's result, unchanged (a constructor hook may return None: what any __init__ returns)
    assert returned is result or (hook.target.endswith(".__init__") and returned is None)
    assert len(calls) == 1 and all(a is b for a, b in zip(calls[0], args))  # called once, with vLLM's own arguments


PER_STEP = ["engine_core.verify", "engine_core.add_request", "engine_core.proposals", "worker.verify", "worker.execute_model", "worker.verify_v2.sample"]


@pytest.mark.parametrize("name", PER_STEP)
def test_the_per_step_hooks_count_what_a_hostile_object_raised(rt, name):
    hook = next(h for h in HOOKS if h.name == name)
    wrapped = hook.make(lambda *a, **k: "vllm's output", name)
    assert wrapped(*[Hostile() for _ in range(_positional(wrapped))]) == "vllm's output"
    assert rt.errors.get(name) == 1
    rt.flush()  # the drain finds nothing half-captured
    assert rt.errors.get(name) == 1 and not rt.verify.engine_steps and not rt.verify.worker_steps


def test_every_hook_is_covered():
    assert len(HOOKS) >= 20 and {h.name for h in HOOKS} >= set(PER_STEP)
