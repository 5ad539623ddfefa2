"""``spectrace query``: SQL over the store (or the lake), read-only, while vLLM writes."""

from __future__ import annotations

import argparse
import csv
import json
import sys
import textwrap
from typing import Any

from spectrace.cli.args import CATALOG, LAKE_HELP, SINCE_HELP, default_dir, open_source
from spectrace.console import UsageError, format_table, json_number, readable


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return json_number(value)  # NaN and Infinity are null: JSON has neither
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def cmd_query(args: argparse.Namespace) -> int:
    import duckdb

    from spectrace.queries import named
    from spectrace.store.read import StoreError

    if args.lake and args.sql is None and not CATALOG.match(args.lake):
        args.sql, args.lake = args.lake, ""  # `query --lake "select ..."`: the SQL, not a catalog
    if args.named:
        try:
            sql = named.load(args.named)
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from None
    elif args.sql:
        sql = args.sql
    else:
        raise UsageError(f"give SQL to run, or --named NAME (one of: {', '.join(named.names())})")
    if getattr(args, "locked", False):  # refused before the store is opened: the refusal is the only line
        from spectrace.store.read import check_locked

        try:
            check_locked(sql)
        except StoreError as exc:
            raise UsageError(str(exc)) from None
    con = open_source(args)
    try:
        result = con.execute(sql)
        columns = [d[0] for d in result.description] if result.description else []
        rows = result.fetchall() if columns else []
    except StoreError as exc:  # a locked store refuses the statement
        raise UsageError(str(exc)) from None
    except duckdb.Error as exc:
        message = str(exc).strip().splitlines()[0]
        raise UsageError(f"query failed: {message}") from None
    out = sys.stdout
    if args.format == "json":
        json.dump([dict(zip(columns, map(_jsonable, row))) for row in rows], out, indent=1, allow_nan=False)
        out.write("\n")
    elif args.format == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
    else:
        # rounded for reading (rates and shares as percentages); --format csv/json keep the raw values
        shown = [[readable(value, column) for value, column in zip(row, columns)] for row in rows]
        out.write(format_table(columns, shown) + "\n")  # every cell console.safe
        out.write(f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n")
    return 0


def add_parser(sub) -> None:
    from spectrace.queries import named

    listed = "\n".join(textwrap.fill(textwrap.shorten(named.summary(name), 170, placeholder=" …"), 100, initial_indent=f"  {name:<24} ",
                                      subsequent_indent=" " * 27) for name in named.names())
    query = sub.add_parser(
        "query", help="run SQL over the store (read-only, works while vLLM writes)",
        epilog=f"named queries (--named NAME):\n{listed}", formatter_class=argparse.RawDescriptionHelpFormatter)
    query.add_argument("sql", nargs="?", help="SQL over the views (runs, spans, findings, ...)")
    query.add_argument("--named", metavar="NAME",
                       help="run one of spectrace's named queries (listed below) instead of SQL")
    query.add_argument("--dir", default=default_dir(), help="store directory (default: $SPECTRACE_DIR or ./spectrace-data)")
    query.add_argument("--format", choices=("table", "csv", "json"), default="table")
    query.add_argument("--since", metavar="DURATION", help=SINCE_HELP)
    query.add_argument("--lake", nargs="?", const="", metavar="CATALOG", help=LAKE_HELP)
    query.add_argument(
        "--locked", action="store_true",
        help="read the store's files and nothing else, SELECT only (no other file, ATTACH, COPY, INSTALL, SET of a setting)",
    )
    query.set_defaults(func=cmd_query)
