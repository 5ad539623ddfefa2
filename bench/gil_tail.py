"""The engine thread's per-step wait beside a pipeline process at its engine's priority and at nice +10.

    .venv/bin/python -m bench.gil_tail                      # 512 x 100, 6 pairs of 25 s runs (~8 min)
    .venv/bin/python -m bench.gil_tail --point 256x50 --pairs 4

Method. Each run, in a fresh process: bench/gpu_rates.py's GIL-bound stand-in engine (its hooks real) traced in
the shipped shape (``SPECTRACE_PIPELINE=process``: the real shipper and pipeline process), the pipeline process
reniced by the increment (``os.setpriority``; spectrace does not renice it: this measured whether it should),
calibrated untraced, 3 s of warm-up, then ``--seconds`` of paced steps. Per step: its wall time minus the engine
thread's CPU in it (``thread_time``) -- what the thread spent not running: waiting for the GIL, and for a core
(both count here; bench/gpu_rates.py splits the core wait off per window). Runs alternate nice 0 and the other
value (ABBA), so the machine's drift hits both; the result is the mean paired difference of the per-step means
with a 95 % t interval, and each run's tail (p90, p99, steps over 1 and 3 ms). No untraced baseline:
bench/gpu_rates.py measures the cost against tracing paused. Results:
bench/results/gil_tail[-POINT].json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time

from bench.common import REPO, SCRATCH, freeze_heap, loadavg, run_in_checkout, write_result
from bench.gpu_rates import mean_ci

CHILD = "import sys\nfrom bench.gil_tail import main\nsys.exit(main(sys.argv[1:]))"  # one run, in a fresh process


def one_run(batch: int, rate: float, seconds: float, nice: int) -> dict:
    """One traced run of the stand-in engine in this process; the per-step waits' summary."""
    from dataclasses import replace

    import numpy as np

    from bench import gpu_rates
    from spectrace.recorder import runtime
    from spectrace.recorder.verify import VerifyCapture

    freeze_heap()
    store = SCRATCH / "gil_tail" / f"store-{nice}"
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    engine = gpu_rates.Engine(batch, 7, rate, 0.5, 150)
    settings = replace(gpu_rates.settings_for(store), pipeline="process")
    rt = gpu_rates.start_runtime(settings, VerifyCapture, f"gil-tail-{nice}")
    if nice:  # the pipeline process below the engine's priority (spectrace itself does not renice it)
        os.setpriority(os.PRIO_PROCESS, rt.pipeline.shipper.proc.pid, os.getpriority(os.PRIO_PROCESS, 0) + nice)
    runtime.pause()
    engine.calibrate(0.5)
    runtime.resume()
    engine.run(3.0)
    waits: list[float] = []
    step = engine.step

    def timed_step() -> None:
        cpu, wall = time.thread_time(), time.perf_counter()
        step()
        waits.append((time.perf_counter() - wall) - (time.thread_time() - cpu))

    engine.step = timed_step
    engine.run(seconds)
    runtime.stop()
    ms = np.array(waits) * 1e3
    return {"nice": nice, "steps": len(ms), "mean_ms": float(ms.mean()), "p50_ms": float(np.median(ms)),
            "p90_ms": float(np.percentile(ms, 90)), "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max()),
            "over_1ms": int((ms > 1).sum()), "over_3ms": int((ms > 3).sum())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--point", default="512x100", help="BATCHxSTEPS_PER_S (default 512x100)")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=25.0, help="timed seconds a run")
    parser.add_argument("--nice", type=int, default=10, help="the increment set against 0 (default 10)")
    parser.add_argument("--run", type=int, help=argparse.SUPPRESS)  # a child: one run at this nice increment
    args = parser.parse_args(argv)
    try:
        batch_text, rate_text = args.point.lower().split("x")
        batch, rate = int(batch_text), float(rate_text)
    except ValueError:
        parser.error(f"--point {args.point!r} is not BATCHxSTEPS_PER_S (like 512x100)")
    if batch < 1 or not 0 < rate <= 1000:
        parser.error("--point: a batch >= 1 and 0 < steps/s <= 1000")
    if args.pairs < 2:
        parser.error("--pairs must be at least 2 (an interval needs two pairs)")
    if not 0 < args.nice <= 19 or args.seconds <= 0:
        parser.error("--nice is 1 to 19 and --seconds above 0")
    if args.run is not None:
        print("RESULT " + json.dumps(one_run(batch, rate, args.seconds, args.run)))
        return 0
    runs: dict[int, list[dict]] = {0: [], args.nice: []}
    load_before = loadavg()
    for i in range(args.pairs):
        for nice in ((0, args.nice) if i % 2 == 0 else (args.nice, 0)):
            runs[nice].append(run_in_checkout(REPO, CHILD, ["--point", args.point, "--seconds", str(args.seconds),
                                                           "--run", str(nice)], "gil_tail", f"nice {nice}"))
        print(f"pair {i + 1}/{args.pairs}: per-step wait nice 0 {runs[0][-1]['mean_ms']:.3f} ms, "
              f"nice {args.nice} {runs[args.nice][-1]['mean_ms']:.3f} ms", flush=True)
    difference = mean_ci([b["mean_ms"] - a["mean_ms"] for a, b in zip(runs[0], runs[args.nice])])
    mean, (low, high) = difference["mean"], difference["ci95"]
    result = {"batch": batch, "rate": rate, "k": 7, "seconds": args.seconds, "pairs": args.pairs,
              "mean_ms": {str(n): statistics.fmean(r["mean_ms"] for r in rs) for n, rs in runs.items()},
              "nice_minus_0_ms": difference,
              "runs": {str(n): rs for n, rs in runs.items()}, "load_before": load_before, "load_after": loadavg()}
    name = "gil_tail" if args.point == "512x100" else f"gil_tail-{args.point}"
    written = write_result(name, result)
    print(f"engine thread's per-step wait at {args.point}, traced: nice 0 {result['mean_ms']['0']:.3f} ms, "
          f"nice {args.nice} {result['mean_ms'][str(args.nice)]:.3f} ms; difference {mean:+.3f} ms "
          f"({low:+.3f} … {high:+.3f}, {args.pairs} pairs)")
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
