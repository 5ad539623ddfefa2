"""Check spectrace's hook sites against a vLLM that cannot run here (0.33.0: a CUDA wheel, no CPU build).

    python -m bench.check_vllm_static --version 0.33.0      (make check-vllm-0.33)

1. ``pip download --no-deps vllm==VERSION`` into a scratch directory (kept between runs) and unpack it there:
   the installed source is read, nothing of it is copied into the repository.
2. Every vLLM hook's site, parameters, returned tuple and the fields its capture reads are checked
   statically (:func:`spectrace.tracer.support.static_check`, the same checks a hook runs when it installs).
3. ``spectrace doctor`` is tried against that vLLM (the unpacked wheel first on ``PYTHONPATH``, this venv's
   torch and dependencies): whether its config path imports and resolves on a CPU machine.

The result goes to ``bench/results/vllm-VERSION-check.json`` and the README's version table reads it.
Exit code 1 when a hook site does not fit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from spectrace.tracer import support
from spectrace.tracer.stages import all_hooks

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"

# Published config.json fields of Qwen3-8B and of a 5-layer DFlash drafter that declares a window without
# use_sliding_window (the shape that started this project): doctor should name SWA_DROPPED.
TARGET = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 36,
    "vocab_size": 151936, "max_position_embeddings": 40960, "max_window_layers": 36, "sliding_window": None,
    "use_sliding_window": False, "rope_theta": 1000000, "rms_norm_eps": 1e-06, "hidden_act": "silu",
    "tie_word_embeddings": False, "attention_bias": False, "torch_dtype": "bfloat16",
}  # fmt: skip
DRAFT = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 5,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000, "rms_norm_eps": 1e-06,
    "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False, "dtype": "bfloat16",
    "block_size": 16, "sliding_window": 2048,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
}  # fmt: skip


def unpack(version: str, scratch: Path) -> Path:
    scratch.mkdir(parents=True, exist_ok=True)
    wheels = sorted(scratch.glob(f"vllm-{version}-*.whl"))
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", f"vllm=={version}", "-d", str(scratch)],
            check=True,
        )
        wheels = sorted(scratch.glob(f"vllm-{version}-*.whl"))
    root = scratch / "unpacked"
    if not (root / "vllm" / "__init__.py").is_file():
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extractall(root)
    return root


def try_doctor(root: Path, runner: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="spectrace-doctor-") as tmp:
        for name, config in {"Qwen3-8B": TARGET, "Qwen3-8B-DFlash": DRAFT}.items():
            Path(tmp, name).mkdir()
            Path(tmp, name, "config.json").write_text(json.dumps(config))
        env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1"}
        cmd = [sys.executable, "-m", "spectrace.cli", "doctor", "--target", f"{tmp}/Qwen3-8B", "--draft", f"{tmp}/Qwen3-8B-DFlash",
               "--method", "dflash", "--num-speculative-tokens", "7", "--runner", runner, "--json"]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    out = {"runner": runner, "exit_code": proc.returncode}
    try:
        report = json.loads(proc.stdout)
        out["vllm_version"] = report.get("vllm_version") or report.get("versions", {}).get("vllm")
        out["findings"] = [f"{f['code']}: {f['message']}" for f in report.get("findings", [])]
    except (json.JSONDecodeError, AttributeError, TypeError):
        out["output"] = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.check_vllm_static")
    parser.add_argument("--version", default="0.33.0")
    parser.add_argument("--scratch", type=Path, help="where the wheel is downloaded and unpacked (default: /tmp/spectrace-vllm-VERSION)")
    args = parser.parse_args(argv)
    root = unpack(args.version, args.scratch or Path(tempfile.gettempdir(), f"spectrace-vllm-{args.version}"))
    problems = support.static_check(root, all_hooks())
    for name, found in problems.items():
        print(f"{'ok  ' if not found else 'FAIL'} {name}" + ("" if not found else ": " + "; ".join(found)))
    doctor = [try_doctor(root, runner) for runner in ("v1", "v2")]
    for d in doctor:
        print(f"doctor --runner {d['runner']}: exit {d['exit_code']}", *d.get("findings", d.get("output", [])), sep="\n  ")
    result = {"version": args.version, "source": f"vllm=={args.version} wheel, unpacked", "hooks": problems, "doctor": doctor}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"vllm-{args.version}-check.json").write_text(json.dumps(result, indent=1) + "\n")
    return 1 if any(problems.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
