"""Hook installation and removal (pure mechanics, on stand-in classes defined here)."""

from __future__ import annotations

import sys
import types

import pytest

from spectrace.recorder.hooks import Hook, HookSet


class Engine:
    def step(self, x):
        return x + 1

    @staticmethod
    def helper(x):
        return x * 2

    @classmethod
    def build(cls, x):
        return (cls.__name__, x)


class Child(Engine):
    pass


@pytest.fixture
def module(monkeypatch):
    mod = types.ModuleType("spectrace_hook_target")
    mod.Engine = Engine
    mod.Child = Child
    mod.function = lambda x: -x
    monkeypatch.setitem(sys.modules, "spectrace_hook_target", mod)
    return mod


def _counting(calls):
    def make(original, name):
        def wrapper(*args, **kwargs):
            calls.append(args[-1])
            return original(*args, **kwargs)

        return wrapper

    return make


def test_install_wraps_and_uninstall_restores_identity(module):
    originals = (Engine.__dict__["step"], Engine.__dict__["helper"], Engine.__dict__["build"], module.function)
    calls = []
    hooks = HookSet()
    for name, target in [("step", "Engine.step"), ("helper", "Engine.helper"), ("build", "Engine.build"), ("fn", "function")]:
        assert hooks.install(Hook(name, f"spectrace_hook_target:{target}", _counting(calls))) is None
    assert Engine().step(1) == 2 and Engine.helper(3) == 6 and Child.build(4) == ("Child", 4) and module.function(5) == -5
    assert calls == [1, 3, 4, 5]
    hooks.uninstall_all()
    assert (Engine.__dict__["step"], Engine.__dict__["helper"], Engine.__dict__["build"], module.function) == originals


def test_inherited_method_is_hooked_on_the_subclass_and_removed_cleanly(module):
    hooks = HookSet()
    calls = []
    hooks.install(Hook("child.step", "spectrace_hook_target:Child.step", _counting(calls)))
    assert Child().step(1) == 2 and Engine().step(1) == 2
    assert calls == [1]
    hooks.uninstall_all()
    assert "step" not in Child.__dict__


def test_missing_target_is_reported_not_skipped(module, caplog):
    hooks = HookSet()
    reason = hooks.install(Hook("gone", "spectrace_hook_target:Engine.vanished", _counting([])))
    assert reason == "spectrace_hook_target:Engine has no vanished"
    assert hooks.missing == {"gone": reason}
    assert any("hook gone not installed" in r.getMessage() for r in caplog.records)
    reason = hooks.install(Hook("nomodule", "no_such_module_anywhere:thing", _counting([])))
    assert reason.startswith("module no_such_module_anywhere cannot be imported")


def test_a_later_hook_is_elsewhere_until_its_process_shows_itself_and_its_module_never_imported(module, caplog):
    hooks = HookSet()
    away = Hook("server.only", "spectrace_never_imported_module:Thing.call", _counting([]), later="once serving")
    assert hooks.install(away) == "not this process's yet: installed once serving"
    assert hooks.status("server.only") == "elsewhere" and "spectrace_never_imported_module" not in sys.modules
    assert not hooks.missing and not caplog.records and hooks.summary() == "0 of 0 hooks active"
    calls = []
    here = Hook("here", "spectrace_hook_target:Engine.step", _counting(calls), later="once serving")
    assert hooks.install(here).startswith("not this process's") and Engine().step(1) == 2 and calls == []
    assert hooks.install(here, now=True) is None and Engine().step(1) == 2 and calls == [1]
    assert hooks.status("here") == "installed" and "here" not in hooks.elsewhere
    hooks.uninstall_all()


def test_exceptions_of_the_original_pass_through_unchanged(module):
    def boom(self, x):
        raise KeyError(x)

    module.Engine.explode = boom
    hooks = HookSet()
    hooks.install(Hook("explode", "spectrace_hook_target:Engine.explode", _counting([])))
    with pytest.raises(KeyError):
        Engine().explode(7)
    hooks.uninstall_all()
    del module.Engine.explode


def test_second_install_is_ignored(module):
    hooks = HookSet()
    calls = []
    hook = Hook("step", "spectrace_hook_target:Engine.step", _counting(calls))
    hooks.install(hook)
    hooks.install(hook)
    Engine().step(1)
    assert calls == [1]
    hooks.uninstall_all()


@pytest.fixture
def shimmed(monkeypatch):
    """``spectrace_real`` defines ``fetch`` and ``Consumer``, which calls its own global ``fetch``;
    ``spectrace_shim`` is the old path, re-exporting both (as vLLM leaves shims when it moves a module)."""
    real = types.ModuleType("spectrace_real")
    exec("def fetch():\n    return 'real'\n\nclass Consumer:\n    def run(self):\n        return fetch()\n", real.__dict__)
    real.Consumer.__module__ = "spectrace_real"
    shim = types.ModuleType("spectrace_shim")
    shim.fetch, shim.Consumer = real.fetch, real.Consumer
    monkeypatch.setitem(sys.modules, "spectrace_real", real)
    monkeypatch.setitem(sys.modules, "spectrace_shim", shim)
    return real, shim


def _noting(calls):
    def make(original, name):
        def wrapper(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)

        return wrapper

    return make


def test_a_function_hooked_through_a_shim_is_patched_where_its_caller_looks_it_up(shimmed):
    real, shim = shimmed
    calls = []
    hooks = HookSet()
    # through the shim alone the name patched is one that nobody calls
    assert hooks.install(Hook("naive", "spectrace_shim:fetch", _noting(calls))) is None
    assert real.Consumer().run() == "real" and calls == []
    hooks.uninstall_all()
    assert hooks.install(Hook("within", "spectrace_shim:fetch", _noting(calls), within="spectrace_shim:Consumer")) is None
    assert real.Consumer().run() == "real" and calls == ["within"]
    hooks.uninstall_all()
    assert real.fetch() == "real" and real.__dict__["fetch"] is shim.fetch  # the original back in place


def test_a_caller_that_no_longer_calls_the_name_is_missing(shimmed):
    real, _ = shimmed
    del real.fetch
    hooks = HookSet()
    reason = hooks.install(Hook("within", "spectrace_shim:fetch", _noting([]), within="spectrace_shim:Consumer"))
    assert reason == "spectrace_real (where Consumer is defined) calls no fetch" and "within" in hooks.missing
