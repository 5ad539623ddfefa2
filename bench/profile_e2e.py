"""Where a traced engine spends its time: py-spy over one bench/e2e child (``pip install py-spy``).

    .venv/bin/python -m bench.profile_e2e [duckdb|otlp|off] [--rounds N]

Records every thread at 250 Hz (``py-spy record --threads --idle --format raw``; with ``--gil``
only the thread holding the GIL, i.e. who keeps the engine thread waiting), then prints
the share of samples with a spectrace frame on the stack and the spectrace functions that
account for them (inclusive), split by thread, then spectrace's own share during generate()
(samples whose innermost spectrace-or-vLLM frame is spectrace's: not the vLLM code it wraps). The raw collapsed stacks are kept under
$SPECTRACE_BENCH_SCRATCH/profile-<config>.txt (default /tmp/spectrace-bench; flame-graph input).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from bench.common import REPO, SCRATCH
from bench.e2e import PROMPTS


def main(argv=None) -> None:
    from spectrace.testing.engine import base_env
    from spectrace.testing.models import build_zoo
    from spectrace.testing.otlp import OtlpReceiver

    parser = argparse.ArgumentParser()
    parser.add_argument("config", nargs="?", default="duckdb", choices=["off", "duckdb", "otlp"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gil", action="store_true", help="sample only the thread holding the GIL (py-spy --gil)")
    args = parser.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    zoo = build_zoo(SCRATCH / "zoo")
    store = SCRATCH / f"profile-store-{args.config}"
    shutil.rmtree(store, ignore_errors=True)
    out = SCRATCH / "profile-child.json"
    raw = SCRATCH / f"profile-{args.config}.txt"  # ~10 MB: kept out of the repository
    SCRATCH.mkdir(parents=True, exist_ok=True)
    request = {
        "target": str(zoo["target"]),
        "speculative": {"method": "draft_model", "model": str(zoo["draft_self"]), "num_speculative_tokens": 5},
        "prompts": PROMPTS, "max_tokens": 192, "rounds": args.rounds, "out": str(out),
    }
    with OtlpReceiver() as receiver:
        env = base_env(store, traced=args.config != "off", cache_root=SCRATCH / "vllm-cache")
        if args.config == "otlp":
            env.update(SPECTRACE_EXPORTER="otlp", OTEL_EXPORTER_OTLP_ENDPOINT=receiver.http_endpoint,
                       OTEL_METRIC_EXPORT_INTERVAL="5000")
        mode = ["--gil"] if args.gil else ["--idle"]
        subprocess.run([py_spy, "record", "--threads", *mode, "-r", "250", "--format", "raw", "-o", str(raw), "--",
                        sys.executable, "-m", "bench.e2e_child", json.dumps(request)],
                       env=env, cwd=REPO, check=True, capture_output=True)
    total = Counter()
    spect = Counter()
    by_func = Counter()
    gen_total = 0
    own = Counter()
    own_leaf = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        count = int(count)
        frames = stack.split(";")
        thread = frames[0]
        total[thread] += count
        names = [f for f in frames if "spectrace/" in f and "bench/" not in f]
        if names:
            spect[thread] += count
            for name in dict.fromkeys(re.sub(r":\d+\)", ")", f) for f in names):
                by_func[(thread, name)] += count
        # during generate() (or on a spectrace thread): is spectrace's own code running? (the innermost
        # frame that belongs to spectrace or vLLM is spectrace's; numpy/pyarrow called by it count too)
        if any("LLM.generate" in f for f in frames) or "spectrace-flush" in thread or "Otel" in thread:
            gen_total += count
            for f in reversed(frames):
                if "spectrace/" in f and "bench/" not in f:
                    own[thread] += count
                    own_leaf[re.sub(r":\d+\)", ")", f)] += count
                    break
                if "vllm/" in f:
                    break
    print(f"{args.config}: samples per thread (share with a spectrace frame on the stack, inclusive)")
    for thread, n in total.most_common(8):
        print(f"  {n:7d}  {100 * spect[thread] / n:6.2f} %  {thread}")
    print("spectrace frames (inclusive samples, % of that thread)")
    for (thread, name), n in by_func.most_common(25):
        print(f"  {100 * n / total[thread]:6.2f} %  {name}   [{thread[:40]}]")
    print(f"during generate(): {gen_total} samples; spectrace's own code (exclusive of the vLLM it wraps):")
    for thread, n in own.most_common():
        print(f"  {100 * n / max(gen_total, 1):6.2f} %  {thread}")
    for name, n in own_leaf.most_common(12):
        print(f"  {n:6d}  {name}")


if __name__ == "__main__":
    main()
