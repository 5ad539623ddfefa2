"""What durable segments cost a flush: ``fsync`` of each segment before its rename and of its
folder after, against the same flush without, paired in one process.

    .venv/bin/python -m bench.durable [--pairs 300] [--batches 64 256] [--k 5]

Each pair writes the same flush twice, once durable and once not, in alternating order
(ABBA), through the real store sink (``SegmentSink.export``): one flush's rows of an engine at
each of ``--batches`` requests, k ``--k``, 2 s of steps at the CPU engine's ~15 steps/s (``verify_steps``
sampled at 1.0, ``verify_counts`` per position, a few spans' rows). Reported: the flush's wall
time and its thread CPU per condition, the difference per pair with a 95 % interval (t on the
pair differences), on this machine's disk (fsync's cost is the disk's: a network volume or a
busy disk pays more).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time

from bench.common import SCRATCH, loadavg, spread, write_result


def _rows(batch: int, k: int, steps: int, run_id: str = "bench") -> dict[str, list[dict]]:
    now = time.time_ns()
    verify_steps = [
        {"ts": now + s, "run_id": run_id, "step": s, "request_id": f"r{r}", "context_len": 100 + s,
         "num_drafted": k, "num_accepted": (r + s) % (k + 1), "greedy": True, "structured_output": False}
        for s in range(steps) for r in range(batch)
    ]
    counts = [
        {"ts": now, "run_id": run_id, "source": "engine_core", "position": p, "context_bucket": "0-1k",
         "drafted": steps * batch, "accepted": steps * batch // (p + 2)}
        for p in range(k)
    ]
    return {"verify_steps": verify_steps, "verify_counts": counts}


def _interval(diffs: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(diffs)
    half = 1.96 * statistics.stdev(diffs) / len(diffs) ** 0.5
    return mean - half, mean + half


def _measure(batch: int, k: int, steps: int, pairs: int) -> dict:
    from spectrace.testing import store_pipeline

    root = SCRATCH / "durable"
    shutil.rmtree(root, ignore_errors=True)
    SCRATCH.mkdir(parents=True, exist_ok=True)  # the writer makes its folder, not the ones above it
    pipeline = store_pipeline(root, retention_s=0, compact_interval_s=0)
    sink = pipeline.sink("duckdb")
    rows = _rows(batch, k, steps)

    def flush(durable: bool) -> tuple[float, float]:
        sink.durable = durable
        for table, batch_rows in rows.items():
            pipeline.extend(table, batch_rows)
        # the pipeline's own flush: drain, Arrow, every sink; timed around the whole of it
        wall, cpu = time.perf_counter(), time.thread_time()
        pipeline.flush()
        return time.perf_counter() - wall, time.thread_time() - cpu

    for _ in range(10):  # warm up: imports, first folders
        flush(True), flush(False)
    load_before = loadavg()
    walls = {True: [], False: []}
    cpus = {True: [], False: []}
    for i in range(pairs):
        order = (True, False) if i % 2 == 0 else (False, True)
        for durable in order:
            wall, cpu = flush(durable)
            walls[durable].append(wall)
            cpus[durable].append(cpu)
    wall_diff = [a - b for a, b in zip(walls[True], walls[False])]
    cpu_diff = [a - b for a, b in zip(cpus[True], cpus[False])]
    result = {
        "batch": batch, "k": k, "steps_per_flush": steps, "pairs": pairs,
        "segments_per_flush": len(rows), "rows_per_flush": sum(map(len, rows.values())),
        "wall_ms": {"durable": spread(w * 1e3 for w in walls[True]), "not_durable": spread(w * 1e3 for w in walls[False])},
        "cpu_ms": {"durable": spread(c * 1e3 for c in cpus[True]), "not_durable": spread(c * 1e3 for c in cpus[False])},
        "wall_added_ms": statistics.fmean(wall_diff) * 1e3,
        "wall_added_ms_ci95": [x * 1e3 for x in _interval(wall_diff)],
        "cpu_added_ms": statistics.fmean(cpu_diff) * 1e3,
        "cpu_added_ms_ci95": [x * 1e3 for x in _interval(cpu_diff)],
        "load_before": load_before, "load_after": loadavg(),
    }
    pipeline.close()
    shutil.rmtree(root, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30, help="engine steps in one flush (2 s at ~15 steps/s)")
    args = parser.parse_args()

    results = [_measure(batch, args.k, args.steps, args.pairs) for batch in args.batches]
    path = write_result("durable", {"results": results})
    for result in results:
        print(
            f"batch {result['batch']}: flush of {result['rows_per_flush']} rows, {result['segments_per_flush']} segments: durable adds "
            f"{result['wall_added_ms']:.2f} ms wall (95 % CI {result['wall_added_ms_ci95'][0]:.2f} to "
            f"{result['wall_added_ms_ci95'][1]:.2f}), {result['cpu_added_ms']:.3f} ms CPU (95 % CI "
            f"{result['cpu_added_ms_ci95'][0]:.3f} to {result['cpu_added_ms_ci95'][1]:.3f}) over "
            f"{result['wall_ms']['not_durable']['median']:.2f} ms; {path}"
        )


if __name__ == "__main__":
    main()
