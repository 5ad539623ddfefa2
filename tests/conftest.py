"""Shared fixtures: the tiny model zoo and real vLLM engine runs.

Every engine run is real vLLM 0.32 on CPU in a child process (plugins load
per process). Engines that tests share are started once per session.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spectrace.testing.engine import K, method_specs, run_engines
from spectrace.testing.models import build_zoo

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
