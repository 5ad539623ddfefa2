"""Whose records these are: the process a pipeline writes for.

Rows (``pid``), segment names (``<host>-<pid>-…``) and the exposition file (``<pid>.<start>.prom``,
whose liveness the collector checks) are keyed by the traced process. A pipeline process
(``spectrace.collector.process``) works for the engine process that started it, so it
:func:`adopt`\\ s that process's pid; everywhere else the pid is the process's own.
"""

from __future__ import annotations

import os

_adopted: int | None = None


def pid() -> int:
    """The pid records are written under: the adopted engine's, else this process's."""
    return _adopted if _adopted is not None else os.getpid()


def adopt(engine_pid: int) -> None:
    """Write every record of this process under ``engine_pid`` (a pipeline process, once, at start)."""
    global _adopted
    _adopted = int(engine_pid)


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux: ``/proc/<pid>/stat``), else None (gone, a
    zombie, no ``/proc``). A pid and its start name one process: a pid reused later has another start."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[19].decode() if len(fields) > 19 and fields[0] not in (b"Z", b"X") else None


def alive(pid: int, start: str | None) -> bool:
    """Is ``pid`` a running process (not a zombie) that started at ``start`` (None or "0": whenever it started)?"""
    if os.path.isdir("/proc/self"):
        now = start_time(pid)
        return now is not None and (start in (None, "0") or now == start)
    return pid_alive(pid)  # no /proc: the pid exists, whenever it started


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
