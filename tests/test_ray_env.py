"""vLLM's own rule for what reaches Ray workers (``vllm.ray.ray_env.get_env_vars_to_copy``), with the
plugin loaded as vLLM loads it (``load_general_plugins``): with ``SPECTRACE=1`` the spectrace and OTel
variables in force are copied, next to the user's own extra prefixes; with tracing off, none are
(the plugin patches nothing). One fresh interpreter per case: vLLM loads plugins once per process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.vllm  # imports vLLM

PROBE = """
import json, os
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.ray.ray_env import get_env_vars_to_copy
print(json.dumps(sorted(v for v in get_env_vars_to_copy() if v in os.environ)))
"""

IN_FORCE = {
    "SPECTRACE_EXPORTER": "duckdb,otlp", "SPECTRACE_HOST": "node-0", "SPECTRACE_ACTIVE_RUN": "20261202T000000Z-abcdef;",
    "OTEL_SERVICE_NAME": "vllm-fleet", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
    "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY": "MYCO_", "MYCO_TOKEN_BUDGET": "1",
}


def copied(tmp_path, **env: str) -> list[str]:
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith(("SPECTRACE", "OTEL_", "VLLM_"))}
    base.update(SPECTRACE_DIR=str(tmp_path / "store"), VLLM_CONFIG_ROOT=str(tmp_path / "config"), **IN_FORCE, **env)
    proc = subprocess.run([sys.executable, "-c", PROBE], env=base, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_tracing_on_spectrace_and_otel_variables_reach_ray_workers(tmp_path):
    names = copied(tmp_path, SPECTRACE="1")
    for name in ["SPECTRACE", "SPECTRACE_DIR", *IN_FORCE]:
        assert name in names, name
    assert "MYCO_TOKEN_BUDGET" in names  # the user's own prefix still applies: added to, never replaced


def test_tracing_off_nothing_of_spectrace_is_copied(tmp_path):
    names = copied(tmp_path)
    assert not [n for n in names if n.startswith(("SPECTRACE", "OTEL_"))], names
    assert "MYCO_TOKEN_BUDGET" in names
