"""Hardening 3, item 2 for ``spectrace doctor``: text from outside (an argument it quotes, a path it names) reaches
the terminal escaped, never as a terminal command. The CLI as a subprocess; the bytes it writes are asserted. No
vLLM: both errors come before doctor imports it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OSC = "\x1b]2;PWNED\x07\x1b[2J"  # retitles the window, clears the screen
OSC_SHOWN = b"\\x1b]2;PWNED\\x07\\x1b[2J"


def _doctor(*argv) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SPECTRACE", None)
    return subprocess.run([sys.executable, "-m", "spectrace.cli", "doctor", *argv], capture_output=True, timeout=60,
                          env=env)


def _no_control(data: bytes) -> None:
    bad = sorted({c for c in data.decode() if (ord(c) < 32 and c != "\n") or 0x7f <= ord(c) <= 0x9f})
    assert not bad, (bad, data)


def test_an_argument_argparse_quotes_reaches_doctors_one_line_escaped():
    done = _doctor(f"--max={OSC}\r fake row")  # ambiguous (--max-model-len, --max-num-seqs, ...): quoted whole
    assert done.returncode == 2 and done.stdout == b""
    _no_control(done.stderr)
    assert done.stderr.startswith(b"spectrace: error: doctor: ambiguous option: --max=" + OSC_SHOWN + b"\\r fake row")
    assert done.stderr.count(b"\n") == 1  # one line


def test_a_path_doctor_names_reaches_its_one_line_escaped(tmp_path):
    target = tmp_path / f"target{OSC}\r\nspectrace: fake"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": "Qwen3ForCausalLM"}))  # not a list
    done = _doctor("--target", str(target), "--draft", str(target))
    assert done.returncode == 2 and done.stdout == b""
    _no_control(done.stderr)
    assert done.stderr.count(b"\n") == 1
    # cli.main's line: whitespace (the CR and LF) folded into one space, every other control escaped
    assert done.stderr.startswith(b"spectrace: error: "), done.stderr
    assert OSC_SHOWN + b" spectrace: fake/config.json: architectures must be a list" in done.stderr, done.stderr
