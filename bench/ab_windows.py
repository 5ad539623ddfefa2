"""What tracing costs the engine, resolved: one engine, tracing switched off and on in short windows.

    .venv/bin/python -m bench.ab_windows                     # batch 16 and 64, 200 pairs each (~35 min)
    .venv/bin/python -m bench.ab_windows --quick             # a smoke run
    .venv/bin/python -m bench.ab_windows --compact-interval 10   # compaction six times as often
    .venv/bin/python -m bench.ab_windows --flush-interval 1      # a SPECTRACE_FLUSH_INTERVAL other than the default

Method. One engine (a tiny Qwen3 target with itself as draft_model drafter, k 3, so every step
verifies a full batch of drafts) with spectrace's hooks installed, in one process (frontend,
engine core and worker; ``--pipeline``: ``auto``, the default, ships the records to a pipeline
process, ``thread`` runs the flush on a thread of this process, competing with the engine thread
for the GIL). The engine is kept full (requests topped up every step, ``ignore_eos``) and stepped
without pause. A window is a whole number of request lifetimes (``--cycles``: the requests
start and finish together, so a window of whole lifetimes holds the same prefills and the same
tokens whatever its phase; a window of fixed seconds did not, and that alone moved a pair by a
few per cent). One lifetime by default: the machine drifts on the scale of seconds (the throughput of
adjacent 3-9 s windows correlated 0.45-0.69 after the condition is taken out, ``drift_lag1`` in the results),
so short windows pair better than long ones. Every window tracing is switched with ``runtime.pause()`` (every hook returns at
once, the flush thread idles) and ``runtime.resume()``, in pairs ordered on/off, off/on, ...
(ABBA), so a slow drift of the machine hits both conditions alike. Each pair gives one ratio,
tokens/s traced over tokens/s untraced; the result is the geometric mean of the ratios with a
95 % confidence interval (t distribution over the log ratios). The store, its compaction
(``SPECTRACE_COMPACT_INTERVAL``, the production default unless ``--compact-interval``), the flush
(``SPECTRACE_FLUSH_INTERVAL``, the default unless ``--flush-interval``) and the Prometheus exposition
run as in production. The flush thread wakes every interval whether paused or not and skips its work
while paused, so the traced windows carry one flush per interval of their own time, as in production.
What the paused state still costs (the wrappers' call, ~0.2 µs a step) is measured apart in
bench/hotpath.py and bench/disabled.py; it is not in this ratio.

``--vllm-work`` also times vLLM's own host work on the engine thread, inside spectrace's wrappers (each function
in :data:`VLLM_WORK` is wrapped before the plugin installs its hooks, so the timer holds vLLM's code and none of
spectrace's): the engine thread's CPU in it per window, traced over paused, as a ratio with its CI like the
throughput's, and each function's per-call median. This is the figure that says whether spectrace's hooks slow vLLM's
own code (BENCHMARKS.md, "vLLM's own host work, traced against paused"), where bench/gpu_rates.py's stand-in loop
read ~2.5 % slower traced. On a GPU host, ``--async-scheduling on|off`` and ``--runner v1|v2`` pick what only the
CUDA build runs (vLLM's CPU platform turns async scheduling off; the results record what vLLM resolved). It also
counts the cyclic collector's runs and CPU on the engine thread and on the others (``gc.callbacks``): a collection runs
on the thread whose allocation crosses the threshold, so tracing can move the collector's work onto the engine thread
without adding any (BENCHMARKS.md, "The CPU engine in either shape").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import REPO, SCRATCH, loadavg, write_result

T95 = {5: 2.571, 10: 2.228, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t95(df: int) -> float:
    for n in sorted(T95):
        if df <= n:
            return T95[n]
    return 1.96


def mean_ci(xs: list[float]) -> dict:
    """The mean of paired differences with its 95 % t interval."""
    if len(xs) < 2:
        return {"mean": xs[0] if xs else None, "ci95": None}
    m = statistics.fmean(xs)
    half = t95(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return {"mean": m, "ci95": [m - half, m + half]}


def summary(ratios: list[float]) -> dict:
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else float("inf")
    return {
        "pairs": len(ratios),
        "ratio": math.exp(mean),
        "ci95": [math.exp(mean - half), math.exp(mean + half)],
        "half_width": (math.exp(mean + half) - math.exp(mean - half)) / 2,
        "median": statistics.median(ratios),
    }


# --vllm-work: vLLM's host-side Python of a step, on the engine thread (the engine core's scheduling and output
# processing, the frontend's output processing, the model runner's bookkeeping of the sampled tokens)
VLLM_WORK = {
    "schedule": "vllm.v1.core.sched.scheduler:Scheduler.schedule",
    "update_from_output": "vllm.v1.core.sched.scheduler:Scheduler.update_from_output",
    "process_outputs": "vllm.v1.engine.output_processor:OutputProcessor.process_outputs",
    "bookkeeping_sync": "vllm.v1.worker.gpu_model_runner:GPUModelRunner._bookkeeping_sync",
}


def time_vllm_work() -> dict[str, list[int]]:
    """Wrap each of :data:`VLLM_WORK` in a timer of the calling thread's CPU (before spectrace wraps it: its wrapper
    then calls the timer, and the timer only vLLM's function). Returns label -> the calls' CPU, ns (cleared per window)."""
    import functools

    from spectrace.recorder.hooks import resolve

    calls: dict[str, list[int]] = {}
    for label, target in VLLM_WORK.items():
        owner, attr, original = resolve(target)  # the hooks' own "module:Class.name" lookup
        took = calls[label] = []

        def make(original=original, took=took):
            @functools.wraps(original)
            def timed(*args, **kwargs):
                started = time.thread_time_ns()
                try:
                    return original(*args, **kwargs)
                finally:
                    took.append(time.thread_time_ns() - started)

            return timed

        setattr(owner, attr, make())
    return calls


def count_collections() -> dict[str, list[int]]:
    """Count the cyclic collector's runs and their CPU by thread: the engine thread (the one calling this) and the
    others (the flush thread, the shipper). A collection runs on whichever thread's allocation crosses the threshold,
    so tracing can move the collector's work onto the engine thread without adding any. Returns where -> [runs of
    generation 0, 1, 2, then their CPU in ns] (cleared per window)."""
    import gc
    import threading

    engine_thread = threading.get_ident()
    counts = {"engine": [0] * 6, "other": [0] * 6}
    started: dict[int, int] = {}

    def on_collection(phase: str, info: dict) -> None:
        me = threading.get_ident()
        if phase == "start":
            started[me] = time.thread_time_ns()
            return
        slot = counts["engine" if me == engine_thread else "other"]
        slot[info["generation"]] += 1
        slot[3 + info["generation"]] += time.thread_time_ns() - started.pop(me, time.thread_time_ns())

    gc.callbacks.append(on_collection)
    return counts


def child(request: dict) -> None:
    from vllm import LLM, SamplingParams

    from spectrace.recorder import runtime

    batch, cycles, pairs = request["batch"], request["cycles"], request["pairs"]
    vllm_calls = time_vllm_work() if request.get("vllm_work") else None
    collections = count_collections() if request.get("vllm_work") else None
    extra = {} if request.get("async_scheduling") is None else {"async_scheduling": request["async_scheduling"]}
    llm = LLM(
        model=request["target"], tokenizer=request["target"], dtype="float32", enforce_eager=True,
        max_model_len=512, kv_cache_memory_bytes=(256 << 20) * max(1, batch // 64),  # all of a batch's requests fit
        disable_log_stats=False, seed=0,
        speculative_config={"method": "draft_model", "model": request["target"], "num_speculative_tokens": 3},
        max_num_seqs=batch, **extra,
    )
    engine = llm.llm_engine
    from vllm.platforms import current_platform

    resolved = {"device": current_platform.device_type,  # what vLLM made of the options, not what was asked
                "async_scheduling": bool(engine.vllm_config.scheduler_config.async_scheduling),
                "VLLM_USE_V2_MODEL_RUNNER": os.environ.get("VLLM_USE_V2_MODEL_RUNNER")}
    params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"], ignore_eos=True)
    prompts = ["the quick brown fox", "hello world speculative decoding", "a b c d e f g", "once upon a time"]
    seen: dict[str, int] = {}
    next_id = [0]

    def step_tokens() -> tuple[int, bool]:
        refilled = engine.get_num_unfinished_requests() < batch
        while engine.get_num_unfinished_requests() < batch:
            request_id = str(next_id[0])
            engine.add_request(request_id, prompts[next_id[0] % len(prompts)], params)
            next_id[0] += 1
        new = 0
        for out in engine.step():
            n = len(out.outputs[0].token_ids)
            new += n - seen.get(out.request_id, 0)
            if out.finished:
                seen.pop(out.request_id, None)
            else:
                seen[out.request_id] = n
        return new, refilled

    def run_window(traced: bool, steps: int) -> dict:
        (runtime.resume if traced else runtime.pause)()
        tokens = 0
        for took in (vllm_calls or {}).values():
            took.clear()
        for counted in (collections or {}).values():
            counted[:] = [0] * 6
        cpu0, main0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
        for _ in range(steps):
            tokens += step_tokens()[0]
        wall = time.perf_counter() - t0
        cpu, main = time.process_time() - cpu0, time.thread_time() - main0
        window = {"traced": traced, "tokens": tokens, "steps": steps, "wall_s": wall, "cpu_s": cpu,
                  "engine_thread_cpu_s": main, "background_cpu_s": cpu - main, "tokens_per_s": tokens / wall}
        if vllm_calls is not None:
            window["vllm_work"] = {label: {"cpu_s": sum(took) / 1e9, "calls": len(took),
                                           "call_us_p50": statistics.median(took) / 1e3 if took else None}
                                   for label, took in vllm_calls.items()}
        if collections is not None:
            window["collections"] = {where: list(counted) for where, counted in collections.items()}
        return window

    # warm up, and learn a request's lifetime in steps (the distance between refills)
    refills, step_no = [], 0
    warm_end = time.perf_counter() + request["warmup_s"]
    while time.perf_counter() < warm_end or len(refills) < 4:
        if step_tokens()[1]:
            refills.append(step_no)
        step_no += 1
    gaps = [b - a for a, b in zip(refills[1:], refills[2:])]
    lifetime = max(set(gaps), key=gaps.count)
    while not step_tokens()[1]:  # start on a refill
        pass
    windows = []
    for i in range(pairs):
        order = (True, False) if i % 2 == 0 else (False, True)
        windows += [dict(run_window(traced, cycles * lifetime), pair=i) for traced in order]
    runtime.resume()
    rt = runtime.get()
    sink = rt.pipeline.sink("duckdb") if rt else None
    compactions, dropped = getattr(sink, "compactions", None), rt.pipeline.dropped if rt else None
    if rt is not None and sink is None:  # the process shape: the store is the pipeline process's
        runtime.stop()  # its last flush, then its counters
        stats = rt.pipeline.stats()
        compactions, dropped = stats.get("duckdb", {}).get("compactions"), stats.get("dropped")
    out = {"windows": windows, "lifetime_steps": lifetime, "vllm": resolved, "compactions": compactions,
           "pipeline_shape": rt.settings.pipeline if rt else None,  # what SPECTRACE_PIPELINE resolved to
           "dropped": dropped, "errors": dict(rt.errors) if rt else None}
    Path(request["out"]).write_text(json.dumps(out))


def drift_lag1(windows: list[dict]) -> float | None:
    """Correlation of adjacent windows' log throughput, each condition's mean taken out."""
    logs = [math.log(w["tokens_per_s"]) for w in windows]
    means = {c: statistics.fmean([x for x, w in zip(logs, windows) if w["traced"] == c]) for c in (True, False)}
    resid = [x - means[w["traced"]] for x, w in zip(logs, windows)]
    if len(resid) < 4:
        return None
    return statistics.correlation(resid[:-1], resid[1:])


def per_step(windows: list[dict]) -> dict:
    """Where a traced step's extra time goes, traced windows against paused ones (ms per step):
    the engine thread's CPU, its time off CPU (waiting for the GIL or a core), and the other
    threads' CPU (``process_time`` minus the engine thread's), also as a share of wall time."""
    out = {}
    for traced in (True, False):
        chosen = [w for w in windows if w["traced"] == traced]
        steps = sum(w["steps"] for w in chosen)
        wall, engine = sum(w["wall_s"] for w in chosen), sum(w["engine_thread_cpu_s"] for w in chosen)
        background = sum(w["background_cpu_s"] for w in chosen)
        out[traced] = {"wall_ms": wall / steps * 1e3, "engine_cpu_ms": engine / steps * 1e3,
                       "engine_off_cpu_ms": (wall - engine) / steps * 1e3,
                       "background_cpu_ms": background / steps * 1e3, "background_share": background / wall}
    on, off = out[True], out[False]
    return {"traced": on, "paused": off, "wall_added": on["wall_ms"] / off["wall_ms"] - 1,
            **{f"{key}_added": on[key] - off[key] for key in ("engine_cpu_ms", "engine_off_cpu_ms", "background_cpu_ms", "background_share")}}


def paired(windows: list[dict]) -> list[tuple[dict, dict]]:
    """The windows as (traced, paused) pairs, a pair whose two windows both ran."""
    by_pair: dict[int, dict[bool, dict]] = {}
    for w in windows:
        by_pair.setdefault(w["pair"], {})[w["traced"]] = w
    return [(p[True], p[False]) for p in by_pair.values() if True in p and False in p]


def vllm_work(windows: list[dict]) -> dict | None:
    """``--vllm-work``: vLLM's own host work, traced over paused, pair by pair: the engine thread's CPU in it a window
    (all of :data:`VLLM_WORK` together, and each function), and each function's per-call median."""
    if not windows or "vllm_work" not in windows[0]:
        return None
    pairs = [{True: on["vllm_work"], False: off["vllm_work"]} for on, off in paired(windows)]

    def ratios(read) -> list[float]:
        return [read(p[True]) / read(p[False]) for p in pairs if read(p[False])]

    out = {"all": summary(ratios(lambda work: sum(f["cpu_s"] for f in work.values())))}
    for label in VLLM_WORK:
        if all(p[True][label]["calls"] and p[False][label]["calls"] for p in pairs):
            out[label] = {"cpu": summary(ratios(lambda work: work[label]["cpu_s"])),
                          "call_median": summary(ratios(lambda work: work[label]["call_us_p50"])),
                          "calls_per_step": statistics.fmean(p[c][label]["calls"] for p in pairs for c in (True, False))
                          / statistics.fmean(w["steps"] for w in windows),
                          "call_us_p50_paused": statistics.median(p[False][label]["call_us_p50"] for p in pairs)}
    return out


