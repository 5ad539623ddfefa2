"""The DuckDB store's read side: views over the Parquet segments.

``open(dir)`` returns a ``Store``: an in-memory DuckDB connection (every attribute passes
through) with one view per table (``spectrace.records.TABLES``) plus the derived views in
``views.sql``. Which files a view reads is chosen in Python, from the file names alone
(``files``: ``os.scandir`` per folder, no file opened), right before every query, by the
compaction rule (``spectrace.store.compaction``): so a long-lived connection sees what
writers add while the server runs, each row counts once while files are merged and
removed, and DuckDB opens only files that are kept, which exist for ``READY_S`` after the
listing. (DuckDB cannot take the list from a subquery: a filter on ``filename`` is applied
after it has opened every file a glob lists, deleted ones included.) Every documented view
exists in every store, empty when nothing was recorded for it.

``open(dir, since=ns)``: tables with a ``ts`` column hold only rows with ``ts >= since``,
and the files whose name says all their rows are older are never opened (a row is
recorded before its segment is written and named, by the same host's clock).
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from spectrace.bands import render_sql
from spectrace.store import compaction
from spectrace.store import schema as segment_schema
from spectrace.files import owner as store_owner
from spectrace.records import TABLES, columns


log = logging.getLogger("spectrace.store")


class StoreError(Exception):
    """A store that cannot be opened (missing, not a spectrace store, empty)."""


class LockedQueryError(StoreError):
    """SQL a locked store does not run: anything but SELECT (and EXPLAIN of one), or a table function
    that is not a plain read."""


LOCKED_STATEMENTS = ("SELECT", "EXPLAIN")

# The table functions a locked store runs: reads and DuckDB's own catalog (files: only the store's,
# ``lock``). Every other one is refused by name, the unknown ones included: some run as a SELECT and
# write (``enable_logging(storage='file')`` writes log files and then fails every later query and the
# process's exit; ``enable_profiling``, ``checkpoint``), some run SQL that no check has seen
# (``query``, ``query_table``, ``json_execute_serialized_sql``), some take raw pointers (``arrow_scan``).
LOCKED_TABLE_FUNCTIONS = frozenset({
    "range", "generate_series", "unnest", "repeat", "repeat_row", "json_each", "json_tree", "summary", "glob",
    "sniff_csv", "icu_calendar_names", "pg_timezone_names", "which_secret",
})
LOCKED_TABLE_FUNCTION_PREFIXES = ("read_", "parquet_", "duckdb_", "pragma_")  # reads and catalog listings


def lock(con: duckdb.DuckDBPyConnection, paths) -> None:
    """Lock ``con`` to reading exactly ``paths`` (the store's segments it lists): no other file read,
    no file created or written anywhere (``COPY ... TO``, ``EXPORT``, ``ATTACH``, log or profile files,
    also under ``EXPLAIN ANALYZE`` or inside a SELECT), no extension installed or loaded, no setting
    changed afterwards.

    DuckDB's own switches: ``allowed_paths`` (the files, not their folders: a folder there can be
    written to, and a read-only database still runs ``COPY ... TO``), ``enable_external_access=false``,
    autoloading off, ``lock_configuration``. The statements are checked before this (:func:`check_locked`)."""
    allowed = {str(p) for p in paths} | {_glob_literal(str(p)) for p in paths}  # DuckDB checks the name it is given
    literal = ", ".join(_sql_str(p) for p in sorted(allowed))
    con.execute(f"SET allowed_paths = [{literal}]::VARCHAR[]")
    for setting in ("autoinstall_known_extensions", "autoload_known_extensions", "enable_external_access"):
        con.execute(f"SET {setting} = false")
    con.execute("SET lock_configuration = true")


def check_locked(sql: str) -> None:
    """Raise :class:`LockedQueryError` unless every statement of ``sql`` only reads: a SELECT, or an
    EXPLAIN (ANALYZE included: it runs what it explains) of exactly one SELECT, whose table functions
    are all reads (``LOCKED_TABLE_FUNCTIONS``), at every level (CTEs, subqueries, joins, set operations).

    DuckDB's own parser decides: ``extract_statements`` gives each statement's type, an EXPLAIN's is
    checked again on what follows its ``EXPLAIN [ANALYZE] [(options)]`` (found with DuckDB's tokenizer,
    comments skipped), so ``EXPLAIN ANALYZE COPY ... TO`` is a COPY; ``json_serialize_sql`` gives each
    SELECT's whole tree, where every table function is named. Anything that does not parse as that
    is refused."""
    for statement in _statements(sql):
        kind = statement.type.name
        query = statement.query
        if kind == "EXPLAIN":
            query = _explained(statement.query)
            inner = [s.type.name for s in _statements(query)]
            if inner != ["SELECT"]:
                kind = f"EXPLAIN {' '.join(inner) or 'of nothing'}"
        if kind not in LOCKED_STATEMENTS:
            raise LockedQueryError(f"a locked store runs only SELECT statements, not {kind}")
        for name in _table_functions(query):
            if name not in LOCKED_TABLE_FUNCTIONS and not name.startswith(LOCKED_TABLE_FUNCTION_PREFIXES):
                raise LockedQueryError(f"a locked store runs only SELECT statements that read, not the table function {name}()")


def _table_functions(select: str) -> list[str]:
    """The table functions ``select`` (one SELECT) calls anywhere in its tree, lower-case."""
    import json

    with duckdb.connect(":memory:") as con:
        tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [select]).fetchone()[0])
    if tree.get("error"):
        raise LockedQueryError(f"a locked store cannot check this statement: {tree.get('error_message', 'not a SELECT')}")
    names: list[str] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "TABLE_FUNCTION" and isinstance(node.get("function"), dict):
                names.append(str(node["function"].get("function_name", "")).lower())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return names


def _statements(sql: str) -> list:
    try:
        return duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise LockedQueryError(f"query failed: {str(exc).strip().splitlines()[0]}") from None


def _explained(sql: str) -> str:
    """The statement an ``EXPLAIN [ANALYZE] [(option, ...)] <statement>`` explains (``sql`` is one EXPLAIN)."""
    tokens = [offset for offset, _ in duckdb.tokenize(sql)]  # comments are not tokens
    words = [re.match(r"\w+|\S", sql[start:]).group(0) for start in tokens]
    i = 1  # past EXPLAIN
    if i < len(words) and words[i].lower() == "analyze":
        i += 1
    if i < len(words) and words[i] == "(":
        depth = 0
        while i < len(words):
            depth += {"(": 1, ")": -1}.get(words[i], 0)
            i += 1
            if depth <= 0:
                break
    return sql[tokens[i]:] if i < len(tokens) else ""


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _glob_literal(path: str) -> str:
    """``path`` as a DuckDB glob that matches only itself: ``read_parquet`` globs every name in
    its list, so a store under ``runs*/`` or ``a?b/`` would read its neighbours' files too."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in path)


