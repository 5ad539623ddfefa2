"""What the draft token ids cost the shipper: pickling a message as shipped against leaner ones.

    .venv/bin/python -m bench.ship_encoding                 # batch 256, k 7 (~1 min)
    .venv/bin/python -m bench.ship_encoding --batch 512

Method. bench/gpu_rates.py's stand-in engine (its hooks real, vLLM's dataclasses) runs five steps at a time and the
real shipper collects each message (``Shipper.collect``), as the engine process does every ship interval. Each
message is then pickled by the shipper's ``dumps_message`` (without its pauses) three ways, alternating in one
process: as shipped; ``without_ids``, every engine and worker step's draft dict replaced by what counting needs
without the ids (the request ids and the drafts' lengths); ``first_last``, those plus what the dummy-draft rule
(``draft_shapes``, the only reader of the ids) needs: each row's first and last id and the whole rows whose last id
is their first. Each conversion is done in the timed section, as the shipper would. Each way is timed warm (the
message pickled just before) and cold (64 MB of other memory touched first: the engine thread's work between two
shipments evicts the records from the caches). Thread CPU per engine step; the result is the mean of each way and
its paired difference from as shipped with a 95 % t interval. Results: bench/results/ship_encoding.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from itertools import compress
from operator import eq, itemgetter

from bench.common import SCRATCH, loadavg, write_result
from bench.gpu_rates import mean_ci
from bench.pipeline_replay import STEPS_A_MESSAGE, stand_in_messages


def messages(batch: int, n: int) -> list[dict]:
    """``n`` messages the real shipper collected from the stand-in engine at ``batch``, k 7."""
    return stand_in_messages(batch, n, SCRATCH / "ship_encoding" / "store", lambda shipper: shipper.collect()[0])


def without_ids(message: dict, shape_of=None) -> dict:
    """The message with each step's draft dict as (request ids, drafts' lengths): what counting reads of it."""
    shapes: dict[int, tuple] = {}

    def shape(drafts: dict) -> tuple:
        got = shapes.get(id(drafts))
        if got is None:
            got = shapes[id(drafts)] = (shape_of or _lengths)(drafts)
        return got

    out = dict(message)
    out["engine"] = [step._replace(drafts=shape(step.drafts)) for step in message.get("engine", ())]
    out["worker"] = [step._replace(drafts=shape(step.drafts)) if isinstance(step.drafts, dict) else step
                     for step in message.get("worker", ())]
    return out


def _lengths(drafts: dict) -> tuple:
    return list(drafts), list(map(len, drafts.values()))


_FIRST, _LAST = itemgetter(0), itemgetter(-1)


def _first_last(drafts: dict) -> tuple:
    """Lengths, each row's first and last id, and the rows whose last id is their first (C-level passes; a
    draft dict's rows are never empty in vLLM)."""
    rows = list(drafts.values())
    first, last = list(map(_FIRST, rows)), list(map(_LAST, rows))
    return list(drafts), list(map(len, rows)), first, last, list(compress(rows, map(eq, first, last)))


def first_last(message: dict) -> dict:
    return without_ids(message, _first_last)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--messages", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=10, help="passes over the messages, each way, alternating")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.messages < 1 or args.rounds < 2:
        parser.error("--batch and --messages must be at least 1, --rounds at least 2")
    import numpy as np

    from spectrace.tracer import wire

    wire.YIELD_S = 0  # the pauses are the same either way; pickling alone is compared
    print(f"collecting {args.messages} messages at batch {args.batch} ...", flush=True)
    recorded = messages(args.batch, args.messages)
    other = np.ones(8_000_000)  # 64 MB

    def timed(encode, message, cold: bool) -> float:
        if cold:
            other.sum()
            other[::8] += 1.0
        start = time.thread_time_ns()
        wire.dumps_message(encode(message))
        return (time.thread_time_ns() - start) / 1e3 / STEPS_A_MESSAGE

    ways = {"shipped": lambda m: m, "without_ids": without_ids, "first_last": first_last}
    load_before = loadavg()
    per_step: dict[str, dict[str, list[float]]] = {c: {w: [] for w in ways} for c in ("warm", "cold")}
    for r in range(args.rounds):
        order = list(ways) if r % 2 == 0 else list(reversed(ways))
        for cache in ("warm", "cold"):
            for way in order:
                ts = []
                for message in recorded:
                    if cache == "warm":
                        wire.dumps_message(ways[way](message))
                    ts.append(timed(ways[way], message, cache == "cold"))
                per_step[cache][way].append(statistics.fmean(ts))
    result: dict = {"batch": args.batch, "k": 7, "messages": args.messages, "rounds": args.rounds,
                    "bytes_a_message": {w: statistics.fmean(len(wire.dumps_message(ways[w](m))) for m in recorded)
                                        for w in ways}}
    for cache, ways_us in per_step.items():
        result[cache] = {"us_per_step": {w: statistics.fmean(xs) for w, xs in ways_us.items()},
                         **{f"{w}_minus_shipped_us": mean_ci([a - b for a, b in zip(ways_us[w], ways_us["shipped"])])
                            for w in ways if w != "shipped"}}
    result["load_before"], result["load_after"] = load_before, loadavg()
    written = write_result("ship_encoding" if args.batch == 256 else f"ship_encoding-{args.batch}", result)
    for cache in ("warm", "cold"):
        us = result[cache]["us_per_step"]
        print(f"{cache}: pickling a step as shipped {us['shipped']:.1f} µs; " + "; ".join(
            f"{w} {us[w]:.1f} µs ({d['mean']:+.1f}, {d['ci95'][0]:+.1f} … {d['ci95'][1]:+.1f})"
            for w in ways if w != "shipped" for d in [result[cache][f"{w}_minus_shipped_us"]]) + f" ({args.rounds} rounds)")
    print("bytes a message: " + ", ".join(f"{w} {b:.0f}" for w, b in result["bytes_a_message"].items()) + f"; wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
