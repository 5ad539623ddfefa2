"""A real PostgreSQL (Debian's ``postgresql``) on 127.0.0.1, for the lake tests.

A throw-away cluster: ``initdb`` in a temporary folder, ``pg_ctl`` on a free
port, trust authentication on 127.0.0.1 only. PostgreSQL refuses to run as root,
so when we are root both run as the ``postgres`` user (``runuser``) and the
folder is handed to that user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from spectrace.testing.prometheus import free_port


class PostgresUnavailable(RuntimeError):
    pass


def binaries() -> Path | None:
    """The folder holding ``initdb``/``pg_ctl``/``postgres`` (newest Debian major first), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]), reverse=True)
    if found:
        return Path(found[0]).parent
    pg_ctl = shutil.which("pg_ctl")
    return Path(os.path.realpath(pg_ctl)).parent if pg_ctl else None


class PostgresServer:
    """One PostgreSQL cluster with database ``database``; ``catalog`` is DuckLake's connection string."""

    def __init__(self, workdir: Path | None = None, *, database: str = "spectrace") -> None:
        # Own temporary folder by default: the postgres user must reach it, and pytest's
        # temporary folders are private to root.
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="spectrace-postgres-"))
        self.database = database
        self.port = 0
        self.bin = binaries()
        self.user = "postgres"

    @property
    def data(self) -> Path:
        return self.workdir / "pgdata"

    @property
    def catalog(self) -> str:
        """``SPECTRACE_LAKE`` for this server."""
        return f"postgres:dbname={self.database} host=127.0.0.1 port={self.port} user={self.user}"

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        command = [str(self.bin / argv[0]), *argv[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", self.user, "--", *command]
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/")
        if check and proc.returncode != 0:
            raise PostgresUnavailable(f"{' '.join(argv[:2])} failed ({proc.returncode}): {proc.stdout[-2000:]}")
        return proc

    def start(self) -> "PostgresServer":
        if self.bin is None:
            raise PostgresUnavailable("PostgreSQL is missing: apt-get install postgresql (make postgres does)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            owner = pwd.getpwnam(self.user)
            os.chown(self.workdir, owner.pw_uid, owner.pw_gid)
            os.chmod(self.workdir, 0o700)
        else:
            self.user = pwd.getpwuid(os.geteuid()).pw_name
        if not (self.data / "PG_VERSION").exists():
            self._run("initdb", "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8", "--no-sync")
        self.port = free_port()
        self._start()
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, self.database)
        return self

    def _start(self) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.workdir} -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.workdir / "postgres.log"), "-o", options, "-w", "-t", "60", "start")

    def stop(self) -> None:
        """Stop the server (the data stays: ``restart`` brings it back on the same port)."""
        if self.bin is not None and (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)

    def restart(self) -> None:
        deadline = time.time() + 30
        while True:  # the port can linger a moment after a fast stop
            try:
                self._start()
                return
            except PostgresUnavailable:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "PostgresServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.remove()
