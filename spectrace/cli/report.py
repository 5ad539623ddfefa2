"""``spectrace report``: a readable summary of a run."""

from __future__ import annotations

import argparse
import sys

from spectrace.cli.args import LAKE_HELP, SINCE_HELP, default_dir, open_source
from spectrace.console import UsageError, terminal


def cmd_report(args: argparse.Namespace) -> int:
    from spectrace.queries import report

    con = open_source(args)
    try:
        text = report.render(con, run_id=args.run, plot=args.plot)
    except report.ReportError as exc:
        raise UsageError(str(exc)) from None
    sys.stdout.write(terminal(text))
    return 0


def add_parser(sub) -> None:
    report = sub.add_parser("report", help="readable summary of a run")
    report.add_argument("--dir", default=default_dir(), help="store directory (default: $SPECTRACE_DIR or ./spectrace-data)")
    report.add_argument("--since", metavar="DURATION", help=SINCE_HELP)
    report.add_argument("--run", help="run id (default: the latest run)")
    report.add_argument("--plot", help="write acceptance per position as a PNG to this file")
    report.add_argument("--lake", nargs="?", const="", metavar="CATALOG", help=LAKE_HELP)
    report.set_defaults(func=cmd_report)
