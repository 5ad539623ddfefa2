"""The per-step hooks' cost on vLLM's threads, this checkout against another commit, paired on one machine.

    .venv/bin/python -m bench.hook_pair --base 4f2f14d               # batch 16, 64, 256 at k 5, 8 rounds
    .venv/bin/python -m bench.hook_pair --base 4f2f14d --rounds 4 --batches 256

What it answers: what the hooks added since ``--base`` cost a step on the engine's thread (issue #36 added, per
engine-core step, the finished-request check, the host clock around ``Scheduler.schedule`` and
``update_from_output`` with one ``HostStep`` appended, and per frontend step the clock around
``OutputProcessor.process_outputs``).

Method. ``git worktree add`` checks the base commit out beside this one (under the bench scratch folder). Each
round runs, in a fresh process of each checkout, bench/hotpath.py's ``measure`` (the real engine-core hook around a
no-op ``update_from_output`` on vLLM's own dataclasses, traced minus bare, µs a step, the median of its
repetitions) and, where the checkout has them, the ``Scheduler.schedule`` and ``process_outputs`` hooks around
no-ops the same way; rounds ordered base/new, new/base, ... (ABBA), so the machine's drift hits both alike. Each
round gives new minus base per batch size (engine core: its two hooks; frontend: its one); the result is the mean
difference with a 95 % t interval over the rounds. Results: bench/results/hook_pair.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from bench.ab_windows import t95
from bench.common import REPO, base_checkout, loadavg, run_in_checkout, write_result

CHILD = """
import json, shutil, statistics, sys, time
from types import SimpleNamespace
from bench.common import SCRATCH
from bench.hotpath import active_runtime, build_inputs, measure
import vllm.v1.core.sched.scheduler  # noqa: F401
from spectrace.recorder.verify import hooks
store = SCRATCH / ("hook-pair-store-" + sys.argv[1])
shutil.rmtree(store, ignore_errors=True)
rt = active_runtime(store)
build_inputs(1, 1)
N = 2000

def per_call(bare, traced, *args):
    samples = []
    for rep in range(9):
        t0 = time.perf_counter_ns()
        for _ in range(N):
            bare(*args)
        t1 = time.perf_counter_ns()
        for _ in range(N):
            traced(*args)
        t2 = time.perf_counter_ns()
        samples.append(((t2 - t1) - (t1 - t0)) / N / 1e3)
        rt.verify.host_steps.clear() if hasattr(rt.verify, "host_steps") else None
    return statistics.median(samples)

out = {}
for batch in json.loads(sys.argv[2]):
    engine = measure(batch, 5, reps=9, n=N, rt=rt)["engine_hook"]["median"]
    schedule = frontend = 0.0
    if hasattr(hooks, "wrap_schedule"):
        noop = lambda self, *a, **kw: None
        schedule = per_call(noop, hooks.wrap_schedule(noop, "engine_core.schedule"), SimpleNamespace())
        outputs = [SimpleNamespace(new_token_ids=[1, 2]) for _ in range(batch)]
        frontend = per_call(noop, hooks.wrap_process_outputs(noop, "frontend.process_outputs"), None, outputs, 1.0)
    out[batch] = {"engine_core": engine + schedule, "frontend": frontend}
print("RESULT " + json.dumps(out))
"""


def run(checkout: Path, name: str, batches: list[int]) -> dict[int, dict[str, float]]:
    got = run_in_checkout(checkout, CHILD, [name, json.dumps(batches)], "hook_pair", name)
    return {int(k): v for k, v in got.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    args = parser.parse_args(argv)
    load_before = loadavg()
    diffs: dict[int, dict[str, list[float]]] = {b: {"engine_core": [], "frontend": []} for b in args.batches}
    with base_checkout(args.base, "hook-pair-base", "hook_pair") as base:
        for rnd in range(args.rounds):
            order = [("base", base), ("new", REPO)] if rnd % 2 == 0 else [("new", REPO), ("base", base)]
            got = {name: run(checkout, name, args.batches) for name, checkout in order}
            for b in args.batches:
                for role in ("engine_core", "frontend"):
                    diffs[b][role].append(got["new"][b][role] - got["base"][b][role])
            print("round", rnd, {b: {r: round(v[-1], 3) for r, v in d.items()} for b, d in diffs.items()}, flush=True)
    result = {}
    for b, d in diffs.items():
        result[b] = {}
        for role, xs in d.items():
            mean = statistics.fmean(xs)
            half = t95(len(xs) - 1) * statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else None
            result[b][role] = {"added_us_per_step": round(mean, 3),
                               "ci95": [round(mean - half, 3), round(mean + half, 3)] if half is not None else None}
        print(f"batch {b}: engine core +{result[b]['engine_core']['added_us_per_step']} µs/step "
              f"{result[b]['engine_core']['ci95']}, frontend +{result[b]['frontend']['added_us_per_step']} µs/step "
              f"{result[b]['frontend']['ci95']}")
    path = write_result("hook_pair", {"base": args.base, "rounds": args.rounds, "k": 5, "load": [load_before, loadavg()],
                                      "result": result})
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
