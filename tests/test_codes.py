"""The finding-code registry (``spectrace.audit.codes``): every code the package emits comes
from it, and docs/reference/codes.md and the PromQL code lists are generated from it (fail on drift)."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

import spectrace
from spectrace.audit import codes
from spectrace.dashboards import promql

ROOT = Path(spectrace.__file__).parent
REPO = ROOT.parent
REGISTERED = set(codes.REGISTRY)


def _docs_reference():
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "tools" / "docs_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sources():
    for path in sorted(ROOT.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def test_each_constant_is_its_own_code_and_well_formed():
    constants = {name: value for name, value in vars(codes).items() if name.isupper() and isinstance(value, str)}
    assert {v for k, v in constants.items() if k != "SEVERITIES"} == REGISTERED
    assert all(name == value for name, value in constants.items() if value in REGISTERED)
    assert len(REGISTERED) == 50
    for entry in codes.REGISTRY.values():
        assert entry.severities and set(entry.severities) <= set(codes.SEVERITIES), entry.code
        assert entry.meaning and entry.component, entry.code
        # the docs' severity line names exactly the severities the code is emitted at
        named = {s for s in codes.SEVERITIES if re.search(rf"\b{s}\b", entry.severity_text)}
        assert named == set(entry.severities), entry.code


def test_no_bare_code_literal_outside_the_registry():
    """Every ``code=`` is an expression (a registry constant), and no string equal to a code is
    written anywhere in the package but in the registry."""
    bare, literal_codes = [], []
    for path, tree in _sources():
        where = path.relative_to(REPO)
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg in ("code", "caused_by") and isinstance(node.value, ast.Constant):
                if node.value.value is not None:
                    literal_codes.append(f"{where}:{node.value.lineno} {node.arg}={node.value.value!r}")
            if isinstance(node, ast.Constant) and node.value in REGISTERED and path.name != "codes.py":
                bare.append(f"{where}:{node.lineno} {node.value!r}")
    assert literal_codes == [] and bare == []


def test_the_check_finds_a_planted_literal():
    tree = ast.parse('Finding(code="SWA_DROPPED", severity="error")')
    assert [n.value.value for n in ast.walk(tree) if isinstance(n, ast.keyword) and n.arg == "code"] == ["SWA_DROPPED"]


def test_every_finding_is_built_from_the_registry():
    """Component, severities and the default fix are declared once: only ``Code.finding`` constructs a Finding
    (and the store reads rows back into them)."""
    elsewhere = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                if name == "Finding" and path.relative_to(ROOT).as_posix() != "audit/codes.py":
                    elsewhere.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert elsewhere == []


def test_a_finding_takes_component_and_fix_from_its_code():
    f = codes.finding(codes.TAP_MISMATCH, model_role="draft", message="m")
    assert (f.component, f.severity, f.fix) == ("taps", "error", codes.REGISTRY[codes.TAP_MISMATCH].fix)
    concrete = codes.finding(codes.TOKEN_BUDGET_SHORT, "warning", model_role=None, message="m", fix="raise it to 96")
    assert (concrete.component, concrete.severity, concrete.fix) == ("scheduler", "warning", "raise it to 96")
    with pytest.raises(ValueError, match="VERIFY_DISAGREEMENT is not emitted at severity 'info'"):
        codes.finding(codes.VERIFY_DISAGREEMENT, "info", model_role=None, message="m")


def test_codes_page_is_the_registrys():
    """Fails on drift: run `python -m tools.docs_reference` and commit docs/reference/codes.md."""
    tool = _docs_reference()
    page = (REPO / "docs" / "reference" / "codes.md").read_text(encoding="utf-8")
    assert tool.codes_page() == page, "docs/reference/codes.md is stale: run python -m tools.docs_reference"
    for code in REGISTERED:
        entry = codes.REGISTRY[code]
        assert f"\n## {code}\n" in page and f"- **fix**: {entry.fix or '—'}\n" in page
        assert f"| [`{code}`](#{code.lower()}) | {entry.component} |" in page


def test_causes_name_registered_codes():
    assert len(codes.CAUSES) == 24
    for cause in codes.CAUSES:
        assert cause.codes and set(cause.codes) <= REGISTERED, cause
        # every code the docs print for it is one it lists
        assert set(re.findall(r"`([A-Z][A-Z_]+)`", cause.named_as)) == set(cause.codes), cause
        assert cause.cause and cause.reports


def test_codes_page_changes_with_a_changed_meaning(monkeypatch):
    tool = _docs_reference()
    page = (REPO / "docs" / "reference" / "codes.md").read_text(encoding="utf-8")
    entry = codes.REGISTRY["SWA_DROPPED"]
    monkeypatch.setitem(codes.REGISTRY, "SWA_DROPPED", codes.Code(**{**entry.__dict__, "meaning": "something else"}))
    assert tool.codes_page() != page
    assert "- **meaning**: something else\n" in tool.codes_page()


def test_promql_and_sql_code_lists_come_from_the_registry():
    assert promql.TAP_CODES == codes.codes(component="taps", severity="error")
    assert set(promql.TAP_CODES) == {"TAP_MISMATCH", "TAP_CONVENTION", "TAP_COUNT_MISMATCH", "TAP_OUT_OF_RANGE"}
    # the SQL twin of the tap alert names the same codes; every code a .sql file names is registered
    sql = (ROOT / "queries" / "tap_mismatch.sql").read_text()
    in_list = re.search(r"code IN \(([^)]*)\)", sql).group(1)
    assert set(re.findall(r"'([A-Z_]+)'", in_list)) == set(promql.TAP_CODES)
    for path in ROOT.rglob("*.sql"):
        for named in re.findall(r"code\s*(?:=|IN)\s*\(?\s*'([A-Z_]+)'", path.read_text(), re.I):
            assert named in REGISTERED, (path.name, named)
