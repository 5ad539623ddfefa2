"""README.md's "Finding codes" table, generated from the code registry (``spectrace.audit.codes``).

``python -m tools.readme_codes`` rewrites the table between the markers in README.md;
``--check`` exits 1 when README.md and the registry differ (``tests/test_codes.py`` runs it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spectrace.audit.codes import REGISTRY

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN = "<!-- finding-codes: generated from spectrace/audit/codes.py by `python -m tools.readme_codes`; edit the registry -->"
END = "<!-- /finding-codes -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table() -> str:
    lines = ["| code | severity | meaning | fix |", "|---|---|---|---|"]
    for entry in REGISTRY.values():
        lines.append(
            f"| `{entry.code}` | {_cell(entry.severity_text)} | {_cell(entry.meaning)} | {_cell(entry.fix) or '—'} |"
        )
    return "\n".join(lines)


def render(readme: str) -> str:
    """``readme`` with the generated table between the markers (which must both be there, once)."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise ValueError(f"README.md needs the markers {BEGIN!r} and {END!r}, once each, in that order")
    head, rest = readme.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.readme_codes", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is not what the registry generates")
    args = parser.parse_args(argv)
    current = README.read_text(encoding="utf-8")
    try:
        wanted = render(current)
    except ValueError as exc:
        print(f"readme_codes: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if wanted != current:
            print("readme_codes: README.md's finding codes differ from spectrace/audit/codes.py: "
                  "run python -m tools.readme_codes", file=sys.stderr)
            return 1
        return 0
    if wanted != current:
        README.write_text(wanted, encoding="utf-8")
        print(f"rewrote the finding codes table in {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
