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

from spectrace.exporters.compaction import READY_S
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
    """SELECT for ``table``: its segments (any schema version) with every documented column.

    Raw segments, and the part and hour files compaction merges them into
    (``spectrace.exporters.compaction``), are read by one rule on their names and the
    query's start time, so a row counts once while files are merged and removed: ready
    hour files through a file filter DuckDB applies before opening anything, the other
    files when no ready compacted file of their writer covers them.
    """
    folder = root / table
    if not any(folder.glob("*/*.parquet")):
        return f"SELECT {_projection(table)} FROM ({_empty(table)})"
    pattern = _sql_str(str(folder / "*" / "*.parquet"))
    now = "epoch_ns(get_current_timestamp())"
    ready_ns = int(READY_S * 1e9)
    hour_made = r"CAST(regexp_extract(filename, '-(\d+)\.hour\.parquet$', 1) AS BIGINT)"
    keep = (
        f"WITH f AS (SELECT file, regexp_replace(file, '/[^/]*$', '') AS folder, "
        rf"regexp_extract(regexp_extract(file, '[^/]*$'), '^(.+-\d+)-(\d+)-(\d+)-(\d+)\.(part|hour)\.parquet$', "
        f"['writer', 'lo', 'hi', 'made', 'kind']) AS c, "
        rf"regexp_extract(regexp_extract(file, '[^/]*$'), '^(.+-\d+)-(\d+)-\d+\.parquet$', ['writer', 't']) AS r "
        f"FROM glob({pattern})), "
        f"s AS (SELECT file, folder, "
        f"CASE WHEN c.kind <> '' THEN c.kind WHEN r.writer <> '' THEN 'raw' ELSE 'other' END AS kind, "
        f"CASE WHEN c.kind <> '' THEN c.writer ELSE r.writer END AS writer, "
        f"CAST(CASE WHEN c.kind <> '' THEN c.lo WHEN r.t <> '' THEN r.t ELSE '0' END AS BIGINT) AS lo, "
        f"CAST(CASE WHEN c.kind <> '' THEN c.hi WHEN r.t <> '' THEN r.t ELSE '0' END AS BIGINT) AS hi, "
        f"CAST(CASE WHEN c.kind <> '' THEN c.made ELSE '0' END AS BIGINT) AS made, "
        f"CASE c.kind WHEN 'hour' THEN 2 WHEN 'part' THEN 1 ELSE 0 END AS rank FROM f), "
        f"cover AS (SELECT * FROM s WHERE kind IN ('part', 'hour') AND made <= {now} - {ready_ns}) "
        f"SELECT file FROM s WHERE kind <> 'hour' AND (kind IN ('raw', 'other') OR made <= {now} - {ready_ns}) "
        f"AND NOT EXISTS (SELECT 1 FROM cover WHERE cover.folder = s.folder AND cover.writer = s.writer "
        f"AND cover.lo <= s.lo AND s.hi <= cover.hi AND (cover.lo <> s.lo OR cover.hi <> s.hi "
        f"OR (cover.rank, cover.made, cover.file) > (s.rank, s.made, s.file)))"
    )
    scan = f"SELECT * EXCLUDE (filename) FROM read_parquet({pattern}, union_by_name = true, filename = true)"
    return (
        f"SELECT {_projection(table)} FROM ("
        f"{_empty(table)} UNION ALL BY NAME "
        f"{scan} WHERE filename LIKE '%.hour.parquet' AND {hour_made} <= {now} - {ready_ns} "
        f"UNION ALL BY NAME "
        f"{scan} WHERE filename NOT LIKE '%.hour.parquet' AND filename IN ({keep}))"
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
