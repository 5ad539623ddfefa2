"""Check spectrace's hook sites against a vLLM that cannot run here (0.33.0, 0.34.0: CUDA wheels, no CPU build).

    python -m bench.check_vllm_static --version 0.34.0      (make check-vllm: 0.33.0 and 0.34.0)
    python -m bench.check_vllm_static --latest              (make check-vllm-latest: the newest vllm on the index)

1. ``pip download --no-deps vllm==VERSION`` into a scratch directory (kept between runs) and unpack it there:
   the installed source is read, nothing of it is copied into the repository. ``--latest`` asks the index
   (``pip index versions vllm``) which version that is.
2. Every vLLM hook's site, parameters, returned tuple and the fields its capture reads are checked
   statically (:func:`spectrace.recorder.support.static_check`, the same checks a hook runs when it installs).
   A hook whose site that vLLM removed on purpose (``Support.gone``: the V1 model runner's, from 0.34) is
   listed as retired, not as a failure.
3. ``spectrace doctor`` is run against that vLLM (the unpacked wheel first on ``PYTHONPATH``, this venv's torch
   and dependencies) on the seed's declaration (a window without ``use_sliding_window``): it must name
   ``SWA_DROPPED``. A CUDA wheel finds no platform on a CPU machine, so vLLM's own ``VLLM_TARGET_DEVICE=cpu``
   selects its CPU platform, and the test suite's Triton-interpreter harness
   (``spectrace/testing/triton_interpreter``) lets that platform's Triton check pass: config resolution and
   the meta-device build are vLLM's own code; the platform's rules are the CPU platform's, not CUDA's. Each
   runner that vLLM has (``--runner v1`` is refused with one line where it has only V2).

4. vLLM's model-inspection subprocess is still ``python -m`` the module the plugin stays off in
   (``spectrace.plugin.INSPECTION_MAIN``), and still loads general plugins: otherwise the plugin's guard no longer
   matches it (a warning line, not a failure: that child would write ``hooks`` rows again, nothing worse).

The result goes to ``bench/results/vllm-VERSION-check.json`` and the README's version table reads it.
Exit code 1 when a hook site does not fit or doctor does not name SWA_DROPPED; what does not fit is printed.
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

from spectrace.recorder import support
from spectrace.recorder.stages import all_hooks

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


def latest_version() -> str:
    """The newest vllm release the package index serves (``pip index versions vllm``)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "vllm"], capture_output=True, text=True,
                          timeout=300)
    first = (proc.stdout.strip().splitlines() or [""])[0]  # "vllm (0.34.0)"
    if proc.returncode != 0 or not first.startswith("vllm (") or not first.endswith(")"):
        raise SystemExit(f"cannot ask the package index for vllm's newest version: {(proc.stderr or first).strip()[:200]}")
    return first[len("vllm ("):-1]


def try_doctor(root: Path, runner: str) -> dict:
    from spectrace.testing.engine import TRITON_INTERPRETER

    with tempfile.TemporaryDirectory(prefix="spectrace-doctor-") as tmp:
        for name, config in {"Qwen3-8B": TARGET, "Qwen3-8B-DFlash": DRAFT}.items():
            Path(tmp, name).mkdir()
            Path(tmp, name, "config.json").write_text(json.dumps(config))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TRITON_INTERPRETER), str(root)]), "HF_HUB_OFFLINE": "1",
               "VLLM_TARGET_DEVICE": "cpu", "TRITON_INTERPRETER_HARNESS": "1"}
        cmd = [sys.executable, "-m", "spectrace.cli", "doctor", "--target", f"{tmp}/Qwen3-8B", "--draft", f"{tmp}/Qwen3-8B-DFlash",
               "--method", "dflash", "--num-speculative-tokens", "7", "--runner", runner, "--json"]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    out = {"runner": runner, "exit_code": proc.returncode}
    try:
        report = json.loads(proc.stdout)
        out["vllm_version"] = report.get("vllm_version") or report.get("versions", {}).get("vllm")
        out["findings"] = [f"{f['code']}: {f['message']}" for f in report.get("findings", [])]
        out["swa_dropped"] = any(f.get("code") == "SWA_DROPPED" for f in report.get("findings", []))
    except (json.JSONDecodeError, AttributeError, TypeError):
        out["output"] = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
    return out


def inspection(root: Path) -> dict:
    """Whether this vLLM's model-inspection child is the one the plugin recognises (step 4 above)."""
    from spectrace.plugin import INSPECTION_MAIN

    path = root / Path(*INSPECTION_MAIN.split(".")).with_suffix(".py")
    source = path.read_text() if path.is_file() else ""
    runs_itself = f'"-m", "{INSPECTION_MAIN}"' in source and 'if __name__ == "__main__"' in source
    return {"module": INSPECTION_MAIN, "runs_as_main": runs_itself, "loads_plugins": "load_general_plugins" in source}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.check_vllm_static")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--version", default="0.34.0")
    which.add_argument("--latest", action="store_true", help="the newest vllm on the package index (release-day drift check)")
    parser.add_argument("--scratch", type=Path, help="where the wheel is downloaded and unpacked (default: /tmp/spectrace-vllm-VERSION)")
    args = parser.parse_args(argv)
    version = latest_version() if args.latest else args.version
    if args.latest:
        print(f"newest vllm on the index: {version} (spectrace's tested range: {support.VLLM_RANGE})")
    root = unpack(version, args.scratch or Path(tempfile.gettempdir(), f"spectrace-vllm-{version}"))
    hooks = all_hooks()
    problems = support.static_check(root, hooks, version)
    retired = support.static_retired(hooks, version)
    for name, found in problems.items():
        print(f"{'ok  ' if not found else 'FAIL'} {name}" + ("" if not found else ": " + "; ".join(found)))
    for name, why in retired.items():
        print(f"gone {name}: {why}")
    doctor = [try_doctor(root, runner) for runner in ("v1", "v2")]
    for d in doctor:
        print(f"doctor --runner {d['runner']}: exit {d['exit_code']}", *d.get("findings", d.get("output", [])), sep="\n  ")
    inspected = inspection(root)
    if not (inspected["runs_as_main"] and inspected["loads_plugins"]):
        print(f"warning: vllm {version}'s model inspection no longer runs `python -m {inspected['module']}` with "
              "plugins loaded: the plugin's guard (spectrace.plugin._inspecting) does not recognise its child")
    result = {"version": version, "source": f"vllm=={version} wheel, unpacked", "hooks": problems, "retired": retired,
              "doctor": doctor, "inspection": inspected}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"vllm-{version}-check.json").write_text(json.dumps(result, indent=1) + "\n")
    unfit = sorted(name for name, found in problems.items() if found)
    named = any(d.get("swa_dropped") for d in doctor)
    print(f"{len(problems) - len(unfit)} of {len(problems)} hook sites fit vllm {version}"
          + (f"; no longer fit: {', '.join(unfit)}" if unfit else "") + (f"; {len(retired)} retired" if retired else "")
          + ("; doctor names SWA_DROPPED" if named else "; doctor did NOT name SWA_DROPPED"))
    return 1 if unfit or not named else 0


if __name__ == "__main__":
    sys.exit(main())
