"""Run every benchmark, each in its own process, then refresh the benchmark notebook's generated block.

    make bench                                  # = .venv/bin/python -m bench.run_all
    .venv/bin/python -m bench.run_all --quick   # a smoke run (about 4 minutes)
    .venv/bin/python -m bench.run_all --only hotpath store

Writes bench/results/<name>.json per benchmark and bench/results/run_all.json, then renders
the generated block of docs/benchmarks/history.md (bench/report.py). About 10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from bench.common import REPO, loadavg, write_result

STEPS = [
    ("disabled", "bench.disabled"),
    ("hotpath", "bench.hotpath"),
    ("store", "bench.store"),
    ("week", "bench.week"),
    ("e2e", "bench.e2e"),
    ("ab_windows", "bench.ab_windows"),
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="*", choices=[name for name, _ in STEPS])
    args = parser.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}  # benchmarks set it themselves
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    started = time.time()
    steps = []
    for name, module in STEPS:
        if args.only and name not in args.only:
            continue
        cmd = [sys.executable, "-m", module] + (["--quick"] if args.quick and name != "disabled" else [])
        load = loadavg()
        print(f"== {name}: {' '.join(cmd[1:])}  (load {load})", flush=True)
        t0 = time.time()
        rc = subprocess.run(cmd, cwd=REPO, env=env).returncode
        steps.append({"name": name, "command": " ".join(cmd[1:]), "rc": rc, "seconds": time.time() - t0,
                      "load_before": load, "load_after": loadavg()})
        print(f"== {name}: rc {rc}, {time.time() - t0:.0f} s", flush=True)
    write_result("run_all", {"seconds": time.time() - started, "quick": args.quick, "steps": steps})
    subprocess.run([sys.executable, "-m", "bench.report"], cwd=REPO, env=env, check=False)
    print(f"all benchmarks: {time.time() - started:.0f} s", flush=True)
    return 0 if all(s["rc"] == 0 for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
