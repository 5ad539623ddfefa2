"""What the draft token ids cost the shipper: a message's draft dicts packed (as shipped) against pickled as they are,
leaner ones, and marshal.

    .venv/bin/python -m bench.ship_encoding                 # batch 256, k 7 (~1 min)
    .venv/bin/python -m bench.ship_encoding --batch 512
    .venv/bin/python -m bench.ship_encoding --steps 12 --name ship_encoding-12steps   # 0.25 s at 50 steps/s

Method. bench/gpu_rates.py's stand-in engine (its hooks real, vLLM's dataclasses) runs ``--steps`` steps at a time (5:
0.1 s at 50 steps/s) and the real shipper collects each message (``Shipper.collect``), as the engine process does
every ship interval, its steps as the hooks recorded them. Each message is then encoded five ways, alternating in one
process, the first four pickled by the shipper's ``dumps_shipment`` (without its pauses): ``packed``, as shipped
(``Shipper._steps``: each draft dict packed, ``wire.PackedDrafts``); ``dicts``, as shipped before (the draft dicts
pickled as they are: the baseline every other way is compared with); ``without_ids``, every engine and worker step's
draft dict replaced by what counting needs without the ids (the request ids and the drafts' lengths); ``first_last``,
those plus what the dummy-draft rule (``draft_shapes``, the only reader of the ids) needs: each row's first and last
id and the whole rows whose last id is their first; and ``marshal``, the per-step records as plain tuples in
``marshal.dumps`` groups of four (marshal's C writer, faster than pickle on builtin types; no references shared across
groups), the rest pickled as ``dicts``. Each conversion, the cached requests' included, is done in the timed section,
as the shipper would. (Results before 2026-12-03's packing call ``dicts`` "shipped" and have no ``packed``.) Each way is
timed warm (the message pickled just before) and cold (64 MB of other memory touched first: the engine thread's work
between two shipments evicts the records from the caches). Thread CPU per engine step; the result is the mean of each
way and its paired difference from ``dicts`` with a 95 % t interval. Results: bench/results/ship_encoding.json.
"""

from __future__ import annotations

import argparse
import marshal
import statistics
import sys
import time
from itertools import compress
from operator import eq, itemgetter

from bench.common import SCRATCH, loadavg, write_result
from bench.gpu_rates import mean_ci
from bench.pipeline_replay import STEPS_A_MESSAGE, stand_in_messages


def messages(batch: int, n: int, steps: int = STEPS_A_MESSAGE) -> list[dict]:
    """``n`` messages the real shipper collected from the stand-in engine at ``batch``, k 7, their engine and worker
    steps as the hooks recorded them (``Shipper._steps`` not applied: each way converts them itself)."""
    from spectrace.recorder.shipper import Shipper

    convert = Shipper._steps
    Shipper._steps = staticmethod(lambda engine, worker: (engine, worker))
    try:
        return stand_in_messages(batch, n, SCRATCH / "ship_encoding" / "store", lambda shipper: dict(vars(shipper.collect())),
                                 steps)
    finally:
        Shipper._steps = convert


def _dumps(message: dict) -> bytes:
    """A message (a shipment's fields, some converted) as the shipper pickles a shipment (``wire.dumps_shipment``)."""
    from spectrace.recorder import wire

    return wire.dumps_shipment(wire.Shipment(**message))


def dicts(message: dict) -> dict:
    """The message as shipped before the packing: the cached requests' two fields, the draft dicts as they are."""
    from spectrace.recorder.verify.capture import Cached

    out = dict(message)
    if "engine" in out:
        out["engine"] = [s._replace(cached=Cached(s.cached.req_ids, s.cached.num_computed_tokens))
                         if s.cached is not None else s for s in out["engine"]]
    return out


def packed(message: dict) -> dict:
    """The message as shipped (``Shipper._steps``)."""
    from spectrace.recorder.shipper import Shipper

    out = dict(message)
    out["engine"], out["worker"] = Shipper._steps(message.get("engine", []), message.get("worker", []))
    return out


def without_ids(message: dict, shape_of=None) -> dict:
    """The message with each step's draft dict as (request ids, drafts' lengths): what counting reads of it."""
    shapes: dict[int, tuple] = {}

    def shape(drafts: dict) -> tuple:
        got = shapes.get(id(drafts))
        if got is None:
            got = shapes[id(drafts)] = (shape_of or _lengths)(drafts)
        return got

    out = dicts(message)
    out["engine"] = [step._replace(drafts=shape(step.drafts)) for step in out.get("engine", ())]
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


