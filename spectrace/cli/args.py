"""What every ``spectrace`` subcommand shares: the parser class (bad arguments are one line), the one
command-line duration, ``--since``, ``--dir`` and ``--lake`` and how a command opens the store or the lake."""

from __future__ import annotations

import argparse
import re

from spectrace.console import UsageError


class Parser(argparse.ArgumentParser):
    """Bad arguments are one line (no usage block): the subcommand and argparse's message."""

    def error(self, message: str):  # type: ignore[override]
        command = self.prog.removeprefix("spectrace").strip()
        raise UsageError(f"{command}: {message}" if command else message)


def duration(text: str) -> float:
    """A command-line duration (:func:`spectrace.settings.duration`'s grammar, the settings' own), >= 0 and no
    longer than the time since 1970 (a time that long ago is a timestamp no store or catalog holds)."""
    import time

    from spectrace.settings import duration as seconds

    try:
        value = seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    if value * 1e9 > time.time_ns():
        raise argparse.ArgumentTypeError(f"{text!r} is out of range: longer than the time since 1970")
    return value


def default_dir() -> str:
    from spectrace.settings import store_dir

    return str(store_dir())


def since_ns(text: str | None) -> int | None:
    """``--since 30m`` (``90s``, ``1h``, ``7d``, ``2w``) to the time since the epoch, in ns, it starts at."""
    if text is None:
        return None
    try:
        seconds = duration(text)
    except argparse.ArgumentTypeError as exc:
        if "out of range" in str(exc):
            raise UsageError(f"--since {exc}") from None
        seconds = 0.0
    if seconds <= 0:
        raise UsageError(f"--since {text!r} is not a duration (e.g. 30m, 1h, 7d)")
    import time

    return time.time_ns() - int(seconds * 1e9)


CATALOG = re.compile(r"^(ducklake:)?\w+:")


LAKE_HELP = "read the fleet lake instead of --dir (catalog default: $SPECTRACE_LAKE)"


def default_catalog() -> str | None:
    from spectrace.settings import Settings

    return Settings.from_env(strict=True).lake


def open_source(args: argparse.Namespace):
    """The store at ``--dir``, or with ``--lake`` the fleet lake (``$SPECTRACE_LAKE`` by default)."""
    from spectrace.store.read import StoreError, open as open_store

    since = since_ns(getattr(args, "since", None))
    locked = getattr(args, "locked", False)
    try:
        if args.lake is None:
            return open_store(args.dir, since=since, locked=locked)
        if locked:
            raise UsageError("--locked reads the store at --dir; the lake's catalog is a network connection it cannot lock")
        if since is not None:
            raise UsageError("--since reads the store at --dir; over the lake, filter on ts in the SQL")
        from spectrace.lake import read as lake

        catalog = args.lake or default_catalog()
        if not catalog:
            raise UsageError("--lake needs a catalog: give one (--lake 'postgres:dbname=... host=...') or set SPECTRACE_LAKE")
        return lake.open(catalog)
    except StoreError as exc:
        raise UsageError(str(exc)) from None
