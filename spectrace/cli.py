"""The ``spectrace`` command.

Every user error (bad SQL, a missing store, bad arguments) ends with one line
on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from typing import Any, Sequence

from spectrace.console import EXIT_USAGE, UsageError, format_table


def _default_dir() -> str:
    from spectrace.settings import store_dir

    return str(store_dir())


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


_CATALOG = re.compile(r"^(ducklake:)?\w+:")


def _since_ns(text: str | None) -> int | None:
    """``--since 30m`` (``90s``, ``1h``, ``7d``, ``2w``) to the time since the epoch, in ns, it starts at."""
    if text is None:
        return None
    from spectrace.queries.lake_cli import duration

    try:
        seconds = duration(text)
    except argparse.ArgumentTypeError:
        seconds = 0.0
    if seconds <= 0:
        raise UsageError(f"--since {text!r} is not a duration (e.g. 30m, 1h, 7d)")
    import time

    return time.time_ns() - int(seconds * 1e9)


def _open(args: argparse.Namespace):
    """The store at ``--dir``, or with ``--lake`` the fleet lake (``$SPECTRACE_LAKE`` by default)."""
    from spectrace.store.read import StoreError, open as open_store

    since = _since_ns(getattr(args, "since", None))
    try:
        if args.lake is None:
            return open_store(args.dir, since=since)
        if since is not None:
            raise UsageError("--since reads the store at --dir; over the lake, filter on ts in the SQL")
        from spectrace.lake import read as lake
        from spectrace.queries.lake_cli import default_catalog

        catalog = args.lake or default_catalog()
        if not catalog:
            raise UsageError("--lake needs a catalog: give one (--lake 'postgres:dbname=... host=...') or set SPECTRACE_LAKE")
        return lake.open(catalog)
    except StoreError as exc:
        raise UsageError(str(exc)) from None


def cmd_query(args: argparse.Namespace) -> int:
    import duckdb

    from spectrace.queries import named

    if args.lake and args.sql is None and not _CATALOG.match(args.lake):
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
    con = _open(args)
    try:
        result = con.execute(sql)
        columns = [d[0] for d in result.description] if result.description else []
        rows = result.fetchall() if columns else []
    except duckdb.Error as exc:
        message = str(exc).strip().splitlines()[0]
        raise UsageError(f"query failed: {message}") from None
    out = sys.stdout
    if args.format == "json":
        json.dump([dict(zip(columns, map(_jsonable, row))) for row in rows], out, indent=1)
        out.write("\n")
    elif args.format == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
    else:
        out.write(format_table(columns, rows) + "\n")
        out.write(f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from spectrace.queries import report

    con = _open(args)
    try:
        text = report.render(con, run_id=args.run, plot=args.plot)
    except report.ReportError as exc:
        raise UsageError(str(exc)) from None
    sys.stdout.write(text)
    return 0


_LAKE_HELP = "read the fleet lake instead of --dir (catalog default: $SPECTRACE_LAKE)"


class _Parser(argparse.ArgumentParser):
    """Bad arguments are one line (no usage block): the subcommand and argparse's message."""

    def error(self, message: str):  # type: ignore[override]
        command = self.prog.removeprefix("spectrace").strip()
        raise UsageError(f"{command}: {message}" if command else message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="spectrace", description="Observability for speculative decoding in vLLM.")
    sub = parser.add_subparsers(dest="command", required=True)

    query = sub.add_parser("query", help="run SQL over the store (read-only, works while vLLM writes)")
    query.add_argument("sql", nargs="?", help="SQL over the views (runs, spans, findings, ...)")
    query.add_argument("--named", help="run one of spectrace's named queries instead of SQL")
    query.add_argument("--dir", default=_default_dir(), help="store directory (default: $SPECTRACE_DIR or ./spectrace-data)")
    query.add_argument("--format", choices=("table", "csv", "json"), default="table")
    query.add_argument(
        "--since", metavar="DURATION",
        help="only rows recorded in the last DURATION (30m, 1h, 7d): tables with a ts column; older files are not read",
    )
    query.add_argument("--lake", nargs="?", const="", metavar="CATALOG", help=_LAKE_HELP)
    query.set_defaults(func=cmd_query)

    report = sub.add_parser("report", help="readable summary of a run")
    report.add_argument("--dir", default=_default_dir())
    report.add_argument("--run", help="run id (default: the latest run)")
    report.add_argument("--plot", help="write acceptance per position as a PNG to this file")
    report.add_argument("--lake", nargs="?", const="", metavar="CATALOG", help=_LAKE_HELP)
    report.set_defaults(func=cmd_report)

    from spectrace import doctor
    from spectrace.dashboards import cli as dashboards_cli
    from spectrace.queries import lake_cli, store_cli

    doctor.add_parser(sub)
    dashboards_cli.add_parser(sub)
    lake_cli.add_parser(sub)
    store_cli.add_parser(sub)
    return parser



def _one_line(exc: BaseException) -> str:
    """What went wrong, in one line: a user error as it is, a file error with its path, anything else named."""
    if isinstance(exc, UsageError):
        text = str(exc)
    elif isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    elif isinstance(exc, ValueError):  # SettingsError included
        text = str(exc)
    else:
        text = f"{type(exc).__name__}: {exc} (--debug shows the traceback)"
    return " ".join(text.split()) or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # anywhere on the line: the traceback instead of the one line
    if debug:
        argv.remove("--debug")
    parser = build_parser()
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help, or doctor's own one-line error
            return int(exc.code or 0) and EXIT_USAGE
        return args.func(args)
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # every subcommand: one line on stderr, exit 2, never a traceback
        if debug:
            raise
        print(f"spectrace: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
