"""Shared fixtures: the tiny model zoo and real vLLM engine runs.

Every engine run is real vLLM 0.32 on CPU in a child process (plugins load
per process). Engines that tests share are started once per session.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import spectrace.store
from spectrace.testing.engine import EngineSpec, method_specs, run_engines
from spectrace.testing.models import build_dflash, build_zoo

WINDOW = 64

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