def _empty(table: str) -> str:
    cols = ", ".join(f"CAST(NULL AS {kind}) AS {name}" for name, kind in columns(table))
    return f"SELECT {cols} WHERE false"


def _projection(table: str) -> str:
    return ", ".join(
        f"CAST({name} AS {kind}) AS {name}" if kind == "JSON" else name for name, kind in columns(table)
    )


def _variable(table: str) -> str:
    return f"spectrace_files_{table}"


def _has_ts(table: str) -> bool:
    return any(name == "ts" for name, _ in columns(table))


def files(root: Path, now_ns: int | None = None, *, since: int | None = None) -> dict[str, list[str]]:
    """The files a query at ``now_ns`` (default: now) reads, per table, from their names alone.

    One ``os.scandir`` per folder, no file opened. In each run folder, compaction's rule
    (``compaction.visible``): ready hour files, and raw and part files that no ready
    compacted file of their writer covers; files named by neither pattern (stores of older
    spectrace versions) always. A kept file exists for ``READY_S`` after ``now_ns``. With
    ``since`` (ns), tables with a ``ts`` column leave out the files whose newest time (the
    name's ``t``, or ``hi``) is before it: a row's ``ts`` is never later than that time.
    """
    now_ns = time.time_ns() if now_ns is None else now_ns
    listing: dict[str, list[str]] = {}
    for folder in compaction.run_folders(root):
        table = folder.parent.name
        if table not in TABLES:
            continue
        kept = listing.setdefault(table, [])
        segments = []
        for entry in compaction._entries(folder):
            if entry.name.startswith(".") or not entry.name.endswith(".parquet"):
                continue  # a write in progress (hidden temporary name), or not a segment
            seg = compaction.parse(Path(entry.path))
            if seg is None:
                kept.append(entry.path)
            else:
                segments.append(seg)
        prune = since is not None and _has_ts(table)
        kept.extend(str(seg.path) for seg in compaction.visible(segments, now_ns) if not (prune and seg.hi < since))
    return {table: sorted(paths) for table, paths in listing.items()}


