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
import sys
from pathlib import Path

from bench.ab_windows import summary
from bench.common import REPO, base_checkout, loadavg, run_in_checkout, write_result

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
    got = run_in_checkout(checkout, CHILD, [name, json.dumps(batches)], "drain_pair", name)
    return {int(k): v for k, v in got.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    args = parser.parse_args(argv)
    rounds = []
    load = loadavg()
    with base_checkout(args.base, "drain-pair-checkout", "drain_pair") as base:
        for i in range(args.rounds):
            order = ("base", "new") if i % 2 == 0 else ("new", "base")
            got = {name: run(base if name == "base" else REPO, name, args.batches) for name in order}
            rounds.append(got)
            print(f"round {i + 1}: " + "  ".join(
                f"B={b}: base {got['base'][b]:.0f} µs, new {got['new'][b]:.0f} µs" for b in args.batches), flush=True)
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
