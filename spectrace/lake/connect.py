"""The fleet lake: DuckLake (a SQL catalog plus Parquet data files) on a PostgreSQL catalog.

Shared by the sink (``spectrace.lake.sink``, writes), the read side
(``spectrace.lake.read``: views, ``spectrace query --lake``) and
``spectrace lake maintain``. The lake holds the same tables as the embedded
store (``spectrace.records``), ``JSON`` columns as strings as in the Parquet
segments, every row with its ``host``.

DuckDB's ``ducklake`` and ``postgres`` extensions come from their Python
packages (``pip install 'spectrace[lake]'``) and are installed from their files:
nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib.util
import re
import time
from pathlib import Path

import duckdb

from spectrace.redact import redact, remember
from spectrace.records import TABLES, columns

ALIAS = "lake"  # the catalog's name inside a DuckDB connection: lake.<table>
EXTENSIONS = ("postgres", "ducklake")
CONNECT_TIMEOUT_S = 5  # libpq connect_timeout added when the catalog string sets none

_STORED = {"JSON": "VARCHAR"}


class LakeError(Exception):
    """The lake cannot be used (extensions missing, catalog unreachable, bad catalog string)."""


def extension_file(name: str) -> Path:
    """The ``.duckdb_extension`` file inside the ``duckdb-extension-<name>`` package."""
    spec = importlib.util.find_spec(f"duckdb_extension_{name}")
    version = duckdb.__version__
    if spec is not None and spec.submodule_search_locations:
        root = Path(next(iter(spec.submodule_search_locations)))
        found = sorted(root.glob(f"extensions/v{version}/{name}.duckdb_extension")) or sorted(
            root.glob(f"extensions/*/{name}.duckdb_extension")
        )
        if found:
            return found[0]
    raise LakeError(
        f"the DuckDB extension {name!r} for duckdb {version} is not installed: pip install 'spectrace[lake]'"
    )


def load_extensions(con: duckdb.DuckDBPyConnection) -> None:
    for name in EXTENSIONS:
        path = str(extension_file(name)).replace("'", "''")
        con.execute(f"INSTALL '{path}'")
        con.execute(f"LOAD {name}")


_POSTGRES_URI = re.compile(r"(?i)^(?:postgres:)?(postgres(?:ql)?):(/+)")


def catalog_uri(catalog: str) -> str:
    """``ducklake:postgres:<libpq string or URI>`` from ``SPECTRACE_LAKE`` (with or without ``ducklake:``).

    The catalog's secrets are remembered first (``spectrace.redact``): no message echoes them.
    A PostgreSQL URI (``postgresql://user:pw@host/db``, as PostgreSQL users write it) is handed
    to libpq (``ducklake:postgres:postgresql://...``), never read by DuckDB as a file path; the
    one-slash form is refused. A catalog without ``connect_timeout`` gets one, so an
    unreachable catalog host fails in seconds instead of hanging the flush thread.
    """
    remember(catalog)
    uri = catalog.strip()
    if not uri:
        raise LakeError("no lake catalog: set SPECTRACE_LAKE (e.g. 'postgres:dbname=spectrace host=db')")
    body = uri.removeprefix("ducklake:")
    if match := _POSTGRES_URI.match(body):
        if match.group(2) == "/":  # what DuckDB normalises "//" to in a file path: no host, no user
            raise LakeError(
                f"the lake catalog {redact(catalog)!r} is not a PostgreSQL URI: write postgresql://user@host/db "
                "or a libpq string ('postgres:dbname=... host=...')"
            )
        uri = "ducklake:postgres:" + body[match.start(1):]
        if "connect_timeout" not in uri:
            uri += ("&" if "?" in uri else "?") + f"connect_timeout={CONNECT_TIMEOUT_S}"
        return uri
    uri = "ducklake:" + body
    if uri.startswith("ducklake:postgres:") and "connect_timeout" not in uri:
        uri += f" connect_timeout={CONNECT_TIMEOUT_S}"
    return uri


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def connect(catalog: str, *, data_path: str | None = None, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the lake attached as ``lake``.

    ``data_path`` is needed when the lake is created (DuckLake stores it in the
    catalog; later connections find it there). Raises ``LakeError``.
    """
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET enable_progress_bar = false")  # nothing on a server's stdout
        load_extensions(con)
        options = []
        if data_path:
            options.append(f"DATA_PATH {_sql_str(str(data_path))}")
        if read_only:
            options.append("READ_ONLY")
        suffix = f" ({', '.join(options)})" if options else ""
        for attempt in range(3):
            try:
                con.execute(f"ATTACH {_sql_str(catalog_uri(catalog))} AS {ALIAS}{suffix}")
                break
            except duckdb.Error as exc:
                # writers attaching a new catalog together race to create its tables: the
                # losers find it created on the next try
                if "Failed to initialize DuckLake" not in str(exc) or attempt == 2:
                    raise
                time.sleep(0.3 * (attempt + 1))
    except LakeError:
        con.close()
        raise
    except duckdb.Error as exc:
        con.close()
        if read_only and "creating a new DuckLake is explicitly disabled" in str(exc):
            raise LakeError(f"the lake {redact(catalog)!r} does not exist yet (no engine has written to it)") from None
        raise LakeError(f"cannot attach the lake {redact(catalog)!r}: {first_line(exc)}") from None
    return con


def first_line(exc: BaseException) -> str:
    """The error's first line, with any password, token or URL credential it echoes redacted."""
    text = str(exc).strip()
    return redact(text.splitlines()[0]) if text else type(exc).__name__


def table_ddl(table: str) -> str:
    cols = ", ".join(f"{name} {_STORED.get(kind, kind)}" for name, kind in columns(table))
    return f"CREATE TABLE IF NOT EXISTS {ALIAS}.{table} ({cols})"


def ensure_tables(con: duckdb.DuckDBPyConnection, attempts: int = 3) -> None:
    """Create every spectrace table that the lake does not have yet, and add the columns this spectrace
    writes that a lake created by an older one lacks (``INSERT ... BY NAME`` refuses a column the table
    does not have, and the whole flush with it); one transaction. Rows written before read NULL there.

    Replicas starting together race to create them: a conflict is retried, and is
    over once another writer has created them all.
    """
    for attempt in range(attempts):
        present = existing_columns(con)
        missing = [table for table in TABLES if table not in present]
        added = [(table, name, kind) for table in TABLES if table in present
                 for name, kind in columns(table) if name not in present[table]]
        if not missing and not added:
            return
        con.execute("BEGIN")
        try:
            for table in missing:
                con.execute(table_ddl(table))
            for table, name, kind in added:
                con.execute(f"ALTER TABLE {ALIAS}.{table} ADD COLUMN IF NOT EXISTS {name} {_STORED.get(kind, kind)}")
            con.execute("COMMIT")
            return
        except duckdb.Error:
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:  # a failed COMMIT has already ended the transaction
                pass
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


def existing_columns(con: duckdb.DuckDBPyConnection) -> dict[str, set[str]]:
    """The lake's tables and the columns each has."""
    rows = con.execute(
        "SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = ? AND schema_name = 'main'", [ALIAS]
    ).fetchall()
    present: dict[str, set[str]] = {}
    for table, column in rows:
        present.setdefault(table, set()).add(column)
    return present


def existing_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = ? AND schema_name = 'main'", [ALIAS]
    ).fetchall()
    return {name for (name,) in rows}
