"""End to end: real vLLM on CPU, tiny models, decode throughput with tracing off vs on,
and the resident size of a traced engine over a long run.

    .venv/bin/python -m bench.e2e [--quick] [--reps N] [--memory-seconds S]

Configurations (each run is a fresh child process, ``bench/e2e_child.py``):
  off     SPECTRACE unset
  duckdb  SPECTRACE=1 (the default sink: Parquet segments under SPECTRACE_DIR)
  otlp    SPECTRACE=1 SPECTRACE_EXPORTER=otlp, to a loopback OTLP/HTTP receiver in this process
          (spectrace.testing.otlp; metrics exported every 5 s)

Engine: the zoo's tiny Qwen3 target (spectrace.testing.models.build_zoo) with itself as
``draft_model`` drafter, k = 5 (every draft accepted: the most verify work per step), 32
prompts at once, 192 new tokens each (ignore_eos), single-process vLLM
(VLLM_ENABLE_V1_MULTIPROCESSING=0, OMP_NUM_THREADS=1; spectrace.testing.engine.base_env).
Timing covers ``llm.generate`` only: load and one warm-up round are excluded. Runs are
interleaved (off, duckdb, otlp, then the order rotated) so a neighbour's load hits every
configuration alike; ratios are per repetition (traced / off of the same repetition), then
the median. CPU seconds (all threads of the process) per token are reported as well: they
include spectrace's background flush, which wall time on a 2-core machine may hide.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import REPO, SCRATCH, loadavg, spread, write_result

CONFIGS = ("off", "duckdb", "otlp")
PROMPTS = [f"request {i}: the quick brown fox jumps over the lazy dog" for i in range(32)]


def child(config: str, request: dict, *, zoo_store: Path, receiver=None, timeout: float = 600) -> dict:
    from spectrace.testing.engine import base_env

    store = zoo_store / f"store-{config}"
    shutil.rmtree(store, ignore_errors=True)
    env = base_env(store, traced=config != "off", cache_root=SCRATCH / "vllm-cache")
    env["TMPDIR"] = str(SCRATCH / "tmp")
    (SCRATCH / "tmp").mkdir(parents=True, exist_ok=True)
    if config == "otlp":
        env.update(SPECTRACE_EXPORTER="otlp", OTEL_EXPORTER_OTLP_ENDPOINT=receiver.http_endpoint,
                   OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTEL_METRIC_EXPORT_INTERVAL="5000")
    out = SCRATCH / f"e2e-{config}.json"
    out.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-m", "bench.e2e_child", json.dumps({**request, "out": str(out)})],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if proc.returncode or not out.exists():
        raise RuntimeError(f"{config} child exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}")
    result = json.loads(out.read_text())
    result["store_bytes"] = sum(p.stat().st_size for p in store.rglob("*.parquet")) if store.exists() else 0
    return result


def throughput(result: dict) -> tuple[float, float]:
    """(tokens per wall second, CPU seconds per 1000 tokens) over the timed rounds."""
    rounds = result["rounds"]
    tokens = sum(r["tokens"] for r in rounds)
    return tokens / sum(r["wall_s"] for r in rounds), 1000 * sum(r["cpu_s"] for r in rounds) / tokens


def slope_mb_per_min(points: list[tuple[float, int]]) -> float:
    """Least-squares slope of RSS (MB) over time (min)."""
    if len(points) < 2:
        return 0.0
    xs = [t / 60 for t, _ in points]
    ys = [r / 2**20 for _, r in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def main(argv=None) -> dict:
    from spectrace.testing.models import build_zoo
    from spectrace.testing.otlp import OtlpReceiver

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None, help="timed generate() calls per run")
    parser.add_argument("--memory-seconds", type=float, default=None)
    args = parser.parse_args(argv)
    reps = args.reps or (1 if args.quick else 4)
    rounds = args.rounds or (2 if args.quick else 4)
    memory_s = args.memory_seconds if args.memory_seconds is not None else (20 if args.quick else 75)

    zoo = build_zoo(SCRATCH / "zoo")
    request = {
        "target": str(zoo["target"]),
        "speculative": {"method": "draft_model", "model": str(zoo["draft_self"]), "num_speculative_tokens": 5},
        "prompts": PROMPTS,
        "max_tokens": 192,
        "rounds": rounds,
    }
    load_before = loadavg()
    started = time.time()
    runs: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    with OtlpReceiver() as receiver:
        for rep in range(reps):
            order = CONFIGS[rep % 3:] + CONFIGS[:rep % 3]
            for config in order:
                load = loadavg()
                res = child(config, request, zoo_store=SCRATCH, receiver=receiver)
                tps, cpu = throughput(res)
                res.update(rep=rep, tokens_per_s=tps, cpu_s_per_1k_tokens=cpu, load_before=load, load_after=loadavg())
                runs[config].append(res)
                print(f"rep {rep} {config:6s} {tps:8.0f} tok/s  {cpu:.3f} CPU s/1k tok  load {load[0]:.2f}  "
                      f"patched={res['spectrace']['update_from_output_patched']}", flush=True)
        otlp_received = {"span_requests": len(receiver.trace_requests), "metric_requests": len(receiver.metric_requests)}

        # memory: one long traced run, resident size after every generate() call
        mem = None
        if memory_s > 0:
            mem_res = child("duckdb", {**request, "rounds": 1, "seconds": memory_s}, zoo_store=SCRATCH,
                            receiver=receiver, timeout=memory_s + 600)
            pts = [(r["t"], r["rss"]) for r in mem_res["rounds"]]
            half = pts[len(pts) // 2:]
            mem = {
                "seconds": memory_s,
                "rounds": len(pts),
                "engine_steps": mem_res["vllm_spec_metrics"].get("vllm:spec_decode_num_drafts"),
                "rss_mb_first": pts[0][1] / 2**20,
                "rss_mb_last": pts[-1][1] / 2**20,
                "rss_mb_max": max(r for _, r in pts) / 2**20,
                "slope_mb_per_min_second_half": slope_mb_per_min(half),
                "rss_mb_series": [round(r / 2**20, 1) for _, r in pts],
                "spectrace_state_at_end": mem_res["spectrace"],
                "store_mb": mem_res["store_bytes"] / 1e6,
            }
            print(f"memory {memory_s:.0f} s traced: RSS {mem['rss_mb_first']:.1f} -> {mem['rss_mb_last']:.1f} MB "
                  f"(max {mem['rss_mb_max']:.1f}), slope over 2nd half {mem['slope_mb_per_min_second_half']:+.2f} MB/min, "
                  f"buffers at end {mem_res['spectrace']}", flush=True)

    summary = {}
    for config in CONFIGS[1:]:
        ratios = [t["tokens_per_s"] / o["tokens_per_s"] for t, o in zip(runs[config], runs["off"])]
        cpu_ratios = [t["cpu_s_per_1k_tokens"] / o["cpu_s_per_1k_tokens"] for t, o in zip(runs[config], runs["off"])]
        summary[config] = {
            "throughput_ratio": spread(ratios),
            "cpu_per_token_ratio": spread(cpu_ratios),
            "tokens_per_s": spread([r["tokens_per_s"] for r in runs[config]]),
        }
        print(f"{config}: throughput ratio median {summary[config]['throughput_ratio']['median']:.4f} "
              f"(min {min(ratios):.4f}, max {max(ratios):.4f}); CPU/token ratio median "
              f"{summary[config]['cpu_per_token_ratio']['median']:.4f}", flush=True)
    summary["off"] = {"tokens_per_s": spread([r["tokens_per_s"] for r in runs["off"]])}
    same_tokens = len({json.dumps(r["first_tokens"]) for rs in runs.values() for r in rs}) == 1
    result = {
        "seconds": round(time.time() - started, 1),
        "load_before": load_before,
        "load_after": loadavg(),
        "reps": reps,
        "rounds_per_run": rounds,
        "request": {k: v for k, v in request.items() if k != "prompts"} | {"num_prompts": len(PROMPTS)},
        "summary": summary,
        "same_tokens_everywhere": same_tokens,
        "otlp_received": otlp_received,
        "runs": {c: [{k: v for k, v in r.items() if k != "rounds"} | {"rounds": r["rounds"]} for r in rs]
                 for c, rs in runs.items()},
        "memory": mem,
        "disabled": {
            "off_runs_tracer_imported": [r["spectrace"]["tracer_imported"] for r in runs["off"]],
            "off_runs_patched": [r["spectrace"]["update_from_output_patched"] or r["spectrace"]["bookkeeping_sync_patched"]
                                 for r in runs["off"]],
        },
        "goal": {
            "duckdb_ratio": summary["duckdb"]["throughput_ratio"]["median"],
            "otlp_ratio": summary["otlp"]["throughput_ratio"]["median"],
            "met_0_99": min(summary["duckdb"]["throughput_ratio"]["median"],
                            summary["otlp"]["throughput_ratio"]["median"]) >= 0.99,
        },
    }
    write_result("e2e", result)
    return result


if __name__ == "__main__":
    main()
