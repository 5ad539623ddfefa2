"""The pipeline process's compaction at a GPU engine's rates: its minute cycles and its hour merge, against a commit.

    .venv/bin/python -m bench.compaction_hour --base 8e62d17                 # 10 minutes at batch 256 (~4 min)
    .venv/bin/python -m bench.compaction_hour --base 8e62d17 --minutes 20 --rounds 1

Method. bench/pipeline_replay's recording (its stand-in engine at ``--batch``, k 7, 50 steps/s, hooks and shipper
real) is replayed through the runtime a pipeline process builds (``pipeline_process.apply``, a flush every 20
messages: 2 s), its steps' times shifted on each pass so that the store holds ``--minutes`` of generation in time
order, with the store writer's compaction cycle after each minute of it (a part file: ``SPECTRACE_COMPACT_INTERVAL``'s
60 s). Then the writer's clock moves past the hour and one more cycle merges the hour (its parts and raw segments)
into the hour file. Each checkout runs in a fresh process of its own (this one and ``--base``, alternating over
``--rounds``), on the same recording. Per run: the CPU (user and system: on this project's VM most of a large
allocation's cost is the kernel handing out fresh pages) of the minute cycles, a minute on average, and of the hour
merge; the process's peak resident size before and after the hour merge. An hour of a real engine at 256 x 50 is
~46 M ``verify_steps`` rows; ``--minutes`` scales it down (a merge's memory grew with its rows before streaming).
Results: bench/results/compaction_hour[-BATCH].json.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from bench.common import REPO, SCRATCH, base_checkout, loadavg, run_in_checkout, write_result
from bench.pipeline_replay import RECORD_CHILD

CHILD = r'''
import json, os, pickle, resource, shutil, sys, time
from pathlib import Path
import pyarrow.parquet as pq
from spectrace.settings import Settings
from spectrace.collector import process as pipeline_process
from spectrace.recorder import runtime
from spectrace.collector.inbox import Inbox
from spectrace.recorder.wire import loads_shipment

frames_path, minutes, work = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
frames = pickle.loads(frames_path.read_bytes())[20:]  # bench/pipeline_replay's warm-up left out
shutil.rmtree(work, ignore_errors=True)
(work / "store").mkdir(parents=True)
(work / "metrics").mkdir(mode=0o700)
rt = runtime.Runtime(Settings(enabled=True, dir=work / "store", metrics_dir=work / "metrics", pipeline="thread"), source=Inbox())
rt.runs.clear()
rt.run = None
pipeline_process._tune_gc()
pass_ns = len(frames) * 5 * 20_000_000  # one pass over the recording: 5 steps a message at 50 steps/s
messages_a_minute = 600
sent, cycles = 0, []
while sent < minutes * messages_a_minute:
    shift = sent // len(frames) * pass_ns
    message = loads_shipment(frames[sent % len(frames)])
    message.engine = [step._replace(ts=step.ts + shift) for step in message.engine]
    pipeline_process.apply(rt, message)
    sent += 1
    if sent % 20 == 0:
        rt.pipeline.flush()
    if sent % messages_a_minute == 0:
        before = os.times()
        rt.pipeline.maintain()
        after = os.times()
        cycles.append((after.user - before.user, after.system - before.system))
peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
writer = rt.pipeline.sink("duckdb")
clock = writer.clock
writer.clock = lambda: clock() + 2 * 3600 * 10**9  # the hour is over
before = os.times()
rt.pipeline.maintain()
after = os.times()
hour = (after.user - before.user, after.system - before.system)
peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
hour_files = list((work / "store" / "verify_steps").rglob("*.hour.parquet"))
rows = sum(pq.read_metadata(p).num_rows for p in hour_files)
rt.shutdown()
shutil.rmtree(work, ignore_errors=True)
print("RESULT " + json.dumps({
    "minute_cycle_cpu_s": {"user": sum(u for u, _ in cycles) / len(cycles), "system": sum(s for _, s in cycles) / len(cycles)},
    "hour_merge_cpu_s": {"user": hour[0], "system": hour[1]},
    "peak_rss_mb_before_hour_merge": peak_before, "peak_rss_mb_after_hour_merge": peak_after,
    "hour_files": len(hour_files), "verify_steps_rows_in_hour_file": rows,
}))
'''


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", metavar="REV", required=True, help="the commit to compare with")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--minutes", type=int, default=10, help="minutes of generation in the hour (default 10)")
    parser.add_argument("--messages", type=int, default=220, help="messages recorded (5 steps each); 20 warm up")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each checkout, alternating")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.minutes < 1 or args.rounds < 1 or args.messages <= 20:
        parser.error("--batch, --minutes and --rounds must be at least 1, --messages above 20")
    folder = SCRATCH / "compaction_hour"
    folder.mkdir(parents=True, exist_ok=True)
    frames = folder / f"frames-{args.batch}.pkl"
    print(f"recording {args.messages} messages at batch {args.batch} ...", flush=True)
    recorded = run_in_checkout(REPO, RECORD_CHILD, [str(args.batch), str(args.messages), str(frames)],
                               "compaction_hour", "recording")
    load_before = loadavg()
    runs: dict[str, list[dict]] = {"head": [], "base": []}
    with base_checkout(args.base, "compaction_hour-base", "compaction_hour") as base:
        checkouts = {"head": REPO, "base": base}
        for i in range(args.rounds):
            for name in (("head", "base") if i % 2 == 0 else ("base", "head")):
                got = run_in_checkout(checkouts[name], CHILD, [str(frames), str(args.minutes), str(folder / name)],
                                      "compaction_hour", f"{name} run")
                runs[name].append(got)
                print(f"{name}: a minute's cycle {got['minute_cycle_cpu_s']['user']:.2f} s user + "
                      f"{got['minute_cycle_cpu_s']['system']:.2f} s system; the hour merge "
                      f"{got['hour_merge_cpu_s']['user']:.2f} + {got['hour_merge_cpu_s']['system']:.2f} s; peak RSS "
                      f"{got['peak_rss_mb_before_hour_merge']:.0f} -> {got['peak_rss_mb_after_hour_merge']:.0f} MB "
                      f"({got['verify_steps_rows_in_hour_file']} verify_steps rows merged)", flush=True)

    def mean(name: str, key: str, part: str | None = None) -> float:
        return statistics.fmean(r[key][part] if part else r[key] for r in runs[name])

    result = {"base_commit": args.base, "batch": args.batch, "k": 7, "minutes": args.minutes, "rounds": args.rounds,
              "recorded": recorded, "runs": runs,
              "mean": {name: {"minute_cycle_cpu_s": mean(name, "minute_cycle_cpu_s", "user")
                              + mean(name, "minute_cycle_cpu_s", "system"),
                              "hour_merge_cpu_s": mean(name, "hour_merge_cpu_s", "user")
                              + mean(name, "hour_merge_cpu_s", "system"),
                              "peak_rss_mb_after_hour_merge": mean(name, "peak_rss_mb_after_hour_merge")}
                       for name in runs},
              "load_before": load_before, "load_after": loadavg()}
    written = write_result("compaction_hour" + ("" if args.batch == 256 else f"-{args.batch}"), result)
    for name, m in result["mean"].items():
        print(f"{name}: a minute's cycle {m['minute_cycle_cpu_s']:.2f} s CPU, the hour merge {m['hour_merge_cpu_s']:.2f} s, "
              f"peak RSS {m['peak_rss_mb_after_hour_merge']:.0f} MB")
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
