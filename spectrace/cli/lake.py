"""``spectrace lake maintain``: the fleet lake's housekeeping, for a cron job.

    spectrace lake maintain [--catalog CATALOG] [--retention 30d] [--keep-snapshots 1h] [--dry-run]

Merges the small files the engines' flushes write, expires old snapshots and
deletes the files nothing references any more; with ``--retention``, removes
the runs whose newest row is older than that. Exit 0 when done, 2 on a bad
argument or an unreachable lake (one line on stderr).
"""

from __future__ import annotations

import argparse
import sys

from spectrace.cli.args import default_catalog, duration
from spectrace.console import UsageError, format_table

def cmd_maintain(args: argparse.Namespace) -> int:
    from spectrace.lake import read as lake
    from spectrace.store.read import StoreError

    catalog = args.catalog or default_catalog()
    if not catalog:
        raise UsageError("no lake catalog: give --catalog or set SPECTRACE_LAKE")
    try:
        result = lake.maintain(
            catalog, retention_s=args.retention, keep_snapshots_s=args.keep_snapshots, dry_run=args.dry_run
        )
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    sys.stdout.write(format_table(["step", "result"], result.steps) + "\n")
    sys.stdout.write(f"({'dry run, ' if args.dry_run else ''}{result.seconds:.2f} s)\n")
    return 0


def add_parser(sub: "argparse._SubParsersAction") -> None:
    """Register the ``lake`` subcommand on the ``spectrace`` parser."""
    parser = sub.add_parser(
        "lake",
        help="the fleet lake (SPECTRACE_EXPORTER=lake): maintenance",
        description="The fleet lake: DuckLake on a PostgreSQL catalog, written by every replica.",
    )
    commands = parser.add_subparsers(dest="lake_command", required=True)
    maintain = commands.add_parser(
        "maintain",
        help="merge small files, expire old snapshots, delete unreferenced files, apply retention",
        description="Housekeeping for a cron job (never the engines' job): retention by age (whole runs), merge of "
                    "adjacent data files, expiry of snapshots older than --keep-snapshots, deletion of the files no "
                    "snapshot references any more.",
    )
    maintain.add_argument("--catalog", help="DuckLake catalog (default: $SPECTRACE_LAKE), e.g. "
                                            "'postgres:dbname=spectrace host=db user=spectrace'")
    maintain.add_argument("--retention", type=duration, default=None,
                          help="remove the runs whose newest row is older than this (e.g. 30d); default: keep all")
    maintain.add_argument("--keep-snapshots", type=duration, default=3600.0,
                          help="keep snapshots (time travel, readers in flight) this long (default: 1h)")
    maintain.add_argument("--dry-run", action="store_true", help="say what would be removed, change nothing")
    maintain.set_defaults(func=cmd_maintain)
