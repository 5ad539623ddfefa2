"""The lake's read side and its maintenance.

``open(catalog)`` returns a DuckDB connection with the same views as
``spectrace.store.read.open`` (one per table, then ``views.sql``), over the
lake's tables: every view and named query that works on one host works on the
fleet (``host`` tells the replicas apart).

``maintain(catalog)`` is the lake's housekeeping, for a cron job, never the
engines': retention by age (whole runs), merge of adjacent data files, expiry of
old snapshots, deletion of the files no snapshot references any more.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from spectrace.redact import redact
from spectrace import lake
from spectrace.store.read import StoreError, _empty, _projection, derived_views
from spectrace.records import TABLES, columns

def table_sql(table: str, present: set[str]) -> str:
    """SELECT for ``table`` over the lake, every documented column (older lakes: NULL)."""
    if table not in present:
        return f"SELECT {_projection(table)} FROM ({_empty(table)})"
    return (
        f"SELECT {_projection(table)} FROM ({_empty(table)} UNION ALL BY NAME "
        f"SELECT * FROM {lake.ALIAS}.main.{table})"
    )


def open(catalog: str, *, require_data: bool = True) -> duckdb.DuckDBPyConnection:
    """A read-only DuckDB connection with spectrace's views over the lake at ``catalog``."""
    try:
        con = lake.connect(catalog, read_only=True)
    except lake.LakeError as exc:
        raise StoreError(str(exc)) from None
    try:
        present = lake.existing_tables(con)
        if require_data and not present & set(TABLES):
            raise StoreError(f"the lake {redact(catalog)!r} holds no spectrace tables yet")
        for table in TABLES:
            con.execute(f"CREATE VIEW {table} AS {table_sql(table, present)}")
        for name, body in derived_views():
            con.execute(f"CREATE VIEW {name} AS {body}")
    except duckdb.Error as exc:
        con.close()
        raise StoreError(f"cannot read the lake {redact(catalog)!r}: {lake.first_line(exc)}") from None
    except StoreError:
        con.close()
        raise
    return con


# -- maintenance ----------------------------------------------------------------


def time_column(table: str) -> str | None:
    """The first timestamp column of ``table`` (its rows' time), or None (per-run rows)."""
    return next((name for name, kind in columns(table) if kind == "TIMESTAMP_NS"), None)


@dataclass
class MaintainResult:
    runs_removed: list[str] = field(default_factory=list)
    rows_removed: int = 0
    files_merged: int = 0
    snapshots_expired: int = 0
    files_deleted: int = 0
    seconds: float = 0.0
    steps: list[tuple[str, str]] = field(default_factory=list)  # (step, what it did)


def maintain(
    catalog: str,
    *,
    retention_s: float | None = None,
    keep_snapshots_s: float = 3600.0,
    dry_run: bool = False,
) -> MaintainResult:
    """Retention, merge, expiry, cleanup, in that order. Raises ``StoreError``.

    - ``retention_s``: remove every row of the runs whose newest row is older than this
      (a run is kept or removed whole; a server still writing keeps its run).
    - merge adjacent data files (``ducklake_merge_adjacent_files``);
    - expire snapshots older than ``keep_snapshots_s`` (readers still on one of them
      keep working for that long) and delete the files only they referenced
      (``ducklake_cleanup_old_files``), then files no snapshot knows of
      (``ducklake_delete_orphaned_files``, e.g. from a writer that died mid-commit),
      each older than ``keep_snapshots_s``.
    """
    started = time.perf_counter()
    result = MaintainResult()
    try:
        con = lake.connect(catalog)
    except lake.LakeError as exc:
        raise StoreError(str(exc)) from None
    try:
        present = lake.existing_tables(con) & set(TABLES)
        if retention_s is not None:
            _retention(con, present, retention_s, dry_run, result)
        keep = f"now() - to_microseconds({int(keep_snapshots_s * 1e6)})"
        dry = "true" if dry_run else "false"

        def call(function: str, column: str, **options: str) -> list:
            # Fetch a real column: DuckDB skips the work of a table function whose
            # columns a query does not read (a bare count(*) changes nothing).
            args = "".join(f", {key} => {value}" for key, value in options.items())
            return [row[0] for row in con.execute(f"SELECT {column} FROM {function}('{lake.ALIAS}'{args})").fetchall()]

        if dry_run:
            result.steps.append(("merge", "skipped (dry run)"))
        else:
            flushed = sum(call("ducklake_flush_inlined_data", "rows_flushed"))
            result.files_merged = sum(call("ducklake_merge_adjacent_files", "files_processed"))
            result.steps.append(("merge", f"{flushed} inlined rows to files; {result.files_merged} files merged"))
        result.snapshots_expired = len(call("ducklake_expire_snapshots", "snapshot_id", older_than=keep, dry_run=dry))
        result.steps.append(("expire snapshots", f"{result.snapshots_expired} older than {keep_snapshots_s:g} s"))
        old = len(call("ducklake_cleanup_old_files", "path", older_than=keep, dry_run=dry))
        orphans = len(call("ducklake_delete_orphaned_files", "path", older_than=keep, dry_run=dry))
        result.files_deleted = old + orphans
        result.steps.append(("delete files", f"{old} no longer referenced, {orphans} orphaned"))
    except duckdb.Error as exc:
        raise StoreError(f"lake maintenance failed: {lake.first_line(exc)}") from None
    finally:
        con.close()
    result.seconds = round(time.perf_counter() - started, 3)
    return result


def _retention(con, present: set[str], retention_s: float, dry_run: bool, result: MaintainResult) -> None:
    timed = [(table, time_column(table)) for table in sorted(present) if time_column(table)]
    if not timed:
        return
    last = " UNION ALL ".join(
        f"SELECT run_id, max({col}) AS last FROM {lake.ALIAS}.{table} GROUP BY run_id" for table, col in timed
    )
    cutoff = time.time_ns() - int(retention_s * 1e9)
    runs = [
        run_id
        for (run_id,) in con.execute(
            f"SELECT run_id FROM ({last}) GROUP BY run_id HAVING max(last) < make_timestamp_ns(?::BIGINT)", [cutoff]
        ).fetchall()
        if run_id is not None
    ]
    result.runs_removed = runs
    if not runs:
        result.steps.append(("retention", "no run older than the retention"))
        return
    if dry_run:
        result.steps.append(("retention", f"would remove {len(runs)} run(s)"))
        return
    con.execute("BEGIN")
    try:
        for table in sorted(present):
            removed = con.execute(f"DELETE FROM {lake.ALIAS}.{table} WHERE list_contains(?, run_id)", [runs]).fetchone()
            result.rows_removed += removed[0] if removed else 0
        con.execute("COMMIT")
    except duckdb.Error:
        con.execute("ROLLBACK")
        raise
    # files whose rows are mostly deleted are rewritten, so the merge and cleanup can drop them
    con.execute(f"SELECT * FROM ducklake_rewrite_data_files('{lake.ALIAS}')").fetchall()
    result.steps.append(("retention", f"removed {len(runs)} run(s), {result.rows_removed} rows"))


def data_files(data_path: str | Path) -> int:
    """Parquet files under a lake's data path (what maintenance makes fewer)."""
    return sum(1 for _ in Path(data_path).rglob("*.parquet"))
