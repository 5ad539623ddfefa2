"""What k pays, predicted from one run vs measured at every k (issue #26), in alternating windows.

    .venv/bin/python -m bench.speedup_by_k            # four drafters, k = 0..5, 5 rounds (~30 min on 2 cores)
    .venv/bin/python -m bench.speedup_by_k --quick    # the noisy drafter only, 2 rounds

Why windows. This 2-core VM drifts on the scale of seconds (bench/ab_windows.py measured it), and engines run
one after another disagreed by ±20 % round to round: a slow stretch that falls on one engine and not on the
other moves a ratio of two CPU times as much as the model's error. So every engine of a drafter is built once,
each in its own process (``bench.engine_server``), and they generate in turn, one ``generate`` call (a window)
each, in ABBA order (A B B A: a linear drift hits both alike), while the others wait idle.

Prediction. Two traced engines of the drafter, no speculation and k = 5, write into one store; they generate in
ABBA windows like the rest, so the step times that price step(0) (the run without drafts: ``decode_steps``) and
those at k = 5 are taken over the same stretches of the machine's time. After the rounds they flush and stop, and
``spectrace.audit.rules.speedup.from_store`` predicts every k' from the k = 5 run: ``baseline`` (priced with the run without
drafts) and ``fit`` (the run alone).

Measurement. Untraced engines at k' = 0..5 (same target, drafter and prompts, greedy, ``ignore_eos``): for each
k', ABBA windows of no speculation and k' in every round; each pair of adjacent windows gives one ratio, the CPU
time of the window without speculation over the window at k' (one process each, multiprocessing off: frontend,
engine core and worker on one clock). The measured speed-up is the geometric mean of a k''s ratios with a 95 %
confidence interval (t distribution over the log ratios, bench.ab_windows.summary).

Workload: a serving steady state, not a closed batch. ``--requests`` requests whose lengths cycle through
:data:`LENGTHS`, ``max_num_seqs`` 8: requests finish one at a time at every k (k = 0 included), a new one is
admitted in the step after, so the batch stays full and every k pays its refills the same way. (A closed batch of
equal requests instead measures its own artefacts: at k = 0 every request finishes in the same step and the next
eight prefill together, while with speculation they finish apart, and the last wave drains at a shrinking batch —
about a fifth of the steps at k = 5 in the first version of this benchmark, at half the tokens per step.)

Drafters: ``trained`` (the trained zoo's DFlash drafter, window declared, on its corpus' prompts: what k pays
on a drafter someone could deploy), ``noisy`` (the zoo target plus 3 % noise: intermediate acceptance, as costly as the target),
``cheap`` (the first two layers of a target whose later layers add little: intermediate acceptance at a
quarter of the cost), ``self`` (the target drafting for itself, 100 %), ``seeded`` (another seed: ~0 %).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics

from bench.common import RESULTS, SCRATCH, loadavg, write_result

K = 5
LENGTHS = (20, 28, 36, 44, 52)  # max_tokens per request, cycled (requests finish one at a time)
WORDS = "the quick brown fox jumps over a lazy dog once upon a time there was hello world".split()
WITHIN = 0.15  # the goal of issue #26: every predicted speed-up within ±15 % of the measured one


def prompts(n: int) -> list[str]:
    return [" ".join(WORDS[i % len(WORDS):] + WORDS[: i % len(WORDS)])[: 16 + 5 * (i % 9)] for i in range(n)]


def build(root):
    from spectrace.testing.models import build_zoo, noisy_copy, shallow_target

    from spectrace.testing import trained

    zoo = build_zoo(root / "zoo")
    shallow = shallow_target(root / "shallow-target", zoo["target"])
    return {
        "trained": (trained.paths()["target"], trained.dflash_declared(root / "trained-dflash", "fixed")),
        "noisy": (zoo["target"], noisy_copy(root / "noisy", zoo["target"], scale=0.03)),
        "cheap": (shallow, noisy_copy(root / "cheap", shallow, scale=0.0, keep_layers=2)),
        "self": (zoo["target"], zoo["target"]),
        "seeded": (zoo["target"], zoo["draft_seeded"]),
    }


def specs(name, target, drafter, ks, *, requests, repeat, batch=8):
    from spectrace.testing import trained
    from spectrace.testing.engine import EngineSpec

    sampling = [{"ignore_eos": True, "max_tokens": n} for n in LENGTHS]
    # the trained zoo's DFlash drafter (spectrace/testing/zoo) on held-out prompts of its own corpus
    method, asked = ("dflash", trained.prompts(requests, 200)) if name == "trained" else ("draft_model", prompts(requests))

    def spec(k):
        speculative = {"method": method, "model": str(drafter), "num_speculative_tokens": k} if k else None
        return EngineSpec(name=f"{name}-k{k}", target=str(target), speculative=speculative, prompts=asked,
                          max_tokens=max(LENGTHS), repeat=repeat, sampling=sampling,
                          extra_llm_kwargs={"max_num_seqs": batch})  # fmt: skip

    return [spec(k) for k in ks]


def compare(predicted: list[dict], measured: dict[int, dict]) -> dict:
    """Each predicted k' against its measured speed-up (geometric mean of the window ratios, 95 % interval)."""
    from spectrace.audit.rules.speedup import best

    rows = []
    for row in predicted:
        if row["k"] in measured:
            m = measured[row["k"]]
            rows.append({**row, "measured": round(m["ratio"], 4), "measured_ci95": [round(x, 4) for x in m["ci95"]],
                         "error": round(row["speedup"] / m["ratio"] - 1, 4),
                         "error_ci95": [round(row["speedup"] / m["ci95"][1] - 1, 4), round(row["speedup"] / m["ci95"][0] - 1, 4)]})
    ratios = {k: m["ratio"] for k, m in measured.items()}
    best_measured = max(ratios, key=ratios.get)
    pick = best(predicted)
    within = [k for k in range(1, K + 1) if k in measured]
    return {"rows": rows, "measured_best": best_measured, "predicted_best": pick["k"] if pick else None,
            "pick_within": round(ratios[pick["k"]] / ratios[best_measured], 4) if pick and pick["k"] in ratios else None,
            "within": sum(1 for r in rows if r["k"] in within and abs(r["error"]) <= WITHIN), "of": len(within)}


