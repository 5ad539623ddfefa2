"""Named SQL queries shipped with spectrace (``spectrace query --named NAME``).

Each ``queries/<name>.sql`` file is one query over the store's views.
"""

from __future__ import annotations

import re
from pathlib import Path

from spectrace.bands import render_sql

_DIR = Path(__file__).parent


def names() -> list[str]:
    return sorted(p.stem for p in _DIR.glob("*.sql") if p.stem != "views")


def load(name: str) -> str:
    if name not in names():  # only the shipped names: never a path (`--named ../../x`)
        raise KeyError(f"no named query {name!r}; known: {', '.join(names()) or 'none'}")
    return render_sql((_DIR / f"{name}.sql").read_text())


def summary(name: str) -> str:
    """The query's first sentence, from its leading ``--`` comment (what ``query --help`` lists)."""
    lines = []
    for line in (_DIR / f"{name}.sql").read_text().splitlines():
        if not line.startswith("--"):
            break
        lines.append(line[2:].strip())
    return re.split(r"\. (?=[A-Z])", " ".join(lines), maxsplit=1)[0].rstrip(".")
