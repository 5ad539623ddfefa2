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


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
