"""What k pays across repeated runs of bench/speedup_by_k.py: is a cell's error the model's or the run's?

    .venv/bin/python -m bench.speedup_by_k_repeats bench/results/speedup_by_k.run1.json ... [--out NAME]

Each run of ``bench.speedup_by_k`` builds fresh engines; on this VM one engine's measured speed-up moved by up to
±10 % from run to run (the noisy drafter at k' = 1: 0.73, 0.80, 0.67), more than one run's own 95 % interval
says. So a cell's error is read over runs: per drafter and k', the geometric mean of the runs' measured speed-ups
with a t interval over the runs, the geometric mean of their predictions (each run's own, the model it shipped
with: ``baseline``, which a run before prefill chunks were measured priced by decode steps alone), and the error of
the one against the other.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.ab_windows import summary
from bench.common import write_result

WITHIN = 0.15


def combine(runs: list[dict]) -> dict:
    drafters = [name for name in runs[0]["results"] if all(name in run["results"] for run in runs)]
    out = {}
    for name in drafters:
        cells = {}
        for k in range(1, runs[0]["k"] + 1):
            measured, predicted = [], []
            for run in runs:
                row = next((r for r in run["results"][name]["baseline"]["rows"] if r["k"] == k), None)
                if row is None:
                    break
                measured.append(row["measured"])
                predicted.append(row["speedup"])
            else:
                m, p = summary(measured), summary(predicted)  # geometric means; m's t interval is over the runs
                low, high = m["ci95"]
                cells[k] = {"measured": round(m["ratio"], 4), "measured_ci95": [round(low, 4), round(high, 4)],
                            "measured_runs": measured, "predicted": round(p["ratio"], 4), "predicted_runs": predicted,
                            "error": round(p["ratio"] / m["ratio"] - 1, 4),
                            "error_ci95": [round(p["ratio"] / high - 1, 4), round(p["ratio"] / low - 1, 4)],
                            "run_errors": [round(p_ / m_ - 1, 4) for p_, m_ in zip(predicted, measured)]}
        measured_at = {0: 1.0, **{k: c["measured"] for k, c in cells.items()}}
        predicted_at = {0: 1.0, **{k: c["predicted"] for k, c in cells.items()}}
        pick, best = max(predicted_at, key=predicted_at.get), max(measured_at, key=measured_at.get)
        out[name] = {"cells": cells, "within": sum(1 for c in cells.values() if abs(c["error"]) <= WITHIN),
                     "predicted_best": pick, "measured_best": best,
                     "pick_within": round(measured_at[pick] / measured_at[best], 4),
                     "run_picks": [(run["results"][name]["baseline"]["predicted_best"],
                                    run["results"][name]["baseline"]["pick_within"]) for run in runs],
                     "resolved_outside": sum(1 for c in cells.values()
                                             if c["error_ci95"][0] > WITHIN or c["error_ci95"][1] < -WITHIN),
                     "of": len(cells)}
    return out


def table(combined: dict) -> str:
    ks = sorted({k for d in combined.values() for k in d["cells"]})
    lines = ["| drafter | " + " | ".join(f"k' = {k}" for k in ks) + " |", "|---|" + "---:|" * len(ks)]
    for name, d in combined.items():
        cells = [f"{c['predicted']:.2f} / {c['measured']:.2f} ({c['measured_ci95'][0]:.2f}–{c['measured_ci95'][1]:.2f}) "
                 f"{c['error']:+.0%}" for c in (d["cells"][k] for k in ks)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fail(message: str) -> None:
    """Bad input: one line on stderr, exit 2 (the project's CLI convention)."""
    print(f"speedup_by_k_repeats: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--out", default="speedup_by_k_repeats")
    args = parser.parse_args()
    if len(args.results) < 2:
        _fail("give two or more result files (the interval is over runs)")
    runs = []
    for path in args.results:
        try:
            runs.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            _fail(f"cannot read {path}: {exc}")
    try:
        combined = combine(runs)
    except (KeyError, TypeError, ValueError) as exc:  # not a bench/speedup_by_k.py result, or runs of other shapes
        _fail(f"not comparable speedup_by_k results ({type(exc).__name__}: {exc})")
    print(table(combined))
    for name, d in combined.items():
        print(name, "within ±15 %:", d["within"], "of", d["of"], "resolvably outside:", d["resolved_outside"],
              "best measured", d["measured_best"], "predicted", d["predicted_best"], "pick within", d["pick_within"],
              "each run's pick (k', within):", d["run_picks"])
    path = write_result(args.out, {"runs": [{"path": str(p), "date": r["date"], "commit": r["machine"].get("commit")}
                                            for p, r in zip(args.results, runs)], "results": combined})
    print("wrote", path)


if __name__ == "__main__":
    main()
