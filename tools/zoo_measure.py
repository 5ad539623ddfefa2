"""Acceptance of the trained zoo's drafters by context length (vLLM's own counters, greedy).

    PYTHONPATH=$PWD .venv/bin/python -m tools.zoo_measure [--k 3] [--chars 100,400,1200]

Serves the zoo's target with the DFlash drafter declared as shipped and as fixed
(``spectrace.testing.trained.dflash_declared``) and with the EAGLE-3 drafter, one engine each,
on held-out prompts of each length; prints drafted / accepted per position. Untraced: these
are the drafters' numbers, not spectrace's.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.zoo_measure")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--chars", default="100,400,1200")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--drafters", default="as-shipped,fixed,eagle3")
    args = parser.parse_args(argv)

    from spectrace.testing import trained
    from spectrace.testing.engine import EngineSpec, run_engines

    zoo = trained.paths()
    scratch = Path(tempfile.mkdtemp(prefix="zoo-measure-"))
    drafters = {}
    for name in args.drafters.split(","):
        if name == "eagle3":
            drafters[name] = {"method": "eagle3", "model": zoo["eagle3"]}
        elif name == "speculators-dflash":
            drafters[name] = {"method": "dflash", "model": zoo["dflash"]}
        else:
            drafters[name] = {"method": "dflash", "model": str(trained.dflash_declared(scratch / name, name))}
    specs = []
    for chars in map(int, args.chars.split(",")):
        prompts = trained.prompts(args.prompts, chars)
        for name, spec in drafters.items():
            specs.append(EngineSpec(
                name=f"{name}@{chars}", target=zoo["target"], prompts=prompts, max_tokens=args.max_tokens,
                speculative={**spec, "num_speculative_tokens": args.k}, max_model_len=2048,
            ))
    results = run_engines(specs, store=None, traced=False, scratch=scratch)
    rows = []
    for name, r in results.items():
        if not r.ok:
            print(f"{name}: failed: {r.error}")
            continue
        m = r.metrics
        drafted, accepted = m["vllm:spec_decode_num_draft_tokens"], m["vllm:spec_decode_num_accepted_tokens"]
        per_pos = m["vllm:spec_decode_num_accepted_tokens_per_pos"]
        drafts = m["vllm:spec_decode_num_drafts"]
        row = {"engine": name, "drafted": drafted, "accepted": accepted, "rate": round(accepted / max(drafted, 1), 4),
               "per_position": [round(a / max(drafts, 1), 3) for a in per_pos],
               "mean_length": round(1 + accepted / max(drafts, 1), 2)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
