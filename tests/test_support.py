"""Declared version ranges and site shapes decide which hooks install (pure: stand-in modules written here).

A hook outside its range, or whose site no longer has the shape it reads, is switched off with one
log line; the original stays in place and the other hooks install. docs/reference/versions.md is generated.
"""

from __future__ import annotations

import logging
import sys
import textwrap
import types
from importlib.metadata import version
from pathlib import Path

import pytest

from spectrace.vllm_objects.steps import BOOKKEEPING_FIELDS
from spectrace.recorder import support
from spectrace.recorder.hooks import Hook, HookSet
from spectrace.recorder.stages import all_hooks
from spectrace.recorder.support import Reads, Support

SOURCE = '''
from dataclasses import dataclass

@dataclass
class Output:
    sampled: list
    req_id_to_index: dict

class Runner:
    def __init__(self):
        self.steps = 0

    @property
    def ready(self):
        return True

    def bookkeeping(self, scheduler_output, sampler_output):
        if scheduler_output:
            return (1, 2)
        def inner():
            return (3, 4)
        return (num_nans, valid_sampled_token_ids, req_id_to_index_output_copy)
'''


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A module ``spectrace_site`` written to disk and imported, so its source is there to read."""
    (tmp_path / "spectrace_site.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "spectrace_site", raising=False)
    import spectrace_site

    yield spectrace_site
    sys.modules.pop("spectrace_site", None)


def _declare(monkeypatch, **entries: Support) -> None:
    monkeypatch.setattr(support, "SUPPORT", {**support.SUPPORT, **entries})


def _same(original, name):
    return lambda *args, **kwargs: original(*args, **kwargs)


PYTEST = version("pytest")


@pytest.mark.parametrize(
    ("installed", "spec", "fits"),
    [
        ("0.32.0", ">=0.30, <0.34", True),
        ("0.30.0+cpu", ">=0.30, <0.34", True),
        ("0.33.1rc1.dev4+gabc", ">=0.30, <0.34", True),
        ("0.34.0", ">=0.30, <0.34", False),
        ("0.29.9", ">=0.30, <0.34", False),
        ("0.20.1", ">=0.30, <0.34", False),
        ("0.26", ">=0.20, <0.27", True),
        ("1.0", "==1", True),
        ("0.30.0rc1", ">=0.30, <0.34", False),  # a pre-release of the lower bound comes before it
        ("0.34.0rc1", ">=0.30, <0.34", False),  # ... and of an exclusive upper bound is outside it
        ("0.33.0.dev7", ">=0.30, <0.34", True),
    ],
)
def test_version_ranges(installed, spec, fits):
    assert support.in_range(installed, spec) is fits


def test_hook_outside_its_range_is_switched_off_and_the_rest_install(site, monkeypatch, caplog):
    _declare(
        monkeypatch,
        old=Support(package="pytest", versions="<1"),
        fits=Support(package="pytest", versions=f">={PYTEST}"),
    )
    original = site.Runner.__dict__["bookkeeping"]
    hooks = HookSet()
    with caplog.at_level(logging.WARNING, logger="vllm.spectrace"):
        reason = hooks.install(Hook("old", "spectrace_site:Runner.bookkeeping", _same))
        assert hooks.install(Hook("fits", "spectrace_site:Runner.__init__", _same)) is None
    assert reason == f"pytest {PYTEST} is outside <1"
    assert hooks.unsupported == {"old": reason} and list(hooks.installed) == ["fits"]
    assert site.Runner.__dict__["bookkeeping"] is original
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"spectrace: hook old switched off: {reason} (supports pytest <1); that part of the audit is unavailable"]


def test_returned_tuple_is_read_from_the_installed_source(site, monkeypatch):
    fields = ("num_nans", "valid_sampled_token_ids", "req_id_to_index_output_copy")
    _declare(
        monkeypatch,
        same=Support(package="pytest", versions=">=0", params=("self", "scheduler_output"), returns=fields),
        moved=Support(package="pytest", versions=">=0", returns=BOOKKEEPING_FIELDS),
    )
    hooks = HookSet()
    assert hooks.install(Hook("same", "spectrace_site:Runner.bookkeeping", _same)) is None
    hooks.uninstall_all()
    reason = hooks.install(Hook("moved", "spectrace_site:Runner.bookkeeping", _same))
    assert reason.startswith(f"pytest {PYTEST}: Runner.bookkeeping returns (num_nans, valid_sampled_token_ids, req_id_to_index_output_copy)")
    assert "moved" in hooks.unsupported and not hooks.installed


def test_parameters_and_fields_read(site, monkeypatch):
    _declare(
        monkeypatch,
        params=Support(package="pytest", versions=">=0", params=("self", "model_runner_output")),
        fields=Support(
            package="pytest",
            versions=">=0",
            reads=(Reads("spectrace_site:Output", ("sampled", "req_id_to_index")), Reads("spectrace_site:Runner", ("steps", "ready", "gone"))),
        ),
    )
    assert support.check("params", "spectrace_site:Runner.bookkeeping") == (
        f"pytest {PYTEST}: Runner.bookkeeping takes (self, scheduler_output, sampler_output), "
        "the hook expects (self, model_runner_output, ...)"
    )
    assert support.check("fields", "spectrace_site:Runner.bookkeeping") == f"pytest {PYTEST}: Runner has no gone"


def test_hook_without_a_declaration_installs(site):
    hooks = HookSet()
    assert hooks.install(Hook("undeclared", "spectrace_site:Runner.bookkeeping", _same)) is None


def test_static_check_reads_an_unimported_tree_and_follows_reexports(tmp_path):
    pkg = tmp_path / "fakevllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "impl.py").write_text(textwrap.dedent(SOURCE))
    (pkg / "api.py").write_text("from .impl import Runner as Runner\n")
    locate = support.tree_locate(tmp_path)
    spec = Support(params=("self", "scheduler_output"), reads=(Reads("fakevllm.api:Runner", ("steps",)),))
    assert support.shape_problems("fakevllm.api:Runner.bookkeeping", spec, locate) == []
    assert support.shape_problems("fakevllm.api:Runner.gone", spec, locate) == ["fakevllm.impl:Runner.gone: no such function in the source"]
    assert "fakevllm" not in sys.modules


def test_every_hook_declares_its_range():
    """A new hook says which vLLM it fits: add it to spectrace.recorder.support.SUPPORT."""
    assert sorted({h.name for h in all_hooks()} - set(support.SUPPORT)) == []


def test_versions_page_is_generated():
    import importlib.util

    repo = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("versions_table", repo / "tools" / "versions_table.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    text = (repo / "docs" / "reference" / "versions.md").read_text()
    expected = tool.readme_block(all_hooks(), tool.load_matrix(repo))
    assert tool.render_readme(text, expected) == text, "python -m tools.docs_reference versions.md"
    assert all(f"| `{h.name}` |" in text for h in all_hooks())


@pytest.mark.vllm
def test_switched_off_hook_is_a_hooks_row(site, monkeypatch, tmp_path):
    import spectrace.store
    from spectrace.settings import Settings
    from spectrace.recorder import runtime, verify

    _declare(monkeypatch, old=Support(package="pytest", versions="<1"), fits=Support(package="pytest", versions=">=1"))
    settings = Settings(enabled=True, dir=tmp_path, exporters=("duckdb",), pipeline="thread")
    hooks = [Hook("old", "spectrace_site:Runner.bookkeeping", _same), Hook("fits", "spectrace_site:Runner.__init__", _same)]
    rt = runtime.start(settings, hooks=hooks, make_capture=verify.VerifyCapture)
    try:
        rt.flush()
    finally:
        runtime.stop()
    rows = spectrace.store.open(tmp_path).execute("select hook, status, detail, supported_versions from hooks order by hook").fetchall()
    assert rows == [
        ("fits", "installed", "", "pytest >=1"),
        ("old", "unsupported", f"pytest {PYTEST} is outside <1", "pytest <1"),
    ]


def test_a_hook_on_another_package_also_needs_the_vllm_range(site, monkeypatch):
    _declare(monkeypatch, served=Support(package="pytest", versions=">=1", also=(("pytest", "<1"),)))
    assert support.check("served", "spectrace_site:Runner.bookkeeping") == f"pytest {PYTEST} is outside <1"
    assert support.range_text("served", "") == "pytest >=1, pytest <1"


@pytest.mark.parametrize(
    ("installed", "newer"),
    [("0.35.0", True), ("0.35.0rc1", True), ("1.0", True), ("0.34.9", False), ("0.29.0", False), ("0.32.0", False)],
)
def test_newer_than_the_range_is_a_later_release_only(installed, newer):
    assert support.newer_than(installed, ">=0.30, <0.35") is newer


def _vllm_is(monkeypatch, installed: str) -> None:
    real = support.installed_version
    monkeypatch.setattr(support, "installed_version", lambda package: installed if package == "vllm" else real(package))


def test_next_release_installs_every_hook_whose_site_fits_and_names_the_rest(site, monkeypatch):
    """vLLM newer than the tested range: a hook whose site has the shape it reads installs, noted as untested; one
    whose site changed is unsupported with the reason; one vLLM removed on purpose is retired; the summary counts
    them all (the start-up line)."""
    _vllm_is(monkeypatch, "0.35.0")
    _declare(
        monkeypatch,
        fits=Support(versions=">=0.30, <0.35", params=("self", "scheduler_output")),
        moved=Support(versions=">=0.30, <0.35", params=("self", "model_runner_output")),
        gone=Support(versions=">=0.30, <0.34", gone="vLLM 0.34 removed this site"),
    )
    hooks = HookSet()
    assert hooks.install(Hook("fits", "spectrace_site:Runner.bookkeeping", _same)) is None
    assert hooks.install(Hook("moved", "spectrace_site:Runner.ready", _same)).startswith("vllm 0.35.0: ")
    assert hooks.install(Hook("gone", "spectrace_site_removed:Runner.step", _same)) == "vllm 0.35.0: vLLM 0.34 removed this site"
    assert list(hooks.installed) == ["fits"]
    assert hooks.untested == {"fits": "untested on vllm 0.35.0 (tested >=0.30, <0.35); its site fits"}
    assert [hooks.status(n) for n in ("fits", "moved", "gone")] == ["installed", "unsupported", "retired"]
    summary = hooks.summary()
    assert summary.startswith("1 of 2 hooks active (1 retired: not in this vLLM by design); 1 installed outside the "
                              "tested range (their sites fit); not installed: moved (vllm 0.35.0: ")
    hooks.uninstall_all()


def test_a_vllm_older_than_the_range_is_refused_and_a_retired_site_is_not_retired_inside_its_range(site, monkeypatch):
    _vllm_is(monkeypatch, "0.29.0")
    _declare(monkeypatch, old=Support(versions=">=0.30, <0.35"), gone=Support(versions=">=0.30, <0.34", gone="removed"))
    hooks = HookSet()
    assert hooks.install(Hook("old", "spectrace_site:Runner.bookkeeping", _same)) == "vllm 0.29.0 is outside >=0.30, <0.35"
    assert support.retired("gone") is None  # older than its range: refused, not retired
    _vllm_is(monkeypatch, "0.33.0")
    assert support.retired("gone") is None and support.untested("old") is None
    assert hooks.install(Hook("gone", "spectrace_site:Runner.bookkeeping", _same)) is None


def test_the_v1_runner_hooks_are_the_ones_retired_on_0_34():
    """From the declarations alone (``make check-vllm`` checks every other site against 0.34's own source)."""
    retired = support.static_retired(all_hooks(), "0.34.0")
    assert sorted(retired) == ["worker.execute_model", "worker.propose_drafts", "worker.sample_tokens", "worker.verify"]
    assert support.static_retired(all_hooks(), "0.32.0") == {}
