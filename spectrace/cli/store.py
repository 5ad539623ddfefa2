"""``spectrace store``: what the segment store holds, and compaction for stores whose engines are gone.

    spectrace store stats   [--dir DIR] [--format table|json]
    spectrace store compact [--dir DIR] [--idle 1h] [--no-wait]

A running engine compacts its own segments (``SPECTRACE_COMPACT_INTERVAL``). ``compact``
merges the files of writers that are gone: on this host, a process that no longer runs;
from another host (a shared store), one that has written nothing for ``--idle``. It then
waits until no reader can still need the merged files and deletes them (``--no-wait``
leaves that to the next run; readers count each row once either way).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from spectrace.console import UsageError, format_table


def _dir(args) -> Path:
    root = Path(args.dir).absolute()
    if not root.is_dir():
        raise UsageError(f"no spectrace store at {root} (set --dir or SPECTRACE_DIR)")
    return root


def stats(root: Path) -> list[dict]:
    """Per table: files (raw, compacted), files skipped (not readable as its segments: corrupt,
    empty, foreign, unreadable), bytes, rows a query counts, oldest and newest record."""
    from spectrace.store.compaction import file_stats
    from spectrace.store.read import open as open_store
    from spectrace.records import columns

    files = file_stats(root)
    con = open_store(root, require_data=False)
    rows = []
    try:
        for table, entry in sorted(files.items()):
            if table not in {name for (name,) in con.execute("select view_name from duckdb_views()").fetchall()}:
                continue
            stamp = next((name for name, kind in columns(table) if kind == "TIMESTAMP_NS"), None)
            span = f"min({stamp}), max({stamp})" if stamp else "NULL, NULL"
            count, oldest, newest = con.execute(f"select count(*), {span} from {table}").fetchone()
            folder = str(root / table) + "/"
            rows.append({
                "table": table, "files": entry.files, "raw": entry.raw, "compacted": entry.compacted,
                "skipped": sum(path.startswith(folder) for path in con.skipped),
                "bytes": entry.bytes, "rows": count,
                "oldest": str(oldest) if oldest is not None else None,
                "newest": str(newest) if newest is not None else None,
            })
    finally:
        con.close()
    return rows


def cmd_stats(args) -> int:
    rows = stats(_dir(args))
    if args.format == "json":
        json.dump(rows, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        columns = ["table", "files", "raw", "compacted", "skipped", "bytes", "rows", "oldest", "newest"]
        sys.stdout.write(format_table(columns, [[row[c] for c in columns] for row in rows]) + "\n")
        total = sum(row["files"] for row in rows), sum(row["bytes"] for row in rows)
        skipped = sum(row["skipped"] for row in rows)
        sys.stdout.write(
            f"({total[0]} files, {total[1] / 1e6:.1f} MB"
            + (f"; {skipped} skipped: not readable as segments, named on stderr" if skipped else "")
            + ")\n"
        )
    return 0


def compact(root: Path, *, host: str, idle_s: float, wait: bool) -> dict:
    from spectrace.store import compaction

    now = time.time_ns()
    newest: dict[str, int] = {}
    for folder in compaction.run_folders(root):
        for entry in compaction._entries(folder):
            seg = compaction.parse(Path(entry.path))
            if seg is not None:
                newest[seg.writer] = max(newest.get(seg.writer, 0), seg.hi)

    def gone(writer: str) -> bool:
        writer_host, pid = compaction.writer_pid(writer)
        if writer_host == host:
            return not compaction.pid_alive(pid)
        return newest.get(writer, now) < now - idle_s * 1e9

    dead = {writer for writer in newest if gone(writer)}
    compactor = compaction.Compactor(root, lambda seg: seg.writer in dead, closed=lambda hour, now_ns: True)
    result = compactor.cycle()  # a file it cannot read or merge is named on stderr once (the compaction log line)
    deleted = 0
    if wait and result.files_written:
        time.sleep(2 * compaction.READY_S + 0.5)
        deleted = compactor.cycle().files_deleted
    return {
        "writers gone": len(dead), "writers running": len(newest) - len(dead),
        "files written": result.files_written, "files merged": result.files_merged,
        "files deleted": result.files_deleted + deleted,
        "files skipped": len(result.skipped),  # not segments of their table, or unreadable: left as they are
    }


def cmd_compact(args) -> int:
    from spectrace.settings import Settings

    summary = compact(_dir(args), host=Settings.from_env(strict=True).host, idle_s=args.idle, wait=not args.no_wait)
    sys.stdout.write(format_table(["step", "result"], list(summary.items())) + "\n")
    return 0


def add_parser(sub: "argparse._SubParsersAction") -> None:
    """Register the ``store`` subcommand on the ``spectrace`` parser."""
    from spectrace.cli.args import duration

    from spectrace.settings import store_dir

    default_dir = str(store_dir())
    parser = sub.add_parser("store", help="the segment store: stats, compaction", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="store_command", required=True)
    stats_parser = commands.add_parser("stats", help="files, bytes, rows, oldest and newest record per table")
    stats_parser.add_argument("--dir", default=default_dir)
    stats_parser.add_argument("--format", choices=("table", "json"), default="table")
    stats_parser.set_defaults(func=cmd_stats)
    compact_parser = commands.add_parser("compact", help="merge the segments of engines that are gone")
    compact_parser.add_argument("--dir", default=default_dir)
    compact_parser.add_argument(
        "--idle", type=duration, default=3600.0,
        help="a writer on another host is gone after writing nothing for this long (default 1h)",
    )
    compact_parser.add_argument("--no-wait", action="store_true", help="do not wait to delete the merged files")
    compact_parser.set_defaults(func=cmd_compact)
