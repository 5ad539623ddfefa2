"""Batch-size bands: the labels spectrace groups engine steps by (requests with drafts in a step).

A leaf: it imports nothing of spectrace, so the audit and its rules (``spectrace.audit.rules.acceptance``) can use it too.
Defined here once: the SQL that names bands (``store/views.sql``'s ``speedup_baseline``, the named query
``speedup_by_k``) gets them rendered in (:func:`render_sql`), never a copy of its own.
"""

from __future__ import annotations

import re
from bisect import bisect_right

BATCH_BANDS = ("1", "2", "3-4", "5-8", "9-16", "17-32", "33-64", "65-128", "129-256", "257+")
_BATCH_EDGES = (2, 3, 5, 9, 17, 33, 65, 129, 257)


def batch_band(requests: int) -> str:
    """Band label of a step's batch size (requests with drafts in the step); called per engine step in the
    drain, so a plain bisect, not numpy."""
    return BATCH_BANDS[bisect_right(_BATCH_EDGES, requests)]


def band_order(band: str) -> int:
    """Sort key of a band label: its place in :data:`BATCH_BANDS` (a label it does not know goes last)."""
    return BATCH_BANDS.index(band) if band in BATCH_BANDS else len(BATCH_BANDS)


def band_bounds(band: str) -> tuple[int, int | None]:
    """The batch sizes of a band label, both ends inclusive (``"3-4"``: (3, 4); ``"257+"``: (257, None))."""
    i = BATCH_BANDS.index(band)
    low = _BATCH_EDGES[i - 1] if i else 1
    return low, (_BATCH_EDGES[i] - 1 if i < len(_BATCH_EDGES) else None)


def sql_case(column: str) -> str:
    """:func:`batch_band` as a SQL ``CASE`` over an integer ``column``."""
    whens = " ".join(
        f"WHEN {column} <= {edge - 1} THEN '{band}'" for band, edge in zip(BATCH_BANDS, _BATCH_EDGES)
    )
    return f"CASE {whens} ELSE '{BATCH_BANDS[-1]}' END"


def sql_order() -> str:
    """The bands in order as a SQL list literal, ``'all'`` (a whole run) first: ``list_position(<this>, band)``."""
    return "[" + ", ".join(f"'{band}'" for band in ("all", *BATCH_BANDS)) + "]"


def render_sql(text: str) -> str:
    """SQL with its band placeholders filled: ``{{batch_band(<column>)}}`` and ``{{batch_bands}}``."""
    text = re.sub(r"\{\{batch_band\((\w+(?:\.\w+)?)\)\}\}", lambda m: sql_case(m.group(1)), text)
    return text.replace("{{batch_bands}}", sql_order())
