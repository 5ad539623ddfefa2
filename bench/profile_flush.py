"""Where the flush thread's CPU goes: one traced in-process engine, its background phases timed.

    .venv/bin/python -m bench.profile_flush [--batch 64] [--seconds 40] [--flush-interval 2]

Wraps the flush, compaction and drain methods with ``time.thread_time()`` (CPU of the calling
thread, so a phase waiting for the GIL is not counted) and reports each one's CPU per second of
generation, with how often it ran. Nested phases are counted in their parents too. A diagnosis
tool: one run, no pairing and no interval; the cost to the engine is measured by bench/ab_windows.py.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

from bench.common import SCRATCH

CPU: collections.Counter = collections.Counter()
CALLS: collections.Counter = collections.Counter()


def timed(name: str, fn):
    def wrapper(*args, **kwargs):
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            CPU[name] += time.thread_time() - start
            CALLS[name] += 1

    return wrapper


_END = object()


def timed_iter(name: str, fn):
    """``timed`` for a generator function: the CPU of producing each item, not of making the generator."""
    def wrapper(*args, **kwargs):
        CALLS[name] += 1
        items = fn(*args, **kwargs)
        while True:
            start = time.thread_time()
            item = next(items, _END)
            CPU[name] += time.thread_time() - start
            if item is _END:
                return
            yield item

    return wrapper


def instrument() -> None:
    import pyarrow.parquet as pq

    from spectrace import pipeline
    from spectrace.store import compaction, writer as segments
    from spectrace.recorder import runtime

    for name in ("flush", "maintain"):
        setattr(pipeline.Pipeline, name, timed(f"Pipeline.{name}", getattr(pipeline.Pipeline, name)))
    pipeline._build = timed("pipeline._build (Arrow tables)", pipeline._build)
    for name in ("export", "maintain", "_write", "_write_file"):
        setattr(segments.SegmentSink, name, timed(f"SegmentSink.{name}", getattr(segments.SegmentSink, name)))
    from spectrace.collector import collector, drain, timings

    collector.Collector._drain = timed("source:_drain_verification", collector.Collector._drain)
    for name in ("_flush_error_counts", "_flush_metric_counters"):  # the flush's other sources
        setattr(runtime.Runtime, name, timed(f"source:{name}", getattr(runtime.Runtime, name)))
    from spectrace.sinks import exposition

    exposition.ExpositionSink.export = timed("ExpositionSink.export", exposition.ExpositionSink.export)
    segments.pq.write_table = pq.write_table = timed("pq.write_table", pq.write_table)
    compaction._read = timed_iter("compaction._read", compaction._read)  # a row group at a time
    compaction._write = timed("compaction._write", compaction._write)  # its inputs read inside it (streamed)
    for name in ("_drain_engine", "_drain_worker", "_count"):
        setattr(drain.Drain, name, timed(f"VerifyCapture.{name}", getattr(drain.Drain, name)))

    timings.StepTimes.drain = timed("StepTimes.drain", timings.StepTimes.drain)
    from spectrace.sinks import metrics

    metrics.MetricsSink.export = timed("MetricsSink.export", metrics.MetricsSink.export)


def child(batch: int, seconds: float) -> None:
    instrument()
    from vllm import LLM, SamplingParams

    from spectrace.testing.models import build_zoo

    target = str(build_zoo(SCRATCH / "zoo")["target"])
    llm = LLM(model=target, tokenizer=target, dtype="float32", enforce_eager=True, max_model_len=512,
              kv_cache_memory_bytes=256 << 20, seed=0, max_num_seqs=batch,
              speculative_config={"method": "draft_model", "model": target, "num_speculative_tokens": 3})
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    next_id = [0]

    def step() -> None:
        while engine.get_num_unfinished_requests() < batch:
            engine.add_request(str(next_id[0]), "the quick brown fox", params)
            next_id[0] += 1
        engine.step()

    warm_end = time.perf_counter() + 8
    while time.perf_counter() < warm_end:
        step()
    CPU.clear()
    CALLS.clear()
    start, steps = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
    wall = time.perf_counter() - start
    print(f"batch {batch}: {steps} steps in {wall:.1f} s ({steps / wall:.1f} steps/s); "
          f"flush thread CPU per second of generation:")
    for name, cpu in CPU.most_common():
        print(f"  {name:45s} {cpu * 1e3 / wall:7.2f} ms/s   {CALLS[name]:5d} calls")
    sys.stdout.flush()
    os._exit(0)  # the engine's own shutdown is not what is measured


def main(argv=None) -> int:
    import subprocess

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--flush-interval", type=float, default=None, help="SPECTRACE_FLUSH_INTERVAL (default: the default)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.batch, args.seconds)
        return 0
    store = SCRATCH / "profile-flush-store"
    subprocess.run(["rm", "-rf", str(store)], check=False)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")},
           "SPECTRACE": "1", "SPECTRACE_DIR": str(store), "SPECTRACE_PROMETHEUS_PORT": "0",
           "SPECTRACE_PIPELINE": "thread",  # the flush thread is what this profiles (auto: a pipeline process since fedbe92)
           **({"SPECTRACE_FLUSH_INTERVAL": str(args.flush_interval)} if args.flush_interval else {}),
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(SCRATCH / "vllm-cache")}
    proc = subprocess.run([sys.executable, "-m", "bench.profile_flush", "--child", "--batch", str(args.batch),
                           "--seconds", str(args.seconds)], env=env, capture_output=True, text=True)
    report = proc.stdout[proc.stdout.find("batch "):] if "batch " in proc.stdout else ""
    print(report or f"the engine failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return 0 if report else 1


if __name__ == "__main__":
    sys.exit(main())