class Engine:
    """One ``bench.engine_server`` child: an engine kept alive, generating when told."""

    def __init__(self, spec, env: dict[str, str], log):
        import subprocess
        import sys
        from dataclasses import asdict

        self.name = spec.name
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.engine_server", json.dumps(asdict(spec))], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)

    def _answer(self) -> dict:
        for line in self.proc.stdout:  # vLLM's own lines may come through stdout too
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"engine {self.name} exited ({self.proc.wait()}) before answering")

    def ready(self) -> None:
        if not self._answer().get("ready"):
            raise RuntimeError(f"engine {self.name} did not start")

    def gen(self) -> dict:
        """One window: ``{"cpu": s, "wall": s, ...}`` (``bench.engine_server``)."""
        self.proc.stdin.write("gen\n")
        self.proc.stdin.flush()
        answer = self._answer()
        if "cpu" not in answer:
            raise RuntimeError(f"engine {self.name}: {answer}")
        return answer

    def quit(self) -> str | None:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        run_id = self._answer().get("run_id")
        self.proc.wait(timeout=120)
        return run_id


def abba(a: Engine, b: Engine) -> dict[str, list[float]]:
    """One ABBA block: two ratios of ``a``'s time over ``b``'s, each from adjacent windows, in CPU time (the
    measure) and in wall time (what a user waits; the model prices host wall time per step)."""
    a1, b1, b2, a2 = a.gen(), b.gen(), b.gen(), a.gen()
    return {clock: [a1[clock] / b1[clock], a2[clock] / b2[clock]] for clock in ("cpu", "wall")}


def run_drafter(name, target, drafter, root, *, requests, rounds, log, batch=8) -> dict:
    import spectrace.store
    from bench.ab_windows import summary
    from spectrace.audit.rules.speedup import from_store
    from spectrace.testing.engine import base_env

    store = root / f"store-{name}"
    shutil.rmtree(store, ignore_errors=True)  # this drafter's runs only (the baseline is looked up by target)
    traced_env = base_env(store, traced=True, cache_root=root / "vllm-cache")
    plain_env = base_env(None, traced=False, cache_root=root / "vllm-cache")
    traced = {k: Engine(spec, traced_env, log)
              for k, spec in zip((0, K), specs(name, target, drafter, [0, K], requests=requests, repeat=1, batch=batch))}
    plain = {k: Engine(spec, plain_env, log)
             for k, spec in enumerate(specs(name, target, drafter, range(K + 1), requests=requests, repeat=1, batch=batch))}
    for engine in [*traced.values(), *plain.values()]:  # built one after another: each reports ready in turn
        engine.ready()
    for engine in [*traced.values(), *plain.values()]:  # one warm-up window each
        engine.gen()
    ratios: dict[int, list[float]] = {k: [] for k in range(1, K + 1)}
    walls: dict[int, list[float]] = {k: [] for k in range(1, K + 1)}
    traced_ratio: list[float] = []
    for rnd in range(rounds):
        traced_ratio += abba(traced[0], traced[K])["cpu"]
        for k in (range(1, K + 1) if rnd % 2 == 0 else reversed(range(1, K + 1))):
            got = abba(plain[0], plain[k])
            ratios[k] += got["cpu"]
            walls[k] += got["wall"]
        print(name, "round", rnd, {k: round(statistics.fmean(v[-2:]), 3) for k, v in ratios.items()}, flush=True)
    run_ids = {k: engine.quit() for k, engine in traced.items()}
    for engine in plain.values():
        engine.quit()
    con = spectrace.store.open(store)
    predicted, alone = from_store(con, run_ids[K]), from_store(con, run_ids[K], baseline=False)
    decode_only = from_store(con, run_ids[K], chunks=False)
    worker_only = from_store(con, run_ids[K], host=False)  # the model before host time was priced (issue #36)
    host_share = _host_share(con, run_ids[K])
    con.close()
    measured = {0: {"ratio": 1.0, "ci95": [1.0, 1.0]}, **{k: summary(v) for k, v in ratios.items()}}
    measured_wall = {0: {"ratio": 1.0, "ci95": [1.0, 1.0]}, **{k: summary(v) for k, v in walls.items()}}
    return {"baseline": compare(predicted, measured), "decode_only": compare(decode_only, measured),
            "worker_only": compare(worker_only, measured), "host_share": host_share,
            "baseline_wall": compare(predicted, measured_wall), "decode_only_wall": compare(decode_only, measured_wall),
            "fit": compare(alone, measured), "chunk_share": predicted[0]["chunk_share"] if predicted else None,
            "measured": {k: {key: m[key] for key in ("ratio", "ci95")} | {"pairs": len(ratios.get(k, []))}
                         for k, m in measured.items()},
            "traced_speedup_k5": summary(traced_ratio)}  # the traced engines' own CPU ratio, k = 0 over k = 5