def collector(windows: list[dict]) -> dict | None:
    """``--vllm-work``: the cyclic collector, traced minus paused, a step: its runs per generation and its CPU, on the
    engine thread and on the others (mean difference of the pairs with a 95 % t interval)."""
    if not windows or "collections" not in windows[0]:
        return None

    def per_step(w: dict, where: str) -> dict[str, float]:
        runs, ns = w["collections"][where][:3], w["collections"][where][3:]
        values = {**{f"gen{g}_runs": runs[g] for g in range(3)}, **{f"gen{g}_cpu_ms": ns[g] / 1e6 for g in range(3)},
                  "cpu_ms": sum(ns) / 1e6}
        return {key: value / w["steps"] for key, value in values.items()}

    out: dict = {}
    for where in ("engine", "other"):
        pairs = [(per_step(on, where), per_step(off, where)) for on, off in paired(windows)]
        for key in pairs[0][0]:
            added = mean_ci([on[key] - off[key] for on, off in pairs])
            out[f"{where}_{key}"] = {"paused": statistics.fmean(off[key] for _, off in pairs),
                                     "added": added["mean"], "ci95": added["ci95"]}
    return out


def collector_line(counted: dict) -> str:
    def part(where: str) -> str:
        cpu, runs = counted[f"{where}_cpu_ms"], counted[f"{where}_gen0_runs"]
        return (f"{where} thread{'s' if where == 'other' else ''} {cpu['added'] * 1e3:+.1f} µs a step "
                f"({cpu['ci95'][0] * 1e3:+.1f} … {cpu['ci95'][1] * 1e3:+.1f}; paused {cpu['paused'] * 1e3:.1f}), "
                f"{runs['added']:+.3f} young collections a step")
    return "the collector traced - paused: " + "; ".join(part(where) for where in ("engine", "other"))


