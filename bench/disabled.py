"""Disabled: with SPECTRACE unset, spectrace costs nothing measurable, because nothing is patched.

    env -u SPECTRACE .venv/bin/python -m bench.disabled

In a fresh process without SPECTRACE: load vLLM's general plugins the way every vLLM process
does (``vllm.plugins.load_general_plugins``), then check that spectrace's plugin ran, imported
nothing beyond ``spectrace.plugin`` and left every hook target as vLLM's own function (no
a wrapper whose code is spectrace's, same code object as a reference process with ``VLLM_PLUGINS`` set
to exclude spectrace). Also times ``register()`` itself (once per vLLM process). The decode
throughput of such a process is the "off" column of bench/e2e.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import timeit

from bench.common import REPO, loadavg, write_result


TARGETS_CODE = r"""
import json, sys, time
before = set(sys.modules)
t0 = time.perf_counter()
from vllm.plugins import load_general_plugins
load_general_plugins()
plugin_s = time.perf_counter() - t0
loaded = sorted(m for m in set(sys.modules) - before if m.startswith("spectrace"))
# read the hook targets without installing anything (stages only builds Hook records)
from spectrace.recorder.hooks import resolve
from spectrace.recorder import stages
out = {"spectrace_modules_after_plugins": loaded, "targets": {}}
for hook in stages.all_hooks():
    try:
        owner, attr, value = resolve(hook.target)
    except Exception as exc:
        out["targets"][hook.name] = {"missing": str(exc)}
        continue
    func = getattr(value, "__func__", value)
    code = getattr(func, "__code__", None)
    out["targets"][hook.name] = {
        "patched": code is not None and "/spectrace/" in code.co_filename,  # a spectrace wrapper
        "module": getattr(func, "__module__", None),
        "code": f"{code.co_filename}:{code.co_firstlineno}" if code else None,
    }
print(json.dumps(out))
"""


def probe(env_extra: dict[str, str | None]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    for key, value in env_extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    proc = subprocess.run([sys.executable, "-c", TARGETS_CODE], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    load_before = loadavg()
    os.environ.pop("SPECTRACE", None)
    from spectrace import plugin

    n = 200_000
    register_s = min(timeit.repeat(plugin.register, number=n, repeat=5)) / n
    unset = probe({"SPECTRACE": None})
    reference = probe({"SPECTRACE": None, "VLLM_PLUGINS": "none-but-not-spectrace"})
    identical = all(
        unset["targets"][name].get("code") == reference["targets"][name].get("code")
        and not unset["targets"][name].get("patched")
        for name in unset["targets"]
    )
    result = {
        "register_ns_when_unset": register_s * 1e9,
        "spectrace_modules_imported_by_plugin": unset["spectrace_modules_after_plugins"],
        "reference_modules_imported": reference["spectrace_modules_after_plugins"],
        "hook_targets": unset["targets"],
        "all_targets_are_vllm_originals": identical,
        "load_before": load_before,
        "load_after": loadavg(),
        "goal": {"met_nothing_patched": identical and "spectrace.recorder.runtime"
                 not in unset["spectrace_modules_after_plugins"]},
    }
    print(f"register() with SPECTRACE unset: {register_s * 1e9:.0f} ns once per process; modules imported by the "
          f"plugin: {unset['spectrace_modules_after_plugins']}; hook targets untouched: {identical} "
          f"({len(unset['targets'])} targets)", flush=True)
    write_result("disabled", result)
    return result


if __name__ == "__main__":
    main()