def marshalled(message: dict) -> bytes:
    """The message's per-step records as plain tuples, ``marshal.dumps``'d in groups of four; the rest pickled."""
    message = dicts(message)
    records = {"engine": [(*s[:6], tuple(s.cached) if s.cached is not None else None, *s[7:])
                          for s in message.get("engine", ())],
               "worker": [tuple(s) for s in message.get("worker", ())],
               "requests": [(tuple(r[0]), r[1], r[2]) for r in message.get("requests", ())]}
    parts = [_dumps({k: v for k, v in message.items() if k not in records})]
    for rows in records.values():
        parts += [marshal.dumps(rows[i:i + 4]) for i in range(0, len(rows), 4)]
    return b"".join(parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--messages", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=10, help="passes over the messages, each way, alternating")
    parser.add_argument("--steps", type=int, default=STEPS_A_MESSAGE, help="engine steps a message (default 5)")
    parser.add_argument("--name", default=None,
                        help="results file bench/results/<name>.json (default ship_encoding[-BATCH])")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.messages < 1 or args.steps < 1 or args.rounds < 2:
        parser.error("--batch, --messages and --steps must be at least 1, --rounds at least 2")
    import numpy as np

    from spectrace.recorder import wire

    wire.YIELD_S = 0  # the pauses are the same either way; pickling alone is compared
    print(f"collecting {args.messages} messages at batch {args.batch} ...", flush=True)
    recorded = messages(args.batch, args.messages, args.steps)
    other = np.ones(8_000_000)  # 64 MB

    def timed(encode, message, cold: bool) -> float:
        if cold:
            other.sum()
            other[::8] += 1.0
        start = time.thread_time_ns()
        encode(message)
        return (time.thread_time_ns() - start) / 1e3 / args.steps

    ways = {"dicts": lambda m: _dumps(dicts(m)), "packed": lambda m: _dumps(packed(m)),
            "without_ids": lambda m: _dumps(without_ids(m)),
            "first_last": lambda m: _dumps(first_last(m)), "marshal": marshalled}
    load_before = loadavg()
    per_step: dict[str, dict[str, list[float]]] = {c: {w: [] for w in ways} for c in ("warm", "cold")}
    for r in range(args.rounds):
        order = list(ways) if r % 2 == 0 else list(reversed(ways))
        for cache in ("warm", "cold"):
            for way in order:
                ts = []
                for message in recorded:
                    if cache == "warm":
                        ways[way](message)
                    ts.append(timed(ways[way], message, cache == "cold"))
                per_step[cache][way].append(statistics.fmean(ts))
    result: dict = {"batch": args.batch, "k": 7, "messages": args.messages, "steps_a_message": args.steps,
                    "rounds": args.rounds,
                    "bytes_a_message": {w: statistics.fmean(len(ways[w](m)) for m in recorded)
                                        for w in ways}}
    for cache, ways_us in per_step.items():
        result[cache] = {"us_per_step": {w: statistics.fmean(xs) for w, xs in ways_us.items()},
                         **{f"{w}_minus_dicts_us": mean_ci([a - b for a, b in zip(ways_us[w], ways_us["dicts"])])
                            for w in ways if w != "dicts"}}
    result["load_before"], result["load_after"] = load_before, loadavg()
    written = write_result(args.name or ("ship_encoding" if args.batch == 256 else f"ship_encoding-{args.batch}"), result)
    for cache in ("warm", "cold"):
        us = result[cache]["us_per_step"]
        print(f"{cache}: pickling a step's draft dicts {us['dicts']:.1f} µs; " + "; ".join(
            f"{w} {us[w]:.1f} µs ({d['mean']:+.1f}, {d['ci95'][0]:+.1f} … {d['ci95'][1]:+.1f})"
            for w in ways if w != "dicts" for d in [result[cache][f"{w}_minus_dicts_us"]]) + f" ({args.rounds} rounds)")
    print("bytes a message: " + ", ".join(f"{w} {b:.0f}" for w, b in result["bytes_a_message"].items()) + f"; wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
