"""What every ``spectrace`` subcommand shares: the one-line user error, the table format and the one
number formatter (``number``, ``ratio``, ``json_number``: a NULL or a non-finite value never crashes a command),
and output bounded by what is useful (``bounded``, ``listed``: a list from a config is cut with a count), and the one
boundary text from outside crosses before a terminal (``safe``, ``terminal``, ``rich_text``).

A leaf module (imports nothing of spectrace), so ``cli`` and the subcommands it
registers (``doctor``, ``dashboards``, ``report``) never import each other.
"""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

EXIT_USAGE = 2


class UsageError(Exception):
    """A one-line error for the user; exit code 2."""


# -- text from outside, before a terminal -------------------------------------------------------------------------------
# Label values on a scraped page, request ids, model names, messages, store values: anyone who can put a label on a page
# the operator scrapes or send a request id chooses them. Every C0 and C1 control, ESC and DEL (an OSC that retitles
# the window, a CSI that clears the screen, a CR that overwrites a line, a LF that starts a fake row) and the bidi
# controls that reorder what is shown are written escaped (``\x1b``, ``\r``, ``\n``, ``\u202e``), never sent; rich
# gets data only as ``Text`` (``rich_text``), so ``[/]`` or ``[red]`` in data is text, never markup.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROLS_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match) -> str:
    char = match[0]
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def safe(value: Any) -> str:
    """``value`` as text for a terminal: every control character (C0, C1, ESC, DEL, CR, LF, tab, bidi) escaped."""
    text = "" if value is None else str(value)
    return _CONTROLS.sub(_escaped, text)


def terminal(text: str) -> str:
    """A whole output (lines spectrace composed) for a terminal: every control but the newline escaped. The last
    step before ``write``: data in it was already ``safe`` where a newline would start a line of its own."""
    return _CONTROLS_BUT_NEWLINE.sub(_escaped, text)


def rich_text(value: Any, style: str = ""):
    """``value`` as a rich ``Text`` (never parsed as markup), ``safe``."""
    from rich.text import Text

    return Text(safe(value), style=style)


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, max_width: int = 60) -> str:
    def cell(value: Any) -> str:
        text = safe(value)
        return text if len(text) <= max_width else text[: max_width - 1] + "…"

    columns = [safe(c) for c in columns]
    cells = [[cell(v) for v in row] for row in rows]
    widths = [len(c) for c in columns]
    for row in cells:
        widths = [max(w, len(v)) for w, v in zip(widths, row)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()
    rule = "  ".join("-" * w for w in widths)
    body = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join([line, rule, *body])


PERCENT_COLUMNS = re.compile(r"(^|_)(rate|share|fraction|pct)(_|$)", re.IGNORECASE)


def readable(value: Any, column: str = "") -> Any:
    """A query cell for a person to read (``query``'s table; ``--format csv/json`` keep the raw value): a float in a
    column named for a rate or share (``rate``, ``acceptance_rate``, ``chunk_share``) between 0 and 1 as a percentage
    (``14.0%``), any other float to 4 significant digits (whole numbers from 1000 up, one decimal from 100);
    anything else as it is (a DECIMAL with a fraction is a float here)."""
    from decimal import Decimal

    if isinstance(value, Decimal) and value.is_finite() and value != value.to_integral_value():
        value = float(value)
    if not isinstance(value, float) or not math.isfinite(value):
        return value
    if PERCENT_COLUMNS.search(column or "") and 0.0 <= value <= 1.0:
        return f"{value:.1%}"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:.0f}"
    if magnitude >= 100:
        return f"{value:.1f}"
    if value == 0 or magnitude >= 1e-4:
        text = f"{value:.4g}"
        return text if "e" not in text else f"{value:.4f}"
    return f"{value:.3g}"


def number(value: Any, spec: str = "", *, missing: str = "-") -> str:
    """``value`` formatted with ``spec`` (``".1%"``, ``".2f"``) for a person to read, whatever it is: ``missing``
    for NULL (None), ``nan`` / ``inf`` / ``-inf`` for a value that is not a finite number, the value as text for
    one that is not a number at all. Never raises."""
    if value is None:
        return missing
    try:
        as_float = float(value)  # int, float, Decimal, NumPy scalars
    except (TypeError, ValueError, OverflowError):
        return str(value)
    if math.isnan(as_float):
        return "nan"
    if math.isinf(as_float):
        return "inf" if as_float > 0 else "-inf"
    try:
        return format(value, spec)
    except (TypeError, ValueError):
        return format(as_float, spec)


def ratio(numerator: Any, denominator: Any, spec: str = ".1%", *, missing: str = "-") -> str:
    """``numerator / denominator`` through ``number``; ``missing`` when either is NULL or the denominator is 0."""
    if numerator is None or denominator is None:
        return missing
    try:
        return number(numerator / denominator, spec, missing=missing)
    except (ZeroDivisionError, TypeError, ArithmeticError):
        return missing


def json_number(value: Any) -> Any:
    """``value`` for a JSON document: a float that is not finite becomes null (JSON has no NaN or Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


EVIDENCE_ITEMS = 256  # more than any real model's layers: a longer list in evidence is someone's config, cut
LISTED_ITEMS = 16  # in a sentence


# a recorded config's lists (model_configs, config_fields, the spectrace.config.resolve span) are cut past this many
# items, with a count: a hostile config.json can hold millions; the audits read the whole dicts; no model has more
# layers than this
RECORDED_ITEMS = 1024


def bounded(value: Any, limit: int = EVIDENCE_ITEMS) -> Any:
    """``value`` with every list or tuple in it (nested ones too) longer than ``limit`` cut to its first ``limit``
    items and one more that says how many there were (``"... 1899744 more (1900000 in all)"``). What needs no cut
    is returned as it is (the same object)."""
    if isinstance(value, dict):
        items = {key: bounded(item, limit) for key, item in value.items()}
        return value if all(items[key] is item for key, item in value.items()) else items
    if isinstance(value, (list, tuple)):
        kept = [bounded(item, limit) for item in value[:limit]]
        if len(value) <= limit and all(new is old for new, old in zip(kept, value)):
            return value
        if len(value) > limit:
            kept.append(f"... {len(value) - limit} more ({len(value)} in all)")
        return type(value)(kept) if isinstance(value, tuple) else kept
    return value


def listed(values: Any, limit: int = LISTED_ITEMS) -> str:
    """A list for a sentence: ``[2, 18, 33]``, or its first ``limit`` items and how many more there are."""
    if values is None:
        return "-"
    values = list(values)
    shown = ", ".join(str(v) for v in values[:limit])
    return f"[{shown}, ... {len(values) - limit} more ({len(values)} in all)]" if len(values) > limit else f"[{shown}]"


MESSAGE_CHARS = 2000  # a finding's message past this is someone's config echoed: cut, with its length


def clipped(text: str, limit: int = MESSAGE_CHARS) -> str:
    """``text`` up to ``limit`` characters, and how long it was when it is longer."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters in all)"
