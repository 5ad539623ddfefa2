"""Whether a Parquet file is one of a table's segments, by its schema: every column one that some
version of spectrace's table has (``spectrace.records``), of a type DuckDB reads as that
column's (any integer width for a count, any text for text; or all NULL). Names alone are not enough: a file with the right names and another type
(``drafted`` as a string) would fail every query of the table (DuckDB's binder) and every merge
(Arrow cannot concatenate it).

One check, shared by the reader (``spectrace.store.read``: such a file is skipped, counted by
``spectrace store stats`` and named once in a warning) and by compaction
(``spectrace.store.compaction``: never merged, its group left as it is).
"""

from __future__ import annotations

import pyarrow as pa

from spectrace.arrow_types import ARROW  # the Arrow type of each DuckDB type name, the one map the pipeline writes with
from spectrace.records import columns

# the Arrow types a column of each kind may have in a segment (older writers, other widths): every one of them
# DuckDB reads as the kind and Arrow casts to it; anything else (a string where a count belongs) is foreign
_TEXT = (pa.types.is_string, pa.types.is_large_string)
_ACCEPTS = {
    "VARCHAR": _TEXT,
    "JSON": _TEXT,
    "BIGINT": (pa.types.is_integer,),
    "INTEGER": (pa.types.is_integer,),
    "DOUBLE": (pa.types.is_floating, pa.types.is_integer),
    "BOOLEAN": (pa.types.is_boolean,),
    "TIMESTAMP_NS": (pa.types.is_timestamp,),
}


def mismatch(table: str, schema: pa.Schema) -> str | None:
    """Why a file of ``schema`` is not a ``table`` segment (one short reason naming up to three
    columns), or None when it is."""
    kinds = dict(columns(table))
    foreign = [name for name in schema.names if name not in kinds]
    if foreign:
        return f"not a {table} segment (columns {_some(foreign)})"
    retyped = [
        f"{field.name} {field.type}, not {ARROW[kinds[field.name]]}"
        for field in schema
        if not pa.types.is_null(field.type) and not any(accepts(field.type) for accepts in _ACCEPTS[kinds[field.name]])
    ]
    if retyped:
        return f"not a {table} segment (column types {_some(retyped)})"
    return None


def conform(table: str, arrow: pa.Table) -> pa.Table:
    """``arrow`` (a segment that passed ``mismatch``) with every column in the type spectrace writes it in, so
    segments of several writers' widths merge into one file. Raises ``pa.ArrowInvalid`` on a value that does not
    fit (an int64 count past int32's range): the caller leaves that file as it is."""
    target = conformed(table, arrow.schema)
    return arrow if arrow.schema.equals(target) else arrow.cast(target)


def conformed(table: str, schema: pa.Schema) -> pa.Schema:
    """The schema :func:`conform` gives a segment of ``schema`` (one that passed ``mismatch``)."""
    kinds = dict(columns(table))
    return pa.schema([pa.field(f.name, ARROW[kinds[f.name]]) for f in schema], metadata=schema.metadata)


def _some(items: list[str]) -> str:
    return ", ".join(items[:3]) + (f", ... ({len(items)} in all)" if len(items) > 3 else "")
