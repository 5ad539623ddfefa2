"""The ``spectrace`` command: one module per subcommand, each with its ``add_parser``.

- ``query``, ``report``: SQL and the summary over the store or the lake;
- ``doctor``: the config audit before deployment;
- ``probe``: the pair served under each reading a finding doubts, measured;
- ``store``, ``lake``: housekeeping (``stats``, ``compact``; ``maintain``);
- ``dashboards``: export and push the Grafana dashboards and alert rules;
- ``top``: a live terminal view from ``/metrics`` URLs or the store;
- ``diff``: two runs side by side;
- ``args``: what they share (the parser, durations, ``--dir``, ``--since``, ``--lake``).

Every error (bad SQL, a missing store, bad arguments, a file it cannot read) ends with one
line on stderr and exit code 2, never a traceback (``--debug`` shows it); ``doctor`` keeps
exit 1 for "an error finding".
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from spectrace.cli.args import Parser, check_environment, join_negative_durations
from spectrace.console import EXIT_USAGE, UsageError, safe
from spectrace.redact import install_logging_filter, redact, remember, remember_token

SECRET_VARIABLES = ("SPECTRACE_LAKE",)  # connection strings and URLs
TOKEN_VARIABLES = ("GRAFANA_TOKEN", "PGPASSWORD")  # a secret whole


def build_parser() -> argparse.ArgumentParser:
    """The ``spectrace`` parser: every subcommand registered the same way, by its module's ``add_parser``."""
    from spectrace.cli import dashboards, diff, doctor, lake, probe, query, report, store, top

    parser = Parser(prog="spectrace", description="Observability for speculative decoding in vLLM.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (query, report, diff, doctor, probe, dashboards, lake, store, top):
        command.add_parser(sub)
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
    # every secret this command was given (a catalog, a URL with a password, a token): no line it prints echoes it
    import os

    install_logging_filter()
    remember(*argv, *(os.environ.get(name) for name in SECRET_VARIABLES))
    for name in TOKEN_VARIABLES:
        remember_token(os.environ.get(name))
    parser = build_parser()
    try:
        try:
            args = parser.parse_args(join_negative_durations(argv))
        except SystemExit as exc:  # --help, or doctor's own one-line error
            return int(exc.code or 0) and EXIT_USAGE
        check_environment()  # every subcommand: a SPECTRACE_* value out of its range is one line, exit 2
        return args.func(args)
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # every subcommand: one line on stderr, exit 2, never a traceback
        if debug:
            raise
        print(f"spectrace: error: {safe(redact(_one_line(exc)))}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
