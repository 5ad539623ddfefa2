"""The pipeline process outside the engine's process tree.

vLLM 0.32's shutdown (``--shutdown-timeout 0``, the default: Ctrl-C or SIGTERM to ``vllm serve``) SIGKILLs the
engine core at once with every process under it (``vllm.utils.system_utils.kill_process_tree``, which walks
``psutil.Process.children(recursive=True)``). A pipeline process started as the engine's child died with it, and with
it every record it had taken and not written yet: up to a flush interval (2 s) of the engine core's and the workers'
records, lost without a count. So the shipper starts it through a launcher (``python -m
spectrace.collector.process`` behind :data:`LAUNCHER`) that forks the pipeline process, tells the engine its
pid and exits:
the pipeline process is then nobody's child in the engine's tree (init, or the nearest subreaper, adopts it), in a
session of its own, and outlives a killed engine long enough to write what it took; its stdin's EOF ends it as before.
What is lost to such a kill is only what the engine's shipper had not sent yet: at most one ship interval (0.25 s).

:class:`Detached` gives the shipper the part of ``subprocess.Popen``'s interface it uses, on a pid that is not its
child: liveness through a pidfd (Linux 5.3+; ``/proc`` otherwise), ``kill`` through it. An exit status is not ours
to read: ``returncode`` is ``"unknown"`` once it has exited.
"""

from __future__ import annotations

import os
import select
import signal
import struct
import subprocess
import time

PID = struct.Struct("<Q")  # what the launcher writes on the pipeline process's stdout before its first ack
LAUNCH_WAIT_S = 30.0  # a launcher that names no pid in this long is killed (an interpreter start on a loaded host)
EXITED = "unknown"  # the returncode of a pipeline process seen exited: its status is its adopter's, not ours


# The launcher: a fork before any import but the standard library's few (a fork after pyarrow's or DuckDB's threads
# started would leave the child their state without the threads), the child's pid on stdout, and the child, in a
# session of its own (a Ctrl-C is the engine's to handle: it ends the pipeline process by EOF), runs the module.
LAUNCHER = """
import os, runpy, struct, sys
pid = os.fork()
if pid:
    os.write(1, struct.pack("<Q", pid))
    os._exit(0)
os.setsid()
module = sys.argv[1]
sys.argv = [module]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def launch(python: str, module: str, env: dict) -> "Detached":
    """Start ``module`` under ``python`` through :data:`LAUNCHER` and return the process it forked. Raises OSError
    when no pid comes."""
    launcher = subprocess.Popen([python, "-c", LAUNCHER, module], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env=env, close_fds=True)
    try:
        pid = _read_pid(launcher)
    except BaseException:
        _end(launcher)
        raise
    try:
        launcher.wait(timeout=LAUNCH_WAIT_S)  # it exits right after the write: reaped, no zombie of ours
    except subprocess.TimeoutExpired:
        launcher.kill()
    return Detached(launcher, pid)


def _read_pid(launcher: subprocess.Popen) -> int:
    fd = launcher.stdout.raw.fileno()
    got = b""
    deadline = time.monotonic() + LAUNCH_WAIT_S
    while len(got) < PID.size:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise OSError(f"the pipeline process's launcher named no pid in {LAUNCH_WAIT_S:.0f} s")
        chunk = os.read(fd, PID.size - len(got))
        if not chunk:
            raise OSError(f"the pipeline process's launcher exited (status {launcher.wait()}) before naming its pid")
        got += chunk
    (pid,) = PID.unpack(got)
    if not 0 < pid < 1 << 31:
        raise OSError(f"the pipeline process's launcher named pid {pid}")
    return pid


def _end(launcher: subprocess.Popen) -> None:
    try:
        launcher.kill()
        launcher.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        pass


class Detached:
    """A pipeline process the engine did not fork itself (module docstring): ``Popen``'s ``pid``, ``stdin``,
    ``stdout``, ``returncode``, ``poll``, ``wait`` and ``kill``."""

    def __init__(self, launcher: subprocess.Popen, pid: int) -> None:
        self.stdin, self.stdout = launcher.stdin, launcher.stdout  # the pipes the forked process inherited
        self.pid = pid
        self.returncode: str | None = None
        try:
            self._fd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):  # no pidfd (old kernel, not Linux), or it is gone already
            self._fd = None
            if not _alive(pid):
                self._exited()

    def _exited(self) -> None:
        self.returncode = EXITED
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def poll(self) -> str | None:
        if self.returncode is None:
            if self._fd is not None:
                if select.select([self._fd], [], [], 0)[0]:  # readable once the process has exited
                    self._exited()
            elif not _alive(self.pid):
                self._exited()
        return self.returncode

    def wait(self, timeout: float | None = None) -> str:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 0.05 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(f"pipeline process {self.pid}", timeout)
            if self._fd is not None:
                select.select([self._fd], [], [], min(left, 0.5))
            else:
                time.sleep(min(left, 0.05))
        return self.returncode

    def kill(self) -> None:
        if self.poll() is not None:
            return
        try:
            if self._fd is not None:
                signal.pidfd_send_signal(self._fd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            self._exited()


def _alive(pid: int) -> bool:
    """Without a pidfd: the process exists and is not a zombie (one its adopter has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
