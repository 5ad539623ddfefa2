"""BENCHMARKS.md is a reader's page, and bench/results/ holds what it cites: every result file it names exists, and
every file in bench/results/ is one it names (the latest of each benchmark, or one the code reads)."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def _named() -> set[str]:
    text = (REPO / "BENCHMARKS.md").read_text()
    return {token for token in re.findall(r"`([\w.*-]+)`", text)}


def _matches(token: str, path: Path) -> bool:
    name = path.relative_to(RESULTS).as_posix()
    return fnmatch.fnmatch(name, token) or fnmatch.fnmatch(name, token + ".json")


def test_the_page_is_short():
    assert len((REPO / "BENCHMARKS.md").read_text().splitlines()) <= 300


def test_every_result_file_is_one_the_page_names():
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    named = _named()
    assert files and [p.name for p in files if not any(_matches(t, p) for t in named)] == []


def test_every_result_the_figures_cite_exists():
    text = (REPO / "BENCHMARKS.md").read_text()
    table = text.split("## The current figures", 1)[1].split("\n## ", 1)[0]
    cited = {t for row in table.splitlines() if row.startswith("| ") and not row.startswith("| what")
             for t in re.findall(r"`([\w.*-]+)`", row.rsplit("|", 2)[1])}
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    assert len(cited) > 40 and [t for t in sorted(cited) if not any(_matches(t, p) for p in files)] == []
