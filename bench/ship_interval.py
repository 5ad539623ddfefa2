"""Two ship intervals paired in one process: what each costs the stand-in engine's step, its GIL and its cores.

    .venv/bin/python -m bench.ship_interval                         # 256 x 50, 0.1 against 0.25 s, 24 pairs (~2 min)
    .venv/bin/python -m bench.ship_interval --intervals 0.1 0.5 --pairs 32 --name ship_interval-0.5

Method. bench/gpu_rates.py's stand-in engine (a GIL-bound Python thread paced to ``rate`` steps/s around spectrace's
real hooks, vLLM's own dataclasses) runs in the shipped shape (``SPECTRACE_PIPELINE=process``: the real shipper and
a real pipeline process), traced throughout. Between windows of ``--window`` seconds the shipper's interval (the
shipper's ``settings.ship_interval_s``, ``SPECTRACE_SHIP_INTERVAL``; read at each of its wakes) switches between the
two values, in the order A B, B A, ... (ABBA): both conditions share one process, one pipeline process, one heap and
the machine's drift, where alternating whole jobs (bench/gpu_rates.py --ship-interval) compare two processes each.
Per window, as gpu_rates: the engine's step time (from when it was due to the end of its work), its thread's CPU and
its wait for a core (schedstat), the GIL wait (step time minus those two), every other thread of the process (the
background: the shipper), the pipeline process's CPU, and the shipper's own thread CPU. Each pair gives B over A
(step time, a ratio) and B minus A (the rest); the result is their mean (geometric for the ratio) with a 95 % t
interval. The first window after a switch carries up to one wait of the old interval: a 2 s window holds 8-20 wakes,
so it shifts a window's figures by at most one message. Results: bench/results/ship_interval[-NAME].json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import threading
import time
from dataclasses import replace

from bench.ab_windows import summary
from bench.common import SCRATCH, freeze_heap, loadavg, write_result
from bench.gpu_rates import Engine, _proc_cpu_s, _thread_sched, mean_ci, settings_for, split, start_runtime


def measure(args) -> list[dict]:
    from spectrace.recorder import runtime
    from spectrace.recorder.verify import VerifyCapture

    store = SCRATCH / "ship_interval" / "store"
    shutil.rmtree(store.parent, ignore_errors=True)
    store.mkdir(parents=True)
    engine = Engine(args.batch, args.k, args.rate, args.busy, args.lifetime)
    rt = start_runtime(replace(settings_for(store), pipeline="process", ship_interval_s=args.intervals[0]),
                       VerifyCapture, "bench-ship-interval")
    shipper = rt.pipeline.shipper
    windows = []
    try:
        if shipper.proc is None:
            raise SystemExit("ship_interval: the pipeline process did not start (see the log line above)")
        child = shipper.proc.pid
        runtime.pause()
        engine.calibrate(args.busy)
        runtime.resume()
        engine.run(args.warmup)
        tid = threading.get_native_id()
        for pair in range(args.pairs):
            order = (0, 1) if pair % 2 == 0 else (1, 0)
            for which in order:
                shipper.settings = replace(shipper.settings, ship_interval_s=args.intervals[which])
                cpu0, main0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
                child0, delay0 = _proc_cpu_s(child), _thread_sched(tid)[1]
                ship0, messages0 = shipper.ship_cpu_ns, shipper.messages
                steps = engine.run(args.window)
                wall = time.perf_counter() - wall0
                cpu, main = time.process_time() - cpu0, time.thread_time() - main0
                windows.append({
                    "pair": pair, "interval_s": args.intervals[which], "steps": len(steps), "wall_s": wall,
                    "step_s_sum": sum(steps), "engine_thread_cpu_s": main,
                    "engine_thread_run_delay_s": _thread_sched(tid)[1] - delay0,
                    "background_cpu_s": cpu - main, "pipeline_process_cpu_s": _proc_cpu_s(child) - child0,
                    "ship_cpu_s": (shipper.ship_cpu_ns - ship0) / 1e9, "messages": shipper.messages - messages0,
                })
            if (pair + 1) % 4 == 0:
                print(f"  {pair + 1} of {args.pairs} pairs", flush=True)
    finally:
        runtime.stop()
    return windows


def analyse(windows: list[dict], intervals: list[float]) -> dict:
    """B against A, pair by pair (module docstring)."""
    a_s, b_s = intervals
    by_pair: dict[int, dict[float, dict]] = {}
    for w in windows:
        by_pair.setdefault(w["pair"], {})[w["interval_s"]] = w
    pairs = [(p[a_s], p[b_s]) for p in by_pair.values() if a_s in p and b_s in p]

    def per_step_ms(w: dict) -> dict:  # gpu_rates' split of a step, and the shipper's CPU a step (µs)
        return {**split(w), "ship_cpu_us": w["ship_cpu_s"] / w["steps"] * 1e6}

    def share(w: dict, key: str) -> float:
        return w[key] / w["wall_s"]

    def each(fn) -> dict:
        return {str(s): statistics.fmean(fn(w) for w in windows if w["interval_s"] == s) for s in intervals}

    def ratio(key: str) -> dict:
        out = summary([per_step_ms(b)[key] / per_step_ms(a)[key] for a, b in pairs])
        return {"change": out["ratio"] - 1, "ci95": [out["ci95"][0] - 1, out["ci95"][1] - 1], "pairs": out["pairs"]}

    keys = ("step", "cpu", "core_wait", "gil_wait", "ship_cpu_us")
    return {
        "pairs": len(pairs),
        "step_change": ratio("step"),
        "step_without_core_wait_change": ratio("step_without_core_wait"),
        "per_step_ms": {key: each(lambda w, key=key: per_step_ms(w)[key]) for key in keys},
        "per_step_ms_b_minus_a": {key: mean_ci([per_step_ms(b)[key] - per_step_ms(a)[key] for a, b in pairs])
                                  for key in keys},
        "background_core": each(lambda w: share(w, "background_cpu_s")),
        "background_core_b_minus_a": mean_ci([share(b, "background_cpu_s") - share(a, "background_cpu_s") for a, b in pairs]),
        "pipeline_core": each(lambda w: share(w, "pipeline_process_cpu_s")),
        "pipeline_core_b_minus_a": mean_ci([share(b, "pipeline_process_cpu_s") - share(a, "pipeline_process_cpu_s")
                                            for a, b in pairs]),
        "messages_per_s": each(lambda w: w["messages"] / w["wall_s"]),
    }


def _ci(d: dict, scale: float, unit: str) -> str:
    return f"{d['mean'] * scale:+.2f}{unit} ({d['ci95'][0] * scale:+.2f} … {d['ci95'][1] * scale:+.2f})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intervals", nargs=2, type=float, default=[0.1, 0.25], metavar=("A", "B"),
                        help="the two ship intervals, seconds (default 0.1 0.25)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rate", type=float, default=50.0, help="steps a second")
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--busy", type=float, default=0.5, help="the engine thread's own work, share of the step period")
    parser.add_argument("--lifetime", type=int, default=150, help="mean request lifetime in steps")
    parser.add_argument("--window", type=float, default=2.0, help="seconds a window")
    parser.add_argument("--pairs", type=int, default=24)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--name", default="ship_interval", help="results file bench/results/<name>.json")
    args = parser.parse_args(argv)
    if not all(0.01 <= s <= 60 for s in args.intervals) or args.intervals[0] == args.intervals[1]:
        parser.error("--intervals takes two different values, seconds, 0.01 to 60 (SPECTRACE_SHIP_INTERVAL's range)")
    if args.pairs < 2 or args.batch < 1 or args.rate <= 0 or args.window <= 0 or not 0 < args.busy < 1:
        parser.error("--pairs at least 2, --batch, --rate and --window positive, --busy between 0 and 1")
    for key in [k for k in os.environ if k.startswith("SPECTRACE")]:
        del os.environ[key]  # only the Settings built here count
    import vllm.v1.core.sched.output  # noqa: F401  (the stand-in's dataclasses; before the heap is frozen)
    import vllm.v1.outputs  # noqa: F401

    freeze_heap()
    a_s, b_s = args.intervals
    print(f"{args.batch} x {args.rate:g} steps/s, k {args.k}: ship interval {a_s:g} s against {b_s:g} s, "
          f"{args.pairs} pairs of {args.window:g} s windows ...", flush=True)
    load = loadavg()
    windows = measure(args)
    a = analyse(windows, args.intervals)
    path = write_result(args.name, {"settings": vars(args), "analysis": a, "load_before": load,
                                    "load_after": loadavg(), "windows": windows})
    ms = a["per_step_ms"]
    print(f"step {ms['step'][str(a_s)]:.2f} -> {ms['step'][str(b_s)]:.2f} ms: "
          f"{_ci({'mean': a['step_change']['change'], 'ci95': a['step_change']['ci95']}, 100, ' %')}; "
          f"without core waits {_ci({'mean': a['step_without_core_wait_change']['change'], 'ci95': a['step_without_core_wait_change']['ci95']}, 100, ' %')}")
    d = a["per_step_ms_b_minus_a"]
    print(f"per step: GIL wait {_ci(d['gil_wait'], 1e3, ' µs')}, engine thread CPU {_ci(d['cpu'], 1e3, ' µs')}, "
          f"core wait {_ci(d['core_wait'], 1e3, ' µs')}; shipper {ms['ship_cpu_us'][str(a_s)]:.0f} -> "
          f"{ms['ship_cpu_us'][str(b_s)]:.0f} µs ({_ci(d['ship_cpu_us'], 1, ' µs')})")
    rates = a["messages_per_s"]
    print(f"messages a second: {rates[str(a_s)]:.1f} at {a_s:g} s, {rates[str(b_s)]:.1f} at {b_s:g} s")
    if (rates[str(b_s)] - rates[str(a_s)]) * (b_s - a_s) >= 0:  # the longer interval must send fewer
        print("ship_interval: the shipper's message rate did not follow its interval (does Shipper._loop still read "
              "its settings' ship_interval_s at each wake?): the two conditions were not what they say", file=sys.stderr)
        return 1
    bg, pipe = a["background_core"], a["pipeline_core"]
    print(f"background {bg[str(a_s)] * 100:.2f} -> {bg[str(b_s)] * 100:.2f} % of a core "
          f"({_ci(a['background_core_b_minus_a'], 100, ' points')}); pipeline process {pipe[str(a_s)] * 100:.2f} -> "
          f"{pipe[str(b_s)] * 100:.2f} % ({_ci(a['pipeline_core_b_minus_a'], 100, ' points')}); wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
