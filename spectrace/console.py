"""What every ``spectrace`` subcommand shares: the one-line user error and the table format.

A leaf module (imports nothing of spectrace), so ``cli`` and the subcommands it
registers (``doctor``, ``dashboards``, ``report``) never import each other.
"""

from __future__ import annotations

from typing import Any, Sequence

EXIT_USAGE = 2


class UsageError(Exception):
    """A one-line error for the user; exit code 2."""


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, max_width: int = 60) -> str:
    def cell(value: Any) -> str:
        text = "" if value is None else str(value)
        text = text.replace("\n", " ")
        return text if len(text) <= max_width else text[: max_width - 1] + "…"

    cells = [[cell(v) for v in row] for row in rows]
    widths = [len(c) for c in columns]
    for row in cells:
        widths = [max(w, len(v)) for w, v in zip(widths, row)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()
    rule = "  ".join("-" * w for w in widths)
    body = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join([line, rule, *body])
