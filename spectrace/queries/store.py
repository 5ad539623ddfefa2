"""The DuckDB store's read side: views over the Parquet segments.

``open(dir)`` returns an in-memory DuckDB connection with one view per table
(``spectrace.records.TABLES``) plus the derived views in ``views.sql``. Views
over tables that have segments re-glob on every query, so a long-lived
connection sees what writers add while the server runs. Every documented view
exists in every store, empty when nothing was recorded for it.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb

from spectrace.records import TABLES, columns


class StoreError(Exception):
    """A store that cannot be opened (missing, not a spectrace store, empty)."""


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _empty(table: str) -> str:
    cols = ", ".join(f"CAST(NULL AS {kind}) AS {name}" for name, kind in columns(table))
    return f"SELECT {cols} WHERE false"


def _projection(table: str) -> str:
    return ", ".join(
        f"CAST({name} AS {kind}) AS {name}" if kind == "JSON" else name for name, kind in columns(table)
    )


def table_sql(root: Path, table: str) -> str:
    """SELECT for ``table``: its segments (any schema version) with every documented column."""
    folder = root / table
    if not any(folder.glob("*/*.parquet")):
        return f"SELECT {_projection(table)} FROM ({_empty(table)})"
    pattern = _sql_str(str(folder / "*" / "*.parquet"))
    return (
        f"SELECT {_projection(table)} FROM ("
        f"{_empty(table)} UNION ALL BY NAME "
        f"SELECT * FROM read_parquet({pattern}, union_by_name = true))"
    )


def derived_views() -> list[tuple[str, str]]:
    """(name, SELECT) pairs from queries/views.sql, in file order."""
    text = (Path(__file__).with_name("views.sql")).read_text()
    parts = re.split(r"^-- view: (\w+)\s*$", text, flags=re.MULTILINE)
    return [(name, body.strip().rstrip(";")) for name, body in zip(parts[1::2], parts[2::2])]


def has_data(root: Path) -> bool:
    return any(root.glob("*/*/*.parquet"))


def open(root: str | Path = "spectrace-data", *, require_data: bool = True) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with spectrace's views over the store at ``root``."""
    root = Path(root).absolute()
    if not root.is_dir():
        raise StoreError(f"no spectrace store at {root} (set --dir or SPECTRACE_DIR)")
    if require_data and not has_data(root):
        raise StoreError(f"the spectrace store at {root} holds no records yet")
    con = duckdb.connect(":memory:")
    try:
        for table in TABLES:
            con.execute(f"CREATE VIEW {table} AS {table_sql(root, table)}")
        for name, body in derived_views():
            con.execute(f"CREATE VIEW {name} AS {body}")
    except duckdb.Error as exc:
        con.close()
        first = str(exc).strip().splitlines()[0]
        raise StoreError(f"cannot read the spectrace store at {root}: {first}") from None
    return con


def view_names() -> list[str]:
    return [*TABLES, *(name for name, _ in derived_views())]
