"""Shared fixtures: the tiny model zoo and real vLLM engine runs; the test lanes.

Every engine run is real vLLM 0.32 on CPU in a child process (plugins load
per process). Engines that tests share are started once per session.

Lanes: a test that needs vLLM or torch is marked ``vllm``, one that needs a server
(Prometheus, promtool, amtool, PostgreSQL, the OTLP receiver; tmux) ``server``, a pure one that takes seconds of
its own (an exhaustive search, a deadline) ``slow``: a live module
says so in its ``pytestmark``, and a test that requests a fixture below that needs one
is marked here. ``pytest --unit`` (``make unit``) runs the rest, imports no module marked
``vllm`` or ``server`` as a whole, and fails when torch or vLLM got imported anyway.
Building the zoo needs torch, so its import stays inside the fixtures.
"""

from __future__ import annotations

import ast
import os
import shutil
import sys
from pathlib import Path

import pytest

import spectrace.store
from spectrace.testing.engine import EngineSpec, method_specs, run_engines

WINDOW = 64

UNIT = "not vllm and not server and not slow"
HEAVY = ("torch", "vllm")  # what the unit lane must never import
LANE_OF_FIXTURE = {
    "zoo": "vllm", "cache_root": "vllm",  # every engine fixture below requests them
    "prometheus_binaries": "server", "postgres_binaries": "server",
}  # fmt: skip
_heavy_key = pytest.StashKey[str | None]()  # in the unit lane: the first node after which HEAVY was imported
_heavy_names_key = pytest.StashKey[list]()  # ... and which of HEAVY (an xdist worker's, reported to the controller)