def vllm_work_line(work: dict) -> str:
    def pct(s: dict) -> str:
        return f"{(s['ratio'] - 1) * 100:+.2f} % ({(s['ci95'][0] - 1) * 100:+.2f} … {(s['ci95'][1] - 1) * 100:+.2f})"

    parts = [f"{label} {pct(f['cpu'])}, a call's median {pct(f['call_median'])} "
             f"({f['calls_per_step']:.1f} calls a step, {f['call_us_p50_paused']:.0f} µs)"
             for label, f in work.items() if label != "all"]
    return f"vLLM's own host work traced/paused {pct(work['all'])}: " + "; ".join(parts)


def run(batch: int, *, pairs: int, cycles: int, compact_interval: float, flush_interval: float | None, quick: bool,
        vllm_work_timed: bool = False, pipeline: str = "auto", async_scheduling: bool | None = None,
        runner: str | None = None) -> dict:
    from spectrace.testing.models import build_zoo

    zoo = build_zoo(SCRATCH / "zoo")
    store = SCRATCH / f"ab-store-{batch}"
    subprocess.run(["rm", "-rf", str(store)], check=False)
    out = SCRATCH / f"ab-{batch}.json"
    request = {"batch": batch, "cycles": cycles, "pairs": pairs, "target": str(zoo["target"]), "max_tokens": 200,
               "warmup_s": 5 if quick else 15, "out": str(out), "vllm_work": vllm_work_timed,
               "async_scheduling": async_scheduling}
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")},
           "SPECTRACE": "1", "SPECTRACE_DIR": str(store), "SPECTRACE_COMPACT_INTERVAL": str(compact_interval), "SPECTRACE_PROMETHEUS_PORT": "0",
           **({"SPECTRACE_FLUSH_INTERVAL": str(flush_interval)} if flush_interval else {}),
           "SPECTRACE_PIPELINE": pipeline,
           **({"VLLM_USE_V2_MODEL_RUNNER": "1" if runner == "v2" else "0"} if runner else {}),
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_CACHE_ROOT": str(SCRATCH / "vllm-cache"), "PYTHONPATH": str(REPO)}
    load = loadavg()
    proc = subprocess.run([sys.executable, "-m", "bench.ab_windows", "--child", json.dumps(request)], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=3600)
    if proc.returncode or not out.exists():
        raise SystemExit(f"batch {batch}: child failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result = json.loads(out.read_text())
    ratios = [on["tokens_per_s"] / off["tokens_per_s"] for on, off in paired(result["windows"]) if off["tokens_per_s"] > 0]
    walls = [w["wall_s"] for w in result["windows"]]
    from spectrace.settings import Settings

    return {"batch": batch, "k": 3, "pipeline": pipeline, "window_lifetimes": cycles, "compact_interval_s": compact_interval,
            "flush_interval_s": flush_interval or Settings.flush_interval_s, "window_s_median": statistics.median(walls),
            "drift_lag1": drift_lag1(result["windows"]), "per_step": per_step(result["windows"]),
            "vllm_work": vllm_work(result["windows"]), "collector": collector(result["windows"]),
            "load_before": load, "load_after": loadavg(),
            **summary(ratios), "ratios": ratios, **{k: v for k, v in result.items() if k != "windows"},
            "windows": result["windows"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batches", type=int, nargs="*", default=[16, 64])
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--cycles", type=int, default=1, help="request lifetimes per window")
    parser.add_argument("--compact-interval", type=float, default=60.0,
                        help="SPECTRACE_COMPACT_INTERVAL of the traced engine (default: the production default, 60 s)")
    parser.add_argument("--flush-interval", type=float, default=None,
                        help="SPECTRACE_FLUSH_INTERVAL of the traced engine (default: the production default)")
    parser.add_argument("--vllm-work", action="store_true",
                        help="also time vLLM's own host work on the engine thread (schedule, update_from_output, "
                             "process_outputs, _bookkeeping_sync) inside spectrace's wrappers: traced over paused")
    parser.add_argument("--pipeline", choices=("auto", "thread", "process"), default="auto",
                        help="SPECTRACE_PIPELINE of the traced engine: process (the hooks and a shipper in the "
                             "engine's process, a pipeline process for the rest), thread (the flush on a thread beside "
                             "the engine's), auto (the default: process since fedbe92, thread on CPU before it)")
    parser.add_argument("--async-scheduling", choices=("on", "off"), default=None,
                        help="vLLM's async scheduling (default: vLLM's own default; its CPU platform turns it off)")
    parser.add_argument("--runner", choices=("v1", "v2"), default=None,
                        help="VLLM_USE_V2_MODEL_RUNNER (default: unset, vLLM's own default)")
    parser.add_argument("--name", default="ab_windows", help="results file: bench/results/<name>.json")
    parser.add_argument("--per-step", nargs="+", metavar="RESULTS_JSON",
                        help="print where the time goes per step for results files already written, and exit")
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    if args.per_step:
        for path in args.per_step:
            for r in json.loads(Path(path).read_text())["results"]:
                p = per_step(r["windows"])
                print(f"{Path(path).name} batch {r['batch']}: wall/step +{p['wall_added'] * 100:.2f} %, "
                      f"engine CPU {p['engine_cpu_ms_added']:+.3f} ms, engine off CPU {p['engine_off_cpu_ms_added']:+.3f} ms, "
                      f"background CPU {p['background_cpu_ms_added']:+.3f} ms ({p['background_share_added'] * 100:+.2f} % of wall)")
        return 0
    pairs = 6 if args.quick else args.pairs
    results = []
    for batch in args.batches:
        r = run(batch, pairs=pairs, cycles=args.cycles, compact_interval=args.compact_interval,
                flush_interval=args.flush_interval, quick=args.quick, vllm_work_timed=args.vllm_work,
                pipeline=args.pipeline, runner=args.runner,
                async_scheduling=None if args.async_scheduling is None else args.async_scheduling == "on")
        print(f"batch {batch}: traced/untraced {r['ratio']:.4f}, 95% CI [{r['ci95'][0]:.4f}, {r['ci95'][1]:.4f}] "
              f"(half-width {r['half_width'] * 100:.2f} %, {r['pairs']} pairs of {r['window_s_median']:.1f} s windows, "
              f"{r['compactions']} compaction cycles, flush every {r['flush_interval_s']} s, drift lag-1 {r['drift_lag1']:.2f}), "
              f"load {r['load_before']} -> {r['load_after']}; pipeline {r['pipeline_shape']}; vLLM resolved {r['vllm']}",
              flush=True)
        if r["vllm_work"]:
            print(f"batch {batch}: " + vllm_work_line(r["vllm_work"]), flush=True)
        if r["collector"]:
            print(f"batch {batch}: " + collector_line(r["collector"]), flush=True)
        results.append(r)
    write_result(args.name, {"command": " ".join(["bench.ab_windows", *(argv or sys.argv[1:])]), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
