"""The pipeline process's CPU on recorded messages: where it goes, and its garbage collector (or flush interval) paired.

    .venv/bin/python -m bench.pipeline_replay                      # batch 256, 6 rounds (~2 min)
    .venv/bin/python -m bench.pipeline_replay --batch 512 --rounds 4
    .venv/bin/python -m bench.pipeline_replay --compare flush      # a flush every 2 s against every 4 s
    .venv/bin/python -m bench.pipeline_replay --base 69eaee7       # this checkout against a commit (~4 min)

Method. One recording: bench/gpu_rates.py's GIL-bound stand-in engine (its hooks real) at the batch, k 7, five
steps a message, with the real shipper (``SPECTRACE_PIPELINE=process``); the frames it writes are kept as they
are. Each replay, in a fresh process, feeds them to the runtime a pipeline process builds
(``pipeline_process.apply``, a flush thread's flush every 20 messages: the 2 s flush interval at 50 steps/s, with
the exposition's interval counted in recorded time) after 20 warm-up
messages, and reports its CPU (user + system) per second of recorded generation at 50 steps/s, i.e. its share of
one core at BATCH x 50, with bench/profile_flush.py's phase timers. Replays alternate the collector as the pipeline
process sets it (``pipeline_process._tune_gc``: the start-up heap frozen, young collections every 50,000 net
containers) with CPython's defaults, in the order tuned/default, default/tuned, ... (ABBA), so the machine's drift
hits both; the result is the mean paired difference with a 95 % t interval. ``--compare flush`` pairs a flush
every 20 messages (2 s, ``SPECTRACE_FLUSH_INTERVAL``'s default) against every 40 (4 s) instead, the collector tuned
in both: what the flush's fixed parts (a Parquet file per table, the exposition) cost. No engine runs beside the replay:
this is the pipeline process's own work, not its cost to an engine (bench/gpu_rates.py measures that).
``--base REV`` pairs this checkout against a commit instead (checked out beside this one): each records its own
messages with its own shipper (what travels may differ between them), and the replays alternate between the two
checkouts, each replaying its own recording, the collector tuned and a flush every 2 s in both.
Results: bench/results/pipeline_replay[-flush|-base][-BATCH].json.
"""

from __future__ import annotations

import argparse
import json
import pickle
import shutil
import statistics
import sys
import time
from pathlib import Path

from bench.common import REPO, SCRATCH, base_checkout, loadavg, run_in_checkout, write_result
from bench.gpu_rates import mean_ci

CHILD = "import sys\nfrom bench.pipeline_replay import main\nsys.exit(main(sys.argv[1:]))"  # one replay, fresh
# one recording, fresh, in a checkout (its own stand-in engine and shipper): batch, messages, path
RECORD_CHILD = ("import json, sys\nfrom pathlib import Path\nfrom bench.pipeline_replay import record\n"
                "print('RESULT ' + json.dumps(record(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))))")

WARMUP = 20  # messages applied (and flushed) before the timed ones
FLUSH_EVERY = 20  # messages a flush: 2 s at 5 steps a message and 50 steps/s
STEPS_A_MESSAGE = 5
# --compare: the two conditions, each (collector, messages a flush)
CONDITIONS = {"collector": {"tuned": ("tuned", FLUSH_EVERY), "default": ("default", FLUSH_EVERY)},
              "flush": {"2s": ("tuned", FLUSH_EVERY), "4s": ("tuned", 2 * FLUSH_EVERY)}}
RATE = 50.0  # recorded steps a second, for the share of a core


def stand_in_messages(batch: int, messages: int, store: Path, take, steps: int = STEPS_A_MESSAGE) -> list:
    """bench/gpu_rates.py's stand-in engine at ``batch``, k 7, its hooks and shipper real (``SPECTRACE_PIPELINE=process``,
    writing to ``store``), the shipper's own thread stopped: every ``steps`` steps ``take(shipper)`` cuts a
    message, ``messages`` times; what it returned, in order."""
    from dataclasses import replace

    from bench import gpu_rates
    from spectrace.recorder import runtime
    from spectrace.recorder.verify import VerifyCapture

    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    engine = gpu_rates.Engine(batch, 7, RATE, 0.5, 150)
    rt = gpu_rates.start_runtime(replace(gpu_rates.settings_for(store), pipeline="process"), VerifyCapture, store.name)
    shipper = rt.pipeline.shipper
    shipper._stop.set()  # its thread ends: the messages below are cut here
    time.sleep(0.3)
    runtime.resume()
    out = []
    try:
        for _ in range(messages):
            for _ in range(steps):
                engine.step()
            out.append(take(shipper))
    finally:
        runtime.stop()
    return out


