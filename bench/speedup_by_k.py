"""What k pays, predicted from one run vs measured at every k (issue #26).

    .venv/bin/python -m bench.speedup_by_k            # four drafters, k = 0..5 each (~10 min on 2 cores)
    .venv/bin/python -m bench.speedup_by_k --quick    # the noisy drafter only, one generate per engine

Method. Per drafter, one traced engine at k = 5 gives the prediction (``spectrace.speedup.from_store``: the
expected accepted length at each k' from its per-position counts, the step time at each k' from its worker
step sums), twice: from that run alone (``fit``) and with a traced run of the same target without speculation
in the same store before it (``baseline``: its decode-only steps price step(0), README "What k pays"). Untraced engines at k' = 1..5 and one without speculation (same target, same prompts, greedy,
``ignore_eos``) give the measured speed-up: the CPU time of a generate call without speculation over the
CPU time of the same call at k' (one process, multiprocessing off: frontend, engine core and worker on the
one clock), the fastest of ``--repeat`` calls each, engines in one child one after another. The workload
keeps the engine's batch full (``--requests`` requests, ``max_num_seqs`` 8): a closed batch of equal
requests instead ends on the slowest-accepting request and measures that tail, not the throughput.

Drafters: ``noisy`` (the zoo target plus 3 % noise: intermediate acceptance, as costly as the target),
``cheap`` (the first two layers of a target whose later layers add little: intermediate acceptance at a
quarter of the cost), ``self`` (the target drafting for itself, 100 %), ``seeded`` (another seed: ~0 %).
"""

from __future__ import annotations

import argparse
import json
import shutil

from bench.common import SCRATCH, loadavg, write_result

K = 5
WORDS = "the quick brown fox jumps over a lazy dog once upon a time there was hello world".split()


def prompts(n: int) -> list[str]:
    return [" ".join(WORDS[i % len(WORDS):] + WORDS[: i % len(WORDS)])[: 16 + 5 * (i % 9)] for i in range(n)]


def build(root):
    from spectrace.testing.models import build_zoo, noisy_copy, shallow_target

    zoo = build_zoo(root / "zoo")
    shallow = shallow_target(root / "shallow-target", zoo["target"])
    return {
        "noisy": (zoo["target"], noisy_copy(root / "noisy", zoo["target"], scale=0.03)),
        "cheap": (shallow, noisy_copy(root / "cheap", shallow, scale=0.0, keep_layers=2)),
        "self": (zoo["target"], zoo["target"]),
        "seeded": (zoo["target"], zoo["draft_seeded"]),
    }


def specs(name, target, drafter, ks, *, requests, max_tokens, repeat):
    from spectrace.testing.engine import EngineSpec

    def spec(k):
        speculative = {"method": "draft_model", "model": str(drafter), "num_speculative_tokens": k} if k else None
        return EngineSpec(name=f"{name}-k{k}", target=str(target), speculative=speculative, prompts=prompts(requests),
                          max_tokens=max_tokens, repeat=repeat, sampling=[{"ignore_eos": True}],
                          extra_llm_kwargs={"max_num_seqs": 8})  # fmt: skip

    return [spec(k) for k in ks]


def compare(predicted: list[dict], measured: dict[int, float]) -> dict:
    rows = []
    for row in predicted:
        if row["k"] in measured:
            m = measured[row["k"]]
            rows.append({**row, "measured": round(m, 4), "error": round(row["speedup"] / m - 1, 4)})
    best_measured = max(measured, key=measured.get)
    from spectrace.speedup import best

    pick = best(predicted)
    return {"rows": rows, "measured_best": best_measured, "predicted_best": pick["k"] if pick else None,
            "pick_within": round(measured[pick["k"]] / measured[best_measured], 4) if pick and pick["k"] in measured else None}


def main() -> None:
    import spectrace.store
    from spectrace.speedup import from_store
    from spectrace.testing.engine import run_engines

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--drafters", nargs="*", default=None)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--name", default="speedup_by_k")
    args = parser.parse_args()
    names = args.drafters or (["noisy"] if args.quick else ["noisy", "cheap", "self", "seeded"])
    repeat = 1 if args.quick else args.repeat
    root = SCRATCH / "speedup-by-k"
    models = build(root)
    load_before = loadavg()
    results = {}
    for name in names:
        target, drafter = models[name]
        store = root / f"store-{name}"
        shutil.rmtree(store, ignore_errors=True)  # this benchmark's runs only (the baseline is looked up by target)
        traced = run_engines(specs(name, target, drafter, [0, K], requests=args.requests, max_tokens=args.max_tokens,
                                   repeat=1), store=store, cache_root=root / "vllm-cache")  # fmt: skip
        run_id = traced[f"{name}-k{K}"].run_id
        con = spectrace.store.open(store)
        predicted = from_store(con, run_id)
        alone = from_store(con, run_id, baseline=False)
        untraced = run_engines(specs(name, target, drafter, range(K + 1), requests=args.requests,
                                     max_tokens=args.max_tokens, repeat=repeat),
                               store=None, traced=False, scratch=root, cache_root=root / "vllm-cache")  # fmt: skip
        for result in untraced.values():
            assert result.ok, (result.name, result.error)
        base = untraced[f"{name}-k0"].generate_cpu_seconds
        measured = {k: base / untraced[f"{name}-k{k}"].generate_cpu_seconds for k in range(K + 1)}
        results[name] = {"baseline": compare(predicted, measured), "fit": compare(alone, measured)}
        for source, got in results[name].items():
            print(name, source, json.dumps([(r["k"], r["speedup"], r["measured"], r["error"]) for r in got["rows"]]),
                  "best measured", got["measured_best"], "predicted", got["predicted_best"], flush=True)
    path = write_result(args.name, {"k": K, "requests": args.requests, "max_tokens": args.max_tokens, "repeat": repeat,
                                    "load": [load_before, loadavg()], "results": results})  # fmt: skip
    print("wrote", path)


if __name__ == "__main__":
    main()