def table_sql(table: str, *, has_files: bool = True, since: int | None = None) -> str:
    """SELECT for ``table`` with every documented column, over its segments of any schema version.

    The files are the list in this connection's variable ``spectrace_files_<table>``
    (``Store.refresh`` sets it before every query); with ``has_files=False`` none (the view
    is empty, typed). With ``since``, a table with a ``ts`` column keeps the rows with
    ``ts >= since``, exactly: the pruning of ``files`` only saves opening the rest.
    """
    where = f" WHERE ts >= make_timestamp_ns({int(since)})" if since is not None and _has_ts(table) else ""
    if not has_files:
        return f"SELECT {_projection(table)} FROM ({_empty(table)}){where}"
    scan = f"SELECT * FROM read_parquet(getvariable('{_variable(table)}'), union_by_name = true)"
    return f"SELECT {_projection(table)} FROM ({_empty(table)} UNION ALL BY NAME {scan}){where}"


def derived_views() -> list[tuple[str, str]]:
    """(name, SELECT) pairs from store/views.sql, in file order."""
    text = render_sql((Path(__file__).with_name("views.sql")).read_text())
    parts = re.split(r"^-- view: (\w+)\s*$", text, flags=re.MULTILINE)
    return [(name, body.strip().rstrip(";")) for name, body in zip(parts[1::2], parts[2::2])]


def has_data(root: Path) -> bool:
    return any(root.glob("*/*/*.parquet"))


# JSON columns a view reads as a type (views.sql): a value of another shape would fail every query of that view
JSON_READS = {("request_counts", "histogram"): "BIGINT[]"}