def _host_share(con, run_id: str) -> dict:
    """The traced run's host time per step outside the worker (engine core, frontend) against the worker's step."""
    host = dict(con.execute("SELECT process_role, sum(host_ns) / sum(steps) / 1e6 FROM host_steps WHERE run_id = ? "
                            "GROUP BY ALL", [run_id]).fetchall())
    worker = con.execute("SELECT sum(step_ns) / sum(steps) / 1e6 FROM speculation_steps WHERE run_id = ?", [run_id]).fetchone()[0]
    return {"host_ms": {role: round(ms, 4) for role, ms in host.items()}, "worker_step_ms": round(worker or 0, 4)}


MODELS = {  # the model's variants, as spectrace.audit.rules.speedup.from_store prices them (reprice)
    "baseline": {},  # as shipped: host time and the tokens a request-step gives
    "worker_only": {"host": False},
    "accepted_length": {"emitted": False},  # host time priced, per accepted length
    "before_36": {"host": False, "emitted": False},  # the worker's step, per accepted length
}


def reprice(name: str) -> None:
    """Price a finished run's traced k = 5 engine again with every model variant (:data:`MODELS`), from the stores
    the run left under the bench scratch folder, against the windows it measured; written back into the results."""
    import spectrace.store
    from spectrace.audit.rules.speedup import from_store

    path = RESULTS / f"{name}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"speedup_by_k: cannot read {path}: {exc}") from None
    root = SCRATCH / "speedup-by-k"
    for drafter, got in data["results"].items():
        store = root / f"store-{drafter}"
        if not store.is_dir():
            print(drafter, "no store left at", store)
            continue
        con = spectrace.store.open(store)
        run_id = con.execute("SELECT run_id FROM runs WHERE num_speculative_tokens = ? ORDER BY started_at DESC LIMIT 1",
                             [K]).fetchone()[0]
        measured = {int(k): m for k, m in got["measured"].items()}
        got["repriced"] = {variant: compare(from_store(con, run_id, **kwargs), measured) for variant, kwargs in MODELS.items()}
        con.close()
        for variant, g in got["repriced"].items():
            print(drafter, variant, "within ±15 %:", g["within"], "of", g["of"],
                  [(r["k"], r["speedup"], r["measured"], r["error"]) for r in g["rows"]], "pick", g["predicted_best"],
                  "measured best", g["measured_best"], flush=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    print("wrote", path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--drafters", nargs="*", default=None)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--name", default="speedup_by_k")
    parser.add_argument("--batch", type=int, default=8, help="max_num_seqs: the serving steady state's batch size")
    parser.add_argument("--reprice", action="store_true",
                        help="price the last run of --name again with every model variant, from the stores it left")
    args = parser.parse_args()
    if args.reprice:
        reprice(args.name)
        return
    names = args.drafters or (["noisy"] if args.quick else ["noisy", "cheap", "self", "seeded"])
    rounds = 2 if args.quick else args.rounds
    root = SCRATCH / "speedup-by-k"
    models = build(root)
    load_before = loadavg()
    results = {}
    with open(root / "engines.log", "w") as log:
        for name in names:
            target, drafter = models[name]
            results[name] = got = run_drafter(name, target, drafter, root, requests=args.requests, rounds=rounds, log=log,
                                              batch=args.batch)
            print(name, "chunk share", got["chunk_share"], flush=True)
            print(name, "host per step", got["host_share"], flush=True)
            for source in ("baseline", "worker_only", "decode_only", "fit", "baseline_wall", "decode_only_wall"):
                g = got[source]
                print(name, source, "within ±15 %:", g["within"], "of", g["of"],
                      json.dumps([(r["k"], r["speedup"], r["measured"], r["measured_ci95"], r["error"]) for r in g["rows"]]),
                      "best measured", g["measured_best"], "predicted", g["predicted_best"], "pick within", g["pick_within"],
                      flush=True)
    path = write_result(args.name, {"k": K, "batch": args.batch, "requests": args.requests, "lengths": list(LENGTHS), "rounds": rounds,
                                    "windows": "ABBA, one generate call each", "load": [load_before, loadavg()],
                                    "results": results})  # fmt: skip
    print("wrote", path)


if __name__ == "__main__":
    main()
