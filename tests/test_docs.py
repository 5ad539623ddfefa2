"""The docs: the reference pages are what the code generates (fail on drift, naming the command that
regenerates them), the settings table covers every variable with the code's defaults, the README stays
short and links only to pages that exist, and mkdocs.yml's nav holds every page. `make docs` builds
the site with `mkdocs build --strict` (and `make test` runs it)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _tool():
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "tools" / "docs_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", ["settings.md", "codes.md", "metrics.md", "schema.md", "versions.md"])
def test_reference_page_is_generated(page):
    tool = _tool()
    committed = (DOCS / "reference" / page).read_text(encoding="utf-8")
    assert tool.PAGES[page]() == committed, f"docs/reference/{page} is stale: run python -m tools.docs_reference and commit"


def test_check_names_a_stale_page(tmp_path, capsys):
    tool = _tool()
    for name, make in tool.PAGES.items():
        (tmp_path / name).write_text(make(), encoding="utf-8")
    assert tool.stale(tmp_path) == []
    (tmp_path / "schema.md").write_text("# old\n", encoding="utf-8")
    assert tool.stale(tmp_path) == ["schema.md"]
    assert tool.main(["--check"]) == 0  # the committed pages


def test_settings_table_covers_every_variable_with_the_codes_defaults():
    """Every variable settings.py reads has a row; each literal default, read as the code reads the
    variable, gives the code's own default."""
    from spectrace import settings

    documented = [v.name for v in settings.VARIABLES]
    assert len(documented) == len(set(documented))
    read = set(re.findall(r'"(SPECTRACE\w*)"', (REPO / "spectrace" / "settings.py").read_text())) | {
        settings.ACTIVE_RUN_ENV, settings.METRICS_DIR_ENV}
    assert read == set(documented), read ^ set(documented)
    code = settings.Settings.from_env({})
    literals = {v.name: settings.documented_default(v).strip("`") for v in settings.VARIABLES if v.default is None}
    assert literals["SPECTRACE_RETENTION"] == "7d" and literals["SPECTRACE_FLUSH_INTERVAL"] == "2s"
    assert literals["SPECTRACE_EXPORTER"] == "duckdb,prometheus" and literals["SPECTRACE_DIR"] == "spectrace-data"
    for name, value in literals.items():
        assert settings.Settings.from_env({name: value}) == code, (name, value)
    fields = {f for f in settings.Settings.__dataclass_fields__}
    assert {v.field for v in settings.VARIABLES if v.field} <= fields
    page = (DOCS / "reference" / "settings.md").read_text()
    assert "| `SPECTRACE_RETENTION` | `7d` | a duration, >= 0 |" in page


def test_metrics_page_lists_every_instrument_with_its_series():
    rows = {r["instrument"]: r for r in _tool().metric_rows()}
    assert len(rows) == 26
    assert rows["spectrace.verify.drafted_tokens"]["series"] == ["spectrace_verify_drafted_tokens_total"]
    assert rows["spectrace.verify.drafted_tokens"]["labels"] == ["context_bucket", "position"]
    assert rows["spectrace.verify.acceptance_length"]["kind"] == "histogram"
    assert rows["spectrace.config.finding"]["labels"] == ["code", "model_role", "severity"]
    assert rows["spectrace.runtime.finding"]["labels"] == ["code", "model_role", "severity"]
    assert rows["spectrace.internal.errors"] == {
        "instrument": "spectrace.internal.errors", "kind": "counter",
        "description": "Exceptions inside spectrace hooks (vLLM unaffected)",
        "series": ["spectrace_internal_errors_total"], "labels": ["hook"], "common": False,
    }


def test_schema_page_has_every_table_and_column():
    from spectrace import records

    page = (DOCS / "reference" / "schema.md").read_text()
    for table, columns in records.TABLES.items():
        section = page.split(f"\n## {table}\n", 1)[1].split("\n## ", 1)[0]
        assert [c for c, _ in columns] == re.findall(r"^\| `(\w+)` \|", section, re.MULTILINE), table
    assert "| `status` | VARCHAR | installed \\| missing \\| unsupported \\| retired \\| elsewhere (another process's hook) |" in page


def _nav_pages(text: str) -> list[str]:
    return re.findall(r":\s*([\w/.-]+\.md)\s*$", text, re.MULTILINE)


def test_every_docs_page_is_in_the_nav():
    nav = _nav_pages((REPO / "mkdocs.yml").read_text())
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages
    assert len(nav) == len(set(nav))


def test_readme_is_short_and_its_links_exist():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    links = re.findall(r"\]\(((?!https?:)[^)#]+)(?:#[^)]*)?\)", readme)
    assert links and all((REPO / link).exists() for link in links), [l for l in links if not (REPO / l).exists()]
    for command in ("make demo", "make test", "SPECTRACE=1", "spectrace doctor", "spectrace report", "spectrace query",
                    "spectrace top"):
        assert command in readme, command