def _unreadable(table: str, path: str) -> str | None:
    """Why ``path`` cannot be one of ``table``'s segments (from its Parquet footer), or None.

    A zero-byte, truncated or non-Parquet file, one this user cannot read, or one of another
    schema (a column no version of spectrace's ``table`` has, or one of another type:
    ``spectrace.store.schema``) is left out of every query; so is one whose JSON column holds a value
    that is not JSON, or not the type a view reads it as (:data:`JSON_READS`: ``histogram`` holding
    ``["a", "b"]``), which would fail every query of the views over that table."""
    try:
        schema = pq.read_schema(path)
    except PermissionError:
        return "not readable by this user"
    except (OSError, pa.ArrowException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"not a Parquet file ({first[:120]})"
    return segment_schema.mismatch(table, schema) or _bad_values(table, path, schema)


def _bad_values(table: str, path: str, schema: pa.Schema) -> str | None:
    """Why the JSON values of a segment of the right schema cannot be read by the views, or None (one scan of those
    columns, once per file's size and mtime on a connection)."""
    names = [name for name, kind in columns(table) if kind == "JSON" and name in schema.names
             and pa.types.is_string(schema.field(name).type)]
    if not names:
        return None
    checks = []
    for name in names:
        cast = JSON_READS.get((table, name))
        value = f"try({name}::JSON)" if cast is None else f"try({name}::JSON::{cast})"
        checks.append(f"count(*) FILTER (WHERE {name} IS NOT NULL AND {value} IS NULL)")
    try:
        with duckdb.connect(":memory:") as con:
            counts = con.execute(f"SELECT {', '.join(checks)} FROM read_parquet(?)", [_glob_literal(path)]).fetchone()
    except duckdb.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"not readable as a {table} segment ({first[:120]})"
    bad = [f"{name}: {n} value(s) not {JSON_READS.get((table, name), 'JSON')}" for name, n in zip(names, counts) if n]
    return f"not a {table} segment ({', '.join(bad[:3])})" if bad else None


class Store:
    """A DuckDB connection over the store whose views list the store's files before every query.

    ``execute``, ``sql`` (``query``), ``table`` and ``view`` first call ``refresh``;
    every other attribute is the DuckDB connection's (``fetchall``, ``description``,
    ``close``, ...). A context manager (closes on exit). ``cursor()`` gives another
    ``Store`` on the same database. Not for concurrent use from several threads, like a
    DuckDB connection.
    """

    def __init__(
        self, con: duckdb.DuckDBPyConnection, root: Path, since: int | None, shapes: dict[str, bool], locked: bool = False
    ) -> None:
        self._con = con
        self.root = root
        self.locked = locked  # open(locked=True): SELECT only, nothing outside the store
        self._allowed: frozenset[str] | None = None  # locked: the files this connection may read (lock)
        self._derived = False  # the derived views (views.sql) exist on this connection
        self.owner = store_owner(root)  # the uid whose files are the store's
        self.since = since
        self._shapes = shapes  # per table: its view reads files (True) or is empty; shared by cursors (one catalog)
        self._listed: dict[str, list[str]] = {}  # per table: this connection's variable
        self._checked: dict[str, tuple[int, int, str | None]] = {}  # path -> (size, mtime_ns, why skipped)
        self.skipped: dict[str, str] = {}  # files left out of the last listing, and why (one warning each)

    def _readable(self, table: str, paths: list[str]) -> list[str]:
        """``paths`` less the files that cannot be read as ``table`` segments (each footer read once
        per size and mtime; a skipped file is warned about once per connection)."""
        kept = []
        for path in paths:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue  # removed since the listing (compaction): the covering file is listed
            except OSError as exc:
                why = f"cannot stat ({exc.strerror or exc})"
            else:
                if not stat.S_ISREG(st.st_mode):  # a link (to a file outside the store), a FIFO, a folder
                    why = "not a regular file"
                elif st.st_uid != self.owner:  # planted by another user (a store someone made writable)
                    why = f"owned by uid {st.st_uid}, not the store's owner (uid {self.owner})"
                elif (cached := self._checked.get(path)) is not None and cached[:2] == (st.st_size, st.st_mtime_ns):
                    why = cached[2]
                else:
                    why = _unreadable(table, path)
                    self._checked[path] = (st.st_size, st.st_mtime_ns, why)
            if why is None:
                kept.append(path)
                continue
            if path not in self.skipped:
                log.warning("spectrace: skipping %s: %s; the store answers from the other files", path, why)
            self.skipped[path] = why
        return kept

    def refresh(self) -> None:
        """List the files for a query now (``files``) and point the views at them.

        Sets a table's variable only when its list changed, and replaces a view only when its
        table gets its first files or loses its last: only then does DuckDB open files here
        (to bind the new view); the query itself opens the listed files.
        """
        listing = files(self.root, since=self.since)
        readable = {table: self._readable(table, listing.get(table, [])) for table in TABLES}
        if self.locked:
            wanted = frozenset(path for paths in readable.values() for path in paths)
            if self._allowed is None or not wanted <= self._allowed:
                self._relock(wanted)
        for table in TABLES:
            paths = readable[table]
            if paths == self._listed.get(table):
                continue
            if paths:  # a literal: a Python list as a parameter converts ~10x slower
                literal = ", ".join(_sql_str(_glob_literal(p)) for p in paths)
                self._con.execute(f"SET VARIABLE {_variable(table)} = [{literal}]::VARCHAR[]")
            if self._shapes.get(table) != bool(paths):
                self._con.execute(
                    f"CREATE OR REPLACE VIEW {table} AS {table_sql(table, has_files=bool(paths), since=self.since)}"
                )
                self._shapes[table] = bool(paths)
            self._listed[table] = paths
        if not self._derived:
            for name, body in derived_views():
                self._con.execute(f"CREATE VIEW {name} AS {body}")
            self._derived = True

    def _relock(self, paths: frozenset[str]) -> None:
        """A locked store's connection, made to read ``paths``: DuckDB's allowed files cannot change
        once its configuration is locked, so a file written since (a writer's new segment, compaction's
        merged one) gets a new connection, views and all (an in-memory catalog of views: no data)."""
        con = duckdb.connect(":memory:")
        try:
            lock(con, paths)
        except BaseException:
            con.close()
            raise
        self._con.close()
        self._con, self._allowed = con, paths
        self._shapes, self._listed, self._derived = {}, {}, False

    def _refreshed(name: str):
        def method(self, *args, **kwargs):
            if self.locked and args and isinstance(args[0], str):
                check_locked(args[0])
            self.refresh()
            return getattr(self._con, name)(*args, **kwargs)

        method.__name__ = name
        method.__doc__ = f"``refresh``, then the DuckDB connection's ``{name}``."
        return method

    execute = _refreshed("execute")
    executemany = _refreshed("executemany")
    sql = query = _refreshed("sql")
    table = _refreshed("table")
    view = _refreshed("view")
    del _refreshed

    def __getattr__(self, name: str):
        return getattr(self._con, name)

    def cursor(self) -> "Store":
        if self.locked:  # its own locked connection (a file written later relocks one connection)
            cursor = Store(duckdb.connect(":memory:"), self.root, self.since, {}, True)
            cursor._checked, cursor.skipped = self._checked, self.skipped
            cursor.refresh()
            return cursor
        cursor = Store(self._con.cursor(), self.root, self.since, self._shapes, self.locked)
        cursor._checked, cursor.skipped, cursor._derived = self._checked, self.skipped, self._derived
        return cursor

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open(
    root: str | Path = "spectrace-data", *, require_data: bool = True, since: int | None = None, locked: bool = False
) -> Store:
    """A DuckDB connection (``Store``) with spectrace's views over the store at ``root``.

    ``since`` (ns since the epoch): tables with a ``ts`` column hold only the rows with
    ``ts >= since``, and files older than it (by name) are never opened.
    ``locked``: the connection reads the store's files and nothing else, writes no file (``lock``)
    and runs only SELECT statements that read (``check_locked``): for anything that takes SQL from others.
    """
    root = Path(root).absolute()
    if not root.is_dir():
        raise StoreError(f"no spectrace store at {root} (set --dir or SPECTRACE_DIR)")
    if require_data and not has_data(root):
        raise StoreError(f"the spectrace store at {root} holds no records yet")
    store = Store(duckdb.connect(":memory:"), root, since, {}, locked)
    try:
        store.refresh()
    except duckdb.Error as exc:
        store.close()
        first = str(exc).strip().splitlines()[0]
        raise StoreError(f"cannot read the spectrace store at {root}: {first}") from None
    return store


def view_names() -> list[str]:
    return [*TABLES, *(name for name, _ in derived_views())]
