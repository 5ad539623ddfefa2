"""The README's version table and the static check of an unpacked vLLM, from :mod:`spectrace.tracer.support`.

    python -m spectrace.tracer.support_table readme [--check]     rewrite (or compare) README.md's generated block
    python -m spectrace.tracer.support_table check --source DIR   check every vLLM hook site in DIR/vllm, never imported
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from spectrace.tracer import support
from spectrace.tracer.stages import all_hooks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spectrace.tracer.support_table")
    sub = parser.add_subparsers(dest="command", required=True)
    readme = sub.add_parser("readme", help="rewrite README.md's generated version block")
    readme.add_argument("--check", action="store_true", help="exit 1 when the README block differs")
    static = sub.add_parser("check", help="check every vLLM hook site statically against an unpacked vLLM")
    static.add_argument("--source", required=True, type=Path, help="directory holding the vllm/ package")
    static.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)

    if args.command == "readme":
        repo = Path(__file__).resolve().parents[2]
        path = repo / "README.md"
        text = path.read_text()
        new = support.render_readme(text, support.readme_block(all_hooks(), support.load_matrix(repo)))
        if args.check:
            if new != text:
                print("README.md's version block is stale: python -m spectrace.tracer.support_table readme")
                return 1
            return 0
        path.write_text(new)
        return 0

    result = support.static_check(args.source, all_hooks())
    for name, problems in result.items():
        print(f"{'ok  ' if not problems else 'FAIL'} {name}" + ("" if not problems else ": " + "; ".join(problems)))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 1 if any(result.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
