"""The test lanes (tests/conftest.py): every live module is marked vllm, no module of the unit lane
imports torch or vLLM, and the unit lane's guard fails a run that imported one anyway."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import HEAVY, module_marks

TESTS = Path(__file__).parent


def test_every_live_module_is_marked_vllm():
    live = sorted(TESTS.glob("test_*_live.py"))
    assert len(live) >= 17
    assert [path.name for path in live if "vllm" not in module_marks(path)] == []


def test_module_marks_reads_the_forms_in_use(tmp_path):
    path = tmp_path / "test_x.py"
    path.write_text('import pytest\n\npytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("zoo")]\n')
    assert module_marks(path) == {"vllm", "usefixtures"}
    path.write_text("import pytest\n\npytestmark = pytest.mark.server  # PostgreSQL\n")
    assert module_marks(path) == {"server"}
    path.write_text("import pytest\n\n\n@pytest.mark.vllm\ndef test_one():\n    pass\n")
    assert module_marks(path) == set()  # a test's own mark leaves the module in the unit lane's collection


def test_unit_modules_import_neither_torch_nor_vllm():
    """Imported one by one in a fresh process, as the unit lane collects them: the first module after
    which torch or vllm is in sys.modules is the one to mark or make lazy."""
    unit = [path.stem for path in sorted(TESTS.glob("test_*.py")) if not module_marks(path) & {"vllm", "server"}]
    assert "test_audit" in unit and "test_verify_v2" not in unit and "test_lake" not in unit
    code = (
        "import importlib, json, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "for name in sys.argv[2:]:\n"
        "    importlib.import_module(name)\n"
        f"    heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "    if heavy:\n"
        "        print(json.dumps([name, heavy])); break\n"
        "else:\n"
        "    print(json.dumps(None))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(TESTS), "conftest", *unit],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) is None


def test_unit_guard_fails_a_run_that_imports_torch_and_skips_marked_modules(tmp_path):
    """A planted ``torch`` (an empty module) imported by a unit test fails the run; a module marked
    vllm as a whole is not even imported (it would be a collection error)."""
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "torch.py").write_text("")
    (tmp_path / "test_heavy.py").write_text("def test_imports_torch():\n    import torch  # noqa: F401\n")
    (tmp_path / "test_marked.py").write_text("import pytest\nimport no_such_module\n\npytestmark = pytest.mark.vllm\n")
    (tmp_path / "test_light.py").write_text("def test_plain():\n    assert 1 + 1 == 2\n")
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)]
    unit = subprocess.run([*run, "--unit"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert unit.returncode == 1, unit.stdout + unit.stderr
    assert "2 passed" in unit.stdout
    assert "FAILED unit lane: torch imported, first seen after test_heavy.py::test_imports_torch" in unit.stdout
    # the same under two xdist workers (make unit): the worker's finding reaches the controller
    parallel = subprocess.run([*run, "--unit", "-n", "2"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert parallel.returncode == 1, parallel.stdout + parallel.stderr
    assert "FAILED unit lane: torch imported, first seen after test_heavy.py::test_imports_torch" in parallel.stdout
    light = subprocess.run([*run, "--unit", "-k", "plain"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert light.returncode == 0 and "1 passed, 1 deselected" in light.stdout, light.stdout + light.stderr
