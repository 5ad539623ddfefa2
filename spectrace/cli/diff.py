"""``spectrace diff A B``: two runs side by side (store directories, run ids in --dir, or /metrics URLs)."""

from __future__ import annotations

import argparse
import sys

from spectrace.cli.args import default_dir


def cmd_diff(args: argparse.Namespace) -> int:
    from spectrace import diff

    runs = []
    try:
        for label, arg in (("A", args.a), ("B", args.b)):
            if diff.is_url(arg):
                runs.append(diff.load_url(label, arg))
                continue
            store, run_id = diff.resolve(arg, args.dir)
            runs.append(diff.load(label, store, run_id))
    finally:
        diff.close()
    sys.stdout.write(diff.render(*runs))  # every value safe, the whole terminal()
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("diff", help="two runs side by side: per position, context range and slice, with intervals",
                       description="Two runs side by side: A and B are each a store directory (its latest run), a "
                                   "run id in the store at --dir, or a /metrics URL (http://..., one scrape).")
    p.add_argument("a", metavar="A", help="a store directory (its latest run), a run id, or a /metrics URL")
    p.add_argument("b", metavar="B", help="a store directory (its latest run), a run id, or a /metrics URL")
    p.add_argument("--dir", default=default_dir(), help="the store run ids are looked up in")
    p.set_defaults(func=cmd_diff)