def record(batch: int, messages: int, path) -> dict:
    """The stand-in engine's shipped messages at ``batch``, as the frames the shipper wrote (the pipeline process's
    start frame, written when it started, is not among them)."""
    from spectrace.recorder import shipper as shipper_module

    frames: list[bytes] = []
    write = shipper_module.write_frame

    def keep(out, payload: bytes) -> None:
        frames.append(payload)
        write(out, payload)

    def ship(shipper) -> None:
        shipper_module.write_frame = keep
        try:
            shipper.ship()
        finally:
            shipper_module.write_frame = write

    stand_in_messages(batch, messages, SCRATCH / "pipeline_replay" / "record-store", ship)
    path.write_bytes(pickle.dumps(frames))
    return {"messages": len(frames), "bytes_a_message": statistics.fmean(map(len, frames))}


def replay(path, collector: str, flush_every: int = FLUSH_EVERY) -> dict:
    """One replay (in this process): CPU per second of recorded generation, total and by phase."""
    from bench import profile_flush

    profile_flush.instrument()
    from spectrace.settings import Settings
    from spectrace.collector import process as pipeline_process
    from spectrace.recorder import runtime
    from spectrace.recorder.wire import loads_shipment
    from spectrace.collector.inbox import Inbox

    frames = pickle.loads(path.read_bytes())  # every one a message (each carries the engine's state)
    work = SCRATCH / "pipeline_replay" / f"replay-{collector}"
    shutil.rmtree(work, ignore_errors=True)
    (work / "store").mkdir(parents=True)
    (work / "metrics").mkdir(mode=0o700)
    rt = runtime.Runtime(Settings(enabled=True, dir=work / "store", metrics_dir=work / "metrics", pipeline="thread"),
                         source=Inbox())
    rt.runs.clear()
    rt.run = None
    # the flushes are the flush thread's (periodic), at the recorded time: the exposition's interval
    # (SPECTRACE_EXPOSITION_INTERVAL) counts a message as the 0.1 s it took to generate, not the replay's pace
    from types import SimpleNamespace

    from spectrace.sinks import exposition

    recorded = [1000.0]
    exposition.time = SimpleNamespace(monotonic=lambda: recorded[0])
    for frame in frames[:WARMUP]:
        recorded[0] += STEPS_A_MESSAGE / RATE
        pipeline_process.apply(rt, loads_shipment(frame))
    rt.pipeline.flush(periodic=True)
    if collector == "tuned":
        pipeline_process._tune_gc()
    profile_flush.CPU.clear()
    profile_flush.CALLS.clear()
    timed = frames[WARMUP:]
    started, unpickling = time.process_time(), 0.0
    for i, frame in enumerate(timed):
        recorded[0] += STEPS_A_MESSAGE / RATE
        t0 = time.process_time()
        message = loads_shipment(frame)
        unpickling += time.process_time() - t0
        pipeline_process.apply(rt, message)
        if i % flush_every == flush_every - 1:
            rt.pipeline.flush(periodic=True)
    rt.pipeline.flush(periodic=True)
    cpu = time.process_time() - started
    seconds = len(timed) * STEPS_A_MESSAGE / RATE
    rt.shutdown()
    return {"pct_core": cpu / seconds * 100, "unpickling_pct_core": unpickling / seconds * 100,
            "phases_pct_core": {name: round(v / seconds * 100, 3) for name, v in profile_flush.CPU.most_common()},
            "recorded_s": seconds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--messages", type=int, default=220, help="messages recorded (5 steps each); 20 warm up")
    parser.add_argument("--rounds", type=int, default=6, help="pairs of replays (the two conditions)")
    parser.add_argument("--compare", choices=tuple(CONDITIONS), default="collector",
                        help="collector: tuned against CPython's defaults; flush: a flush every 2 s against every 4 s")
    parser.add_argument("--base", metavar="REV", help="pair this checkout against commit REV (each its own recording)")
    parser.add_argument("--replay", help=argparse.SUPPRESS)
    parser.add_argument("--collector", choices=("tuned", "default"), help=argparse.SUPPRESS)
    parser.add_argument("--flush-every", type=int, default=FLUSH_EVERY, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.messages <= WARMUP + 2 * FLUSH_EVERY:
        parser.error(f"--messages must be above {WARMUP + 2 * FLUSH_EVERY} (the warm-up and a 4 s flush)")
    if args.batch < 1:
        parser.error("--batch must be at least 1")
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (an interval needs two pairs)")
    if args.replay:  # a child: one replay
        print("RESULT " + json.dumps(replay(Path(args.replay), args.collector, args.flush_every)))
        return 0
    folder = SCRATCH / "pipeline_replay"
    folder.mkdir(parents=True, exist_ok=True)
    if args.base:
        with base_checkout(args.base, "pipeline_replay-base", "pipeline_replay") as base:
            conditions = {"head": (REPO, folder / f"frames-{args.batch}.pkl", "tuned", FLUSH_EVERY),
                          "base": (base, folder / f"frames-{args.batch}-base.pkl", "tuned", FLUSH_EVERY)}
            result = compare(args, conditions)
        result["base_commit"] = args.base
    else:
        path = folder / f"frames-{args.batch}.pkl"
        result = compare(args, {name: (REPO, path, collector, flush_every)
                                for name, (collector, flush_every) in CONDITIONS[args.compare].items()})
    a, b = result["compare"]
    mean, (low, high) = result[f"{a}_minus_{b}_pct_core"]["mean"], result[f"{a}_minus_{b}_pct_core"]["ci95"]
    name = "pipeline_replay" + ("-base" if args.base else "" if args.compare == "collector" else f"-{args.compare}")
    name += "" if args.batch == 256 else f"-{args.batch}"
    written = write_result(name, result)
    print(f"pipeline process at {args.batch} x 50 (replayed): {a} {result['pct_core'][a]:.2f} %, "
          f"{b} {result['pct_core'][b]:.2f} % of a core; {a} - {b} {mean:+.2f} points "
          f"({low:+.2f} … {high:+.2f}, {args.rounds} pairs)")
    print(f"wrote {written}")
    return 0


def compare(args, conditions: dict) -> dict:
    """Record each condition's messages (once per recording: conditions may share one), then ``args.rounds`` pairs
    of replays, alternating (ABBA). ``conditions``: name -> (checkout, recording, collector, messages a flush)."""
    recorded: dict[str, dict] = {}
    for checkout, path, _, _ in conditions.values():
        if str(path) not in recorded:
            print(f"recording {args.messages} messages at batch {args.batch} in {checkout} ...", flush=True)
            recorded[str(path)] = run_in_checkout(checkout, RECORD_CHILD, [str(args.batch), str(args.messages), str(path)],
                                                  "pipeline_replay", "recording")
    load_before = loadavg()
    a, b = conditions
    runs: dict[str, list[dict]] = {a: [], b: []}
    for i in range(args.rounds):
        for condition in ((a, b) if i % 2 == 0 else (b, a)):
            checkout, path, collector, flush_every = conditions[condition]
            runs[condition].append(run_in_checkout(checkout, CHILD, ["--replay", str(path), "--collector", collector,
                                                                     "--flush-every", str(flush_every)],
                                                   "pipeline_replay", f"{condition} replay"))
        print(f"round {i + 1}/{args.rounds}: {a} {runs[a][-1]['pct_core']:.2f} %, "
              f"{b} {runs[b][-1]['pct_core']:.2f} % of a core", flush=True)
    return {
        "batch": args.batch, "k": 7, "rate": RATE, "rounds": args.rounds,
        "recorded": recorded[str(conditions[a][1])] if len(recorded) == 1 else
        {name: recorded[str(path)] for name, (_, path, _, _) in conditions.items()},
        "compare": {name: {"collector": c, "flush_every_messages": f} for name, (_, _, c, f) in conditions.items()},
        "pct_core": {c: statistics.fmean(r["pct_core"] for r in rs) for c, rs in runs.items()},
        f"{a}_minus_{b}_pct_core": mean_ci([x["pct_core"] - y["pct_core"] for x, y in zip(runs[a], runs[b])]),
        "runs": runs, "load_before": load_before, "load_after": loadavg(),
    }


if __name__ == "__main__":
    sys.exit(main())
