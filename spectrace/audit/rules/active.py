"""Which findings are active: the one rule ``/metrics``, ``spectrace top`` (URL or store) and ``spectrace report`` read.

A finding row says something was found, and it stays found for the run, with one exception: a row that ends an
earlier one. ``ACCEPTANCE_RECOVERED`` clears the ``ACCEPTANCE_COLLAPSE`` of the same model role before it, and
``ACCEPTANCE_RESTORED`` an ``ACCEPTANCE_STEP_CHANGE`` or ``ACCEPTANCE_DECAY``; such a row is itself an event, never
active (a collapse that recovered leaves nothing active; a collapse after it is active again). A later row of the same code and model role takes the earlier one's place (its severity is the one that
stands). Pure: rows in, in the order they were recorded, states out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from spectrace.audit import codes

# a finding code -> the codes whose earlier findings (same model role) it clears
CLEARS = {codes.ACCEPTANCE_RECOVERED: (codes.ACCEPTANCE_COLLAPSE,),
          codes.ACCEPTANCE_RESTORED: (codes.ACCEPTANCE_STEP_CHANGE, codes.ACCEPTANCE_DECAY)}


def effect(code: str) -> tuple[tuple[str, ...], bool]:
    """What a row of ``code`` does to the active findings: ``(codes it sets or clears, whether it is active)``.
    ``MetricsSink`` applies it to its gauges a flush at a time; :func:`statuses` folds it over a run's rows."""
    cleared = CLEARS.get(code)
    return (cleared, False) if cleared is not None else ((code,), True)


@dataclass(frozen=True)
class Status:
    """One finding row's standing at the end of the rows."""

    active: bool  # the latest row of its code and model role, not cleared since
    cleared_by: str | None = None  # the code of the later row that cleared it
    clears: str | None = None  # this row ends an earlier one (the code it clears): an event, never active


def _key(row: Mapping[str, Any], code: str) -> tuple[str, str]:
    return code, row.get("model_role") or ""


def statuses(rows: Iterable[Mapping[str, Any]]) -> list[Status]:
    """Each row's :class:`Status`; ``rows``: mappings with ``code`` and ``model_role``, in the order recorded."""
    rows = list(rows)
    standing: dict[tuple[str, str], int] = {}  # (code, model role) -> the index of its active row
    cleared: dict[int, str] = {}
    clearing: dict[int, str] = {}
    for i, row in enumerate(rows):
        targets, present = effect(row["code"])
        if present:
            standing[_key(row, targets[0])] = i
            continue
        clearing[i] = targets[0]
        for target in targets:
            key = _key(row, target)
            if key in standing:
                clearing[i] = target
                cleared[standing.pop(key)] = row["code"]
    active = set(standing.values())
    return [Status(i in active, cleared.get(i), clearing.get(i)) for i in range(len(rows))]


def active(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows that are active now, in the order recorded: one per code and model role at most."""
    rows = list(rows)
    return [row for row, status in zip(rows, statuses(rows)) if status.active]