def module_marks(path: Path) -> set[str]:
    """The marker names in a test module's top-level ``pytestmark``, read without importing it."""
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return {n.attr for n in ast.walk(node.value)
                    if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"}
    return set()


def pytest_addoption(parser):
    parser.addoption("--unit", action="store_true",
                     help=f"the fast lane (make unit): -m '{UNIT}', and fail if torch or vllm got imported")


def pytest_configure(config):
    if config.getoption("unit"):
        expr = config.option.markexpr
        config.option.markexpr = f"({expr}) and {UNIT}" if expr else UNIT
        config.stash[_heavy_key] = None


def pytest_ignore_collect(collection_path, config):
    if config.getoption("unit") and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        if module_marks(collection_path) & {"vllm", "server"}:
            return True  # every test in it is deselected: not even imported
    return None


def _mark_lanes(items) -> None:
    for item in items:
        for lane in sorted({LANE_OF_FIXTURE[f] for f in item.fixturenames if f in LANE_OF_FIXTURE}):
            if item.get_closest_marker(lane) is None:
                item.add_marker(lane)


# Session fixtures that start engines several modules read. `make test` runs two pytest-xdist workers with
# --dist loadfile: each module runs whole in one worker (its module fixtures start once), and the modules that
# read the same session engines run in one worker too (ENGINE_GROUPS, pytest_xdist_make_scheduler below), so that
# each engine starts once (in two workers it started twice: 45-50 s of engines each time).
ENGINE_GROUPS = {"traced_methods": "methods", "untraced_methods": "methods", "tap_runs": "methods",
                 "audit_runs": "audit"}  # a session engine -> the work unit of every module that reads it
SHARED_ENGINES = tuple(ENGINE_GROUPS)


def engine_group(path: Path) -> str | None:
    """The work unit of a test module that reads a session engine (a parameter of any of its functions), else None;
    read without importing it. A module reading engines of two groups would take the first: none does."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    names = {arg.arg for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
             for arg in node.args.args}
    groups = sorted({ENGINE_GROUPS[name] for name in names if name in ENGINE_GROUPS})
    return f"engines:{groups[0]}" if groups else None


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, with the modules that read the same session engines in one work unit (engine_group), handed
    out in the collection's order (pytest_collection_modifyitems: shared engines, live modules, fast ones)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    # xdist's default (--loadscope-reorder) hands out the units by their number of tests, most first: the fast
    # modules' many parametrized tests went first and the one-test live modules, the longest (test_metrics_endpoint_live,
    # test_dashboards_live, test_serve_live: 1.5-5 minutes each), last, where one worker ran them while the other
    # had nothing left to take. Live first, fast last: the last units are seconds long, the workers end together.
    config.option.loadscopereorder = False

    groups: dict[str, str] = {}  # module -> work unit

    class SharedEngineScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            if module not in groups:
                groups[module] = engine_group(config.rootpath / module) or module
            return groups[module]

    return SharedEngineScheduling(config, log)


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    """The lanes (a test requesting a fixture that needs vLLM or a server gets that mark); under xdist, the
    modules that read a shared engine first, then the other live modules, then the fast ones, so the two
    workers finish together (the order within a module is kept)."""
    _mark_lanes(items)
    if not hasattr(config, "workerinput") and config.getoption("dist", "no") == "no":
        return
    shared: set[str] = set()
    live: set[str] = set()
    for item in items:
        module = item.module.__file__
        if any(f in SHARED_ENGINES for f in item.fixturenames):
            shared.add(module)
        if item.get_closest_marker("vllm") is not None or item.get_closest_marker("server") is not None:
            live.add(module)
    items.sort(key=lambda item: (item.module.__file__ not in shared, item.module.__file__ not in live))


def _note_heavy(config, nodeid: str) -> None:
    if _heavy_key in config.stash and config.stash[_heavy_key] is None:
        if any(name in sys.modules for name in HEAVY):
            config.stash[_heavy_key] = nodeid


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    _note_heavy(collector.config, collector.nodeid)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item):
    result = yield
    _note_heavy(item.config, item.nodeid)
    return result


def pytest_sessionfinish(session):
    culprit = session.config.stash.get(_heavy_key, None)
    if culprit is not None and hasattr(session.config, "workeroutput"):  # an xdist worker: tell the controller
        session.config.workeroutput["spectrace_heavy"] = (culprit, [name for name in HEAVY if name in sys.modules])
    if culprit is not None and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist's controller: a worker's unit-lane failure (torch or vLLM imported there) fails the whole run."""
    heavy = getattr(node, "workeroutput", {}).get("spectrace_heavy")
    if heavy is not None and _heavy_key in node.config.stash and node.config.stash[_heavy_key] is None:
        node.config.stash[_heavy_key] = heavy[0]
        node.config.stash[_heavy_names_key] = heavy[1]


def pytest_terminal_summary(terminalreporter, config):
    culprit = config.stash.get(_heavy_key, None)
    if culprit is not None:
        imported = ", ".join(config.stash.get(_heavy_names_key, None) or [name for name in HEAVY if name in sys.modules])
        terminalreporter.write_line(f"FAILED unit lane: {imported} imported, first seen after {culprit or 'conftest'}"
                                    " (mark it vllm, or import lazily)", red=True, bold=True)


@pytest.fixture(scope="session")
def prometheus_binaries() -> None:
    """promtool, prometheus and amtool are required, never skipped: `make test` installs them."""
    missing = [name for name in ("promtool", "prometheus", "amtool") if shutil.which(name) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: run `make prometheus` (Debian's prometheus and prometheus-alertmanager)")


@pytest.fixture(scope="session")
def postgres_binaries() -> None:
    """PostgreSQL (the lake's catalog) is required, never skipped: `make test` installs it."""
    from spectrace.testing.postgres import binaries

    if binaries() is None:
        pytest.fail("PostgreSQL missing (initdb, pg_ctl): run `make postgres` (Debian's postgresql)")


@pytest.fixture
def postgres(postgres_binaries):
    """A fresh PostgreSQL on 127.0.0.1 for one test; ``.catalog`` is its SPECTRACE_LAKE."""
    from spectrace.testing.postgres import PostgresServer

    with PostgresServer() as server:
        yield server


@pytest.fixture(scope="session")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("spectrace")


@pytest.fixture(scope="session")
def cache_root(scratch) -> Path:
    """One VLLM_CACHE_ROOT for the session: vLLM inspects each architecture once."""
    path = Path(os.environ.get("SPECTRACE_TEST_VLLM_CACHE", scratch / "vllm-cache"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def zoo(tmp_path_factory) -> dict[str, str]:
    from spectrace.testing.models import build_zoo

    root = Path(os.environ.get("SPECTRACE_TEST_ZOO", tmp_path_factory.mktemp("zoo") / "models"))
    return {name: str(path) for name, path in build_zoo(root).items()}


@pytest.fixture(scope="session")
def traced_methods(zoo, scratch, cache_root):
    """Every CPU method, traced, in one single-process child (several runs, one process)."""
    store = scratch / "methods-store"
    results = run_engines(method_specs(zoo), store=store, cache_root=cache_root, log_file=scratch / "methods.log")
    return store, results


@pytest.fixture(scope="session")
def untraced_methods(zoo, scratch, cache_root):
    """The same engines with SPECTRACE unset: the baseline tokens."""
    return run_engines(method_specs(zoo), store=None, traced=False, cache_root=cache_root, scratch=scratch)


@pytest.fixture(scope="session")
def audit_runs(zoo, scratch, cache_root):
    """DFlash drafters declared in the shapes of the config-audit table, served live.

    Returns (store connection, results by name, drafter path by name).
    """
    from spectrace.testing.models import build_dflash

    root = scratch / "audit-models"
    target = zoo["target"]
    drafters = {
        # the seed's shape: a window declared, use_sliding_window absent
        "window_only": dict(sliding_window=WINDOW),
        "layer_types_no_flag": dict(layer_types=["sliding_attention"], sliding_window=WINDOW),
        "flagged": dict(layer_types=["sliding_attention"], sliding_window=WINDOW, use_sliding_window=True),
        "swa_window_size": dict(layer_types=["sliding_attention"], swa_window_size=WINDOW),
    }
    specs = []
    paths = {}
    for name, declared in drafters.items():
        path = paths[name] = build_dflash(root / f"dflash-{name}", target_dir=target, **declared)
        specs.append(EngineSpec(name=name, target=target, max_tokens=8, prompts=["the quick brown fox"],
                                speculative={"method": "dflash", "model": str(path), "num_speculative_tokens": 3}))
    # a DFlash drafter in a directory without "dflash" in its name, no method given
    plain = root / "drafter-plain"
    if not plain.exists():
        shutil.copytree(zoo["dflash"], plain)
    paths["no_method"] = plain
    specs.append(EngineSpec(name="no_method", target=target, max_tokens=8, prompts=["the quick brown fox"],
                            speculative={"model": str(plain), "num_speculative_tokens": 3}))
    store = scratch / "audit-store"
    results = run_engines(specs, store=store, cache_root=cache_root, log_file=scratch / "audit.log")
    return spectrace.store.open(store), results, paths


@pytest.fixture(scope="session")
def tap_runs(zoo, scratch, cache_root):
    """EAGLE3 with and without declared ids, and a DFlash drafter declaring top-level
    target_layer_ids (which the V1 runner ignores), served live. Returns (con, results, paths)."""
    from spectrace.testing.models import build_dflash

    root = scratch / "tap-models"
    top_level = build_dflash(root / "dflash-top-level-ids", target_dir=zoo["target"], top_level_target_layer_ids=[0, 3, 6])

    def spec(name, method, model):
        return EngineSpec(name=name, target=zoo["target"], max_tokens=8, prompts=["the quick brown fox"],
                          speculative={"method": method, "model": str(model), "num_speculative_tokens": 3})

    paths = {"eagle3_ids": zoo["eagle3"], "eagle3_noids": zoo["eagle3_noids"], "dflash_top_level": str(top_level)}
    specs = [
        spec("eagle3_ids", "eagle3", zoo["eagle3"]),
        spec("eagle3_noids", "eagle3", zoo["eagle3_noids"]),
        spec("dflash_top_level", "dflash", top_level),
    ]
    store = scratch / "taps-store"
    results = run_engines(specs, store=store, cache_root=cache_root, log_file=scratch / "taps.log")
    return spectrace.store.open(store), results, paths
