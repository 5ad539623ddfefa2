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
        raise argparse.ArgumentTypeError(f"{text!r} is negative: a duration is >= 0")
    if value * 1e9 > time.time_ns():
        raise argparse.ArgumentTypeError(f"{text!r} is out of range: longer than the time since 1970")
    return value


def default_dir() -> str:
    from spectrace.settings import store_dir

    return str(store_dir())


SINCE_HELP = ("only rows recorded in the last DURATION (30m, 1h, 7d; a bare number is seconds; 0: no limit): "
              "tables with a ts column; older files are not read")


def since_ns(text: str | None) -> int | None:
    """``--since 30m`` (``90s``, ``1h``, ``7d``, ``2w``, a bare number of seconds) to the time since the epoch, in ns,
    it starts at; ``0`` (as ``SPECTRACE_RETENTION=0``) and no ``--since``: None, every row. A negative duration, or
    text that is not one, is one line."""
    if text is None:
        return None
    try:
        seconds = duration(text)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"--since {exc} (e.g. 30m, 1h, 7d; a bare number is seconds; 0: no limit)") from None
    if seconds == 0:
        return None
    import time

    return time.time_ns() - int(seconds * 1e9)


# flags whose value is a duration: ``--since -5m`` is read as the flag and a negative value (refused in one line by
# ``duration``), not as argparse's "expected one argument" (a value starting with "-" looks like an option to it)
DURATION_FLAGS = ("--since", "--idle", "--retention", "--keep-snapshots", "--window", "--interval")
_NEGATIVE = re.compile(r"^-\s*(\d+(\.\d*)?|\.\d+)\s*[a-zA-Z]*$")


def join_negative_durations(argv: list[str]) -> list[str]:
    """``[..., "--since", "-5m", ...]`` -> ``[..., "--since=-5m", ...]`` for :data:`DURATION_FLAGS`."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in DURATION_FLAGS and i + 1 < len(argv) and _NEGATIVE.match(argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def check_environment() -> None:
    """Every ``SPECTRACE_*`` setting read as the command would read it (``Settings.from_env(strict=True)``): a value
    out of its range is the command's one-line error (exit 2), whatever the subcommand, before it reads anything."""
    from spectrace.settings import Settings, SettingsError

    try:
        Settings.from_env(strict=True)
    except SettingsError as exc:
        raise UsageError(f"environment: {exc} (unset it or give a valid value; docs: reference/settings.md)") from None


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
