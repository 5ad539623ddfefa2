"""What the wheel a production user installs holds: the package without its test harness and the zoo's weights
(docs/architecture.md, "What the wheel holds"), and nothing it runs needs them."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from setuptools import find_packages

from test_imports import _graph

REPO = Path(__file__).resolve().parents[1]


def test_the_wheel_leaves_the_test_harness_and_the_zoo_out():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = config["packages"]["find"]
    packages = find_packages(str(REPO), include=found["include"], exclude=found.get("exclude", ()))
    assert "spectrace.recorder" in packages and "spectrace.collector" in packages and "spectrace.audit.rules" in packages and "spectrace.cli" in packages
    assert not [p for p in packages if p.startswith("spectrace.testing")]
    assert not [d for d in config["package-data"]["spectrace"] if d.startswith("testing")]


def test_nothing_installed_imports_the_test_harness_but_the_demo():
    importers = {name for name, targets in _graph().items()
                 if name.startswith("spectrace") and not name.startswith("spectrace.testing")
                 and any(t.startswith("spectrace.testing") for t in targets)}
    assert importers == {"spectrace.demo"}


def test_the_demo_without_the_harness_says_so_in_one_line(tmp_path):
    # as installed from the wheel: spectrace.testing cannot be imported
    code = "import sys; sys.modules['spectrace.testing'] = None; from spectrace import demo; sys.exit(demo.main(['--dir', sys.argv[1]]))"
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines() == [
        "spectrace: the demo runs from a source checkout (make demo): spectrace.testing and the zoo are not installed "
        "with the package"]
