"""`make demo`: the failure spectrace was built for, reproduced on a laptop CPU.

Builds a tiny Qwen3 target and two DFlash drafters offline, then serves each
with real vLLM and ``SPECTRACE=1``:

- ``drafter-as-shipped`` declares its window the way the seed's drafter did
  (``sliding_window`` with no ``use_sliding_window``): transformers' Qwen3Config
  drops the window and derives every layer as full attention;
- ``drafter-fixed`` declares ``layer_types``, the window and
  ``use_sliding_window: true``: its layers really slide.

Then it prints ``spectrace report`` for both runs. The weights are random, so
both drafters accept almost nothing: the demo is about layout and findings, not
acceptance.

    python -m spectrace.demo [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

WINDOW = 64


def _step(n: int, total: int, text: str) -> None:
    print(f"[{n}/{total}] {text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spectrace.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="demo-data", help="where models, the store and the vLLM log go (default: ./demo-data)")
    args = parser.parse_args(argv)
    root = Path(args.dir).absolute()
    store = root / "store"
    models = root / "models"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from spectrace.queries import report
    from spectrace.store.read import open as open_store
    from spectrace.testing.engine import EngineSpec, run_engines
    from spectrace.testing.models import build_dflash, build_zoo

    started = time.time()
    _step(1, 3, f"building a tiny Qwen3 target and two DFlash drafters in {models}")
    zoo = build_zoo(models / "zoo")
    target = str(zoo["target"])
    shipped = build_dflash(models / "drafter-as-shipped", target_dir=target, sliding_window=WINDOW)
    fixed = build_dflash(
        models / "drafter-fixed",
        target_dir=target,
        layer_types=["sliding_attention"],
        sliding_window=WINDOW,
        use_sliding_window=True,
    )
    print(f"      as shipped: {{\"sliding_window\": {WINDOW}}}  (no use_sliding_window, no layer_types)")
    print(f"      fixed:      {{\"layer_types\": [\"sliding_attention\"], \"sliding_window\": {WINDOW}, \"use_sliding_window\": true}}")

    shutil.rmtree(store, ignore_errors=True)
    log = root / "vllm.log"
    _step(2, 3, f"serving each with real vLLM on CPU, SPECTRACE=1 (about a minute; vLLM's log: {log})")
    specs = [
        EngineSpec(
            name=name,
            target=target,
            speculative={"method": "dflash", "model": str(path), "num_speculative_tokens": 3},
            max_tokens=16,
        )
        for name, path in (("as-shipped", shipped), ("fixed", fixed))
    ]
    results = run_engines(specs, store=store, log_file=log, cache_root=root / "vllm-cache")
    for result in results.values():
        status = "generated" if result.ok else f"failed: {result.error}"
        print(f"      {result.name}: run {result.run_id}, {status} ({result.seconds:.0f} s)")

    _step(3, 3, f"reports from the store at {store}")
    con = open_store(store)
    for result in results.values():
        print()
        print("=" * 100)
        print(f"drafter {result.name}")
        print("=" * 100)
        sys.stdout.write(report.render(con, run_id=result.run_id))
    print()
    print(
        "Both drafters have random weights, so both accept almost nothing: compare the findings and the\n"
        "draft layout, not the acceptance. The as-shipped drafter runs full attention on every layer\n"
        f"(SWA_DROPPED); the fixed one slides with window {WINDOW}."
    )
    print(f"Query it yourself:  spectrace query --dir {store} \"select code, severity, message from findings\"")
    print(f"done in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
