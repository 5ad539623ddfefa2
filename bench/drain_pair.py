"""The verification drain's CPU per step, this checkout against another commit, paired on one machine.

    .venv/bin/python -m bench.drain_pair --base 34ea018            # batch 16, 64, 256 at k 5, 8 rounds
    .venv/bin/python -m bench.drain_pair --base 34ea018 --rounds 4 --batches 256

Method. ``git worktree add`` checks the base commit out beside this one (under the bench scratch folder).
Each round runs bench/hotpath.py's drain measurement (``measure_drain``: 200 engine and worker steps
captured by the real hooks from vLLM's own dataclasses, then one ``VerifyCapture.drain``, wall time per step of
that one CPU-bound thread, the median of 5 drains) in a fresh process of each checkout, ordered base/new, new/base, ... (ABBA), so the
machine's drift hits both alike. Each round gives the ratio new/base per batch size; the result is their
geometric mean with a 95 % t interval (``bench.ab_windows.summary``). Results: bench/results/drain_pair.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from bench.ab_windows import summary
from bench.common import REPO, SCRATCH, loadavg, write_result

CHILD = """
import json, shutil, sys
from bench.common import SCRATCH
from bench.hotpath import active_runtime, build_inputs, measure_drain
import vllm.v1.core.sched.scheduler  # noqa: F401
store = SCRATCH / ("drain-pair-store-" + sys.argv[1])
shutil.rmtree(store, ignore_errors=True)
rt = active_runtime(store)
build_inputs(1, 1)
out = {}
for batch in json.loads(sys.argv[2]):
    d = measure_drain(batch, 5, steps=200, reps=5, rt=rt)
    out[batch] = d["drain_us_per_step"]["median"]
print("RESULT " + json.dumps(out))
"""


def run(checkout: Path, name: str, batches: list[int]) -> dict[int, float]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    env = {k: v for k, v in env.items() if not k.startswith("SPECTRACE")}
    proc = subprocess.run([sys.executable, "-c", CHILD, name, json.dumps(batches)], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=900)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"drain_pair: the {name} run failed:\n{proc.stderr[-2000:]}")
    return {int(k): v for k, v in json.loads(line[7:]).items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    args = parser.parse_args(argv)
    base = SCRATCH / "drain-pair-checkout"
    if base.exists():
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO, capture_output=True)
    made = subprocess.run(["git", "worktree", "add", "--detach", "-f", str(base), args.base], cwd=REPO,
                          capture_output=True, text=True)
    if made.returncode:
        print(f"drain_pair: cannot check {args.base} out: {made.stderr.strip()}", file=sys.stderr)
        return 2
    rounds = []
    load = loadavg()
    try:
        for i in range(args.rounds):
            order = ("base", "new") if i % 2 == 0 else ("new", "base")
            got = {name: run(base if name == "base" else REPO, name, args.batches) for name in order}
            rounds.append(got)
            print(f"round {i + 1}: " + "  ".join(
                f"B={b}: base {got['base'][b]:.0f} µs, new {got['new'][b]:.0f} µs" for b in args.batches), flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO, capture_output=True)
    by_batch = {}
    for b in args.batches:
        s = summary([r["new"][b] / r["base"][b] for r in rounds])
        by_batch[str(b)] = {**s, "base_us_per_step": sorted(r["base"][b] for r in rounds)[len(rounds) // 2],
                            "new_us_per_step": sorted(r["new"][b] for r in rounds)[len(rounds) // 2]}
        print(f"batch {b}: new/base {s['ratio']:.3f} (95 % CI {s['ci95'][0]:.3f}-{s['ci95'][1]:.3f}), "
              f"{1 / s['ratio']:.1f}x less CPU per step")
    path = write_result("drain_pair", {"base": args.base, "rounds": rounds, "by_batch": by_batch,
                                       "load_before": load, "load_after": loadavg()})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
