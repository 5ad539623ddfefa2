"""What an idle traced process costs with ``SPECTRACE_PIPELINE=process``: its own CPU and its pipeline process's.

    .venv/bin/python -m bench.idle                  # 4 pairs of 10 s windows (~2 min)
    .venv/bin/python -m bench.idle --pairs 6 --seconds 20

Method. Each run, in a fresh process: the runtime in the shipped shape (a pipeline process, default settings), a run
and a role set as an engine core sets them, one flush (the state and the start span shipped), then ``--seconds``
with nothing recorded; the CPU time (/proc's schedstat, in nanoseconds) of the traced process, its threads summed,
and of its pipeline process over that window, as a share of one core. Runs alternate the shipper as shipped (an idle
process sends nothing, and its wait doubles up to ``shipper.IDLE_WAIT_S``) with ``IDLE_WAIT_S = 0`` (every wake
sends the unchanged state: ten a second at 0.1 s, the behaviour before; four at today's 0.25 s), ordered as
shipped/before, before/shipped, ... (ABBA); the result is the mean paired difference with a 95 % t interval. No
engine runs: this is spectrace's cost on an idle server. Results: bench/results/idle.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO, loadavg, run_in_checkout, write_result
from bench.gpu_rates import _proc_cpu_s, mean_ci

CHILD = "import sys\nfrom bench.idle import main\nsys.exit(main(sys.argv[1:]))"  # one run, fresh


def one_run(shipper_as: str, seconds: float) -> dict:
    from spectrace.settings import Settings
    from spectrace.recorder import runtime
    from spectrace.recorder import shipper as shipper_module
    from spectrace.recorder.verify import VerifyCapture

    if shipper_as == "before":
        shipper_module.IDLE_WAIT_S = 0
    with tempfile.TemporaryDirectory(prefix="spectrace-idle-") as tmp:
        settings = Settings(enabled=True, dir=Path(tmp) / "store", metrics_dir=Path(tmp) / "metrics",
                            pipeline="process")
        rt = runtime.start(settings, hooks=[], make_capture=VerifyCapture)
        try:
            rt.set_run(runtime.Run(run_id="idle", traceparent=""))
            rt.enter_role("engine_core")
            rt.flush()
            time.sleep(1.0)
            shipper = rt.pipeline.shipper
            child = shipper.proc.pid
            me = os.getpid()
            own0, child0, sent0 = _proc_cpu_s(me), _proc_cpu_s(child), shipper.messages
            time.sleep(seconds)
            own, piped, sent = _proc_cpu_s(me) - own0, _proc_cpu_s(child) - child0, shipper.messages - sent0
        finally:
            runtime.stop()
    return {"engine_pct_core": own / seconds * 100, "pipeline_pct_core": piped / seconds * 100,
            "messages_a_second": sent / seconds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0, help="the idle window of each run")
    parser.add_argument("--run", choices=("shipped", "before"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pairs < 2:
        parser.error("--pairs must be at least 2 (an interval needs two pairs)")
    if not args.seconds > 0:
        parser.error("--seconds must be above 0")
    if args.run:  # a child: one run
        print("RESULT " + json.dumps(one_run(args.run, args.seconds)))
        return 0
    load_before = loadavg()
    runs: dict[str, list[dict]] = {"shipped": [], "before": []}
    for i in range(args.pairs):
        for shipper_as in (("shipped", "before") if i % 2 == 0 else ("before", "shipped")):
            runs[shipper_as].append(run_in_checkout(REPO, CHILD, ["--run", shipper_as, "--seconds", str(args.seconds)],
                                                    "idle", f"{shipper_as} run"))
        print(f"pair {i + 1}/{args.pairs}: " + ", ".join(
            f"{name} {r[-1]['engine_pct_core']:.3f} % + {r[-1]['pipeline_pct_core']:.3f} % of a core"
            for name, r in runs.items()), flush=True)
    result: dict = {"pairs": args.pairs, "seconds": args.seconds, "runs": runs, "load_before": load_before}
    for key in ("engine_pct_core", "pipeline_pct_core", "messages_a_second"):
        result[key] = {name: statistics.fmean(r[key] for r in rs) for name, rs in runs.items()}
        result[f"{key}_shipped_minus_before"] = mean_ci(
            [a[key] - b[key] for a, b in zip(runs["shipped"], runs["before"])])
    result["load_after"] = loadavg()
    written = write_result("idle", result)
    for key, what in (("engine_pct_core", "the traced process"), ("pipeline_pct_core", "its pipeline process")):
        d = result[f"{key}_shipped_minus_before"]
        print(f"{what}: shipped {result[key]['shipped']:.3f} %, before {result[key]['before']:.3f} % of a core; "
              f"difference {d['mean']:+.3f} points ({d['ci95'][0]:+.3f} … {d['ci95'][1]:+.3f}, {args.pairs} pairs)")
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
