"""Whether a Parquet file is one of a table's segments, by its schema: every column one that some
version of spectrace's table has (``spectrace.records``), of the Arrow type spectrace writes it
in (or all NULL). Names alone are not enough: a file with the right names and another type
(``drafted`` as a string) would fail every query of the table (DuckDB's binder) and every merge
(Arrow cannot concatenate it).

One check, shared by the reader (``spectrace.store.read``: such a file is skipped, counted by
``spectrace store stats`` and named once in a warning) and by compaction
(``spectrace.store.compaction``: never merged, its group left as it is).
"""

from __future__ import annotations

import pyarrow as pa

from spectrace.records import columns

# the Arrow type of each DuckDB type name in spectrace.records, as the pipeline writes it (``pipeline._ARROW``)
ARROW = {
    "VARCHAR": pa.string(),
    "JSON": pa.string(),
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "TIMESTAMP_NS": pa.timestamp("ns"),
}


def mismatch(table: str, schema: pa.Schema) -> str | None:
    """Why a file of ``schema`` is not a ``table`` segment (one short reason naming up to three
    columns), or None when it is."""
    expected = {name: ARROW[kind] for name, kind in columns(table)}
    foreign = [name for name in schema.names if name not in expected]
    if foreign:
        return f"not a {table} segment (columns {_some(foreign)})"
    retyped = [
        f"{field.name} {field.type}, not {expected[field.name]}"
        for field in schema
        if field.type != expected[field.name] and not pa.types.is_null(field.type)
    ]
    if retyped:
        return f"not a {table} segment (column types {_some(retyped)})"
    return None


def _some(items: list[str]) -> str:
    return ", ".join(items[:3]) + (f", ... ({len(items)} in all)" if len(items) > 3 else "")
