"""spectrace's Prometheus series, served on vLLM's own ``/metrics``.

Every traced process (API server, engine core, each worker) writes its series
once per flush as one Prometheus text-exposition file, ``<dir>/<pid>.<start>.prom``
(written to a temporary name, then ``os.replace``: a reader never sees half a
file). ``<dir>`` is one directory per server: the first traced process of a
``vllm serve`` (or of an ``LLM(...)`` script) creates it and hands it to the
processes vLLM starts afterwards through ``SPECTRACE_METRICS_DIR``.

:class:`FileCollector` re-exposes the files of live processes only: a file whose
process is gone (exited, killed, a zombie, or its pid reused by another process)
is skipped and removed at the next scrape, so a dead engine's series leave
``/metrics`` at once. The API server registers it in vLLM's registry
(``spectrace.recorder.api_server``); an offline engine serves it on a standalone
endpoint (:func:`serve_standalone`).

Each re-exposed sample carries ``pid`` and the labels vLLM's own series carry
(``model_name``, and ``engine`` in the engine core and workers), so spectrace's
series join vLLM's: ``on (model_name, engine)``.

This is node_exporter's textfile-collector pattern, chosen over prometheus_client's
multiprocess mode, which needs ``PROMETHEUS_MULTIPROC_DIR`` set in every process
before prometheus_client is imported (that would switch vLLM's own metrics into
multiprocess mode) and keeps a dead process's counters (README, "Prometheus").
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from spectrace import identity, settings
from spectrace.files import write_durably
from spectrace.identity import alive as _alive, start_time as _start_time  # noqa: F401  (exposition._alive: tests)
from spectrace.sink import Sink

log = logging.getLogger("vllm.spectrace")

DIR_ENV = settings.METRICS_DIR_ENV
SUFFIX = ".prom"
_DIR_PREFIX = "spectrace-metrics-"
# A file the collector reads: <pid>.<start time>.prom, both non-zero (``1.prom`` or
# ``1.0.prom`` would skip the liveness check, so they are never read).
# <pid>.<start time>.prom; a shipping engine process's own losses: <pid>.<start time>.shipper.prom
# (spectrace.recorder.losses), beside its pipeline process's file
_FILE_NAME = re.compile(r"([1-9][0-9]*)\.([1-9][0-9]*)(?:\.shipper)?" + re.escape(SUFFIX))
MAX_FILE_BYTES = 4 << 20  # one process's series are a few kB; a larger file is skipped

# Labels vLLM's own series carry, for this process: model_name (the served model
# name) and engine (the DP engine index). Set by spectrace.recorder.api_server hooks.
PROCESS_LABELS: dict[str, str] = {}

_dir_lock = threading.Lock()
_dir: tuple[int, Path] | None = None  # (pid that resolved it, directory)


class MissingExtra(RuntimeError):
    pass


# -- the per-server directory ------------------------------------------------


def server_dir(configured: Path | None) -> Path:
    """This server's exposition directory (created by the first traced process)."""
    global _dir
    with _dir_lock:
        if _dir is not None and _dir[0] == os.getpid():
            return _dir[1]
        inherited = settings.inherited(DIR_ENV)  # set by this process or its parent below
        if inherited:
            path = Path(inherited)
        elif configured is not None:
            path = Path(configured)
        else:
            path = None
        if path is not None and not _usable_dir(path):
            path = None
        if path is None:
            path = _private_dir()
        os.environ[DIR_ENV] = str(path)
        _dir = (os.getpid(), path)
        return path


def _usable_dir(path: Path) -> bool:
    """Make ``path`` (0700) or check an existing one: ours, and then made 0700.

    A directory owned by another user, or not a directory, is refused with one log
    line (the caller then uses a private temporary directory): its owner could plant
    files, FIFOs or symlinks among the exposition files.
    """
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.stat(path)
    except OSError as exc:
        log.error("spectrace: %s=%s cannot be used (%s); using a private temporary directory", DIR_ENV, path, exc.strerror or exc)
        return False
    if not stat.S_ISDIR(info.st_mode):
        log.error("spectrace: %s=%s is not a directory; using a private temporary directory", DIR_ENV, path)
        return False
    if info.st_uid != os.getuid():
        wide = " and group/world-writable" if info.st_mode & 0o022 else ""
        log.error(
            "spectrace: %s=%s is owned by uid %d, not this user (uid %d)%s: refused, using a private temporary directory",
            DIR_ENV, path, info.st_uid, os.getuid(), wide,
        )
        return False
    if stat.S_IMODE(info.st_mode) != 0o700:
        try:
            os.chmod(path, 0o700)
        except OSError as exc:
            log.error("spectrace: %s=%s cannot be made 0700 (%s); using a private temporary directory", DIR_ENV, path, exc.strerror or exc)
            return False
        if info.st_mode & 0o077:
            log.warning("spectrace: %s=%s was mode %04o; made 0700", DIR_ENV, path, stat.S_IMODE(info.st_mode))
    return True


def _private_dir() -> Path:
    """A fresh 0700 temporary directory, removed when its creating process exits."""
    root = Path(tempfile.gettempdir())
    _sweep(root)
    path = Path(tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-", dir=root))
    created_by = os.getpid()

    def remove() -> None:
        if os.getpid() == created_by:
            shutil.rmtree(path, ignore_errors=True)

    import atexit

    atexit.register(remove)
    return path


def _sweep(root: Path) -> None:
    """Remove directories left by servers that were killed (their creator is gone)."""
    try:
        for entry in root.glob(f"{_DIR_PREFIX}*"):
            pid = entry.name[len(_DIR_PREFIX):].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid), None):
                shutil.rmtree(entry, ignore_errors=True)
    except OSError:
        pass


# -- processes --------------------------------------------------------------


# -- writing (every traced process) -------------------------------------------


class _Families:
    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self):
        return self.families


class ProcessFile:
    """This process's series: an OpenTelemetry reader and its exposition file."""

    def __init__(self, directory: Path, on_error=None) -> None:
        try:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import CollectorRegistry
        except ImportError:
            raise MissingExtra("SPECTRACE_EXPORTER=prometheus needs opentelemetry-exporter-prometheus and prometheus-client") from None
        self.pid = identity.pid()  # the traced process (a pipeline process writes its engine's file)
        self.owner = os.getpid()  # the process that writes (forks, atexit)
        self.registry = CollectorRegistry(auto_describe=False)
        self.reader = PrometheusMetricReader(registry=self.registry, disable_target_info=True, scope_info_enabled=False)
        self.path = Path(directory) / f"{self.pid}.{_start_time(self.pid) or 0}{SUFFIX}"
        self.closed = False
        self.on_error = on_error
        self._lock = threading.Lock()
        import atexit

        atexit.register(self.close)

    def labels(self) -> dict[str, str]:
        return {"pid": str(self.pid), **{k: v for k, v in PROCESS_LABELS.items() if v}}

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        extra = self.labels()
        families = []
        for family in self.registry.collect():
            family.samples = [s._replace(labels={**s.labels, **extra}) for s in family.samples]
            families.append(family)
        return generate_latest(_Families(families))

    def write(self) -> None:
        """Rewrite the file (from the background flush; never from vLLM's threads)."""
        with self._lock:
            if self.closed or os.getpid() != self.owner:
                return
            try:
                self._replace(self.render())
            except FileNotFoundError as exc:
                if not self.path.parent.exists():
                    # the directory is gone: the process that made it (the server, or a headless node's
                    # launcher, which exits before its workers) removed it at exit; nobody reads it now
                    self.closed = True
                elif self.on_error is None:
                    raise
                else:
                    self.on_error(exc)
            except Exception as exc:  # counted, never raised into the flush
                if self.on_error is None:
                    raise
                self.on_error(exc)

    def _replace(self, text: bytes) -> None:
        # An unpredictable temporary name, created (never opened if it exists, never
        # through a symlink) 0600, then renamed over the file: a planted name is never followed.
        write_durably(self.path.with_name(f".{self.path.name}.{secrets.token_hex(8)}.tmp"), self.path, 0o600,
                      lambda out: out.write(text), sync=False)

    def close(self) -> None:
        """Stop writing and remove the file (a process that exits stops contributing)."""
        with self._lock:
            if self.closed or os.getpid() != self.owner:
                return
            self.closed = True
            try:
                self.path.unlink()
            except OSError:
                pass


class ExpositionSink(Sink):
    """The pipeline's ``prometheus`` sink: this process's series, rewritten after a flush.

    Its OpenTelemetry reader (``metric_reader()``) is what the process's meter provider
    exports into; the file (and the per-server directory) is made then, at the first hook
    that builds telemetry, not when the sink is chosen. ``export`` runs after the flush's
    sources have updated the counters, so each file holds the flush's counts. A periodic
    flush rewrites it at most every ``interval_s`` (``SPECTRACE_EXPOSITION_INTERVAL``):
    rendering is 6-8 ms of CPU a time at batch 256, and Prometheus reads it once a scrape. A flush
    asked for, the last one, and the first flush with nothing new after one that skipped
    always rewrite it (the counts catch up as soon as records stop).
    """

    name = "prometheus"

    def __init__(self, metrics_dir: Path | None, interval_s: float = 0.0) -> None:
        try:
            import opentelemetry.exporter.prometheus  # noqa: F401
            import prometheus_client  # noqa: F401
        except ImportError:
            raise MissingExtra("SPECTRACE_EXPORTER=prometheus needs opentelemetry-exporter-prometheus and prometheus-client") from None
        self.metrics_dir = metrics_dir
        self.file: ProcessFile | None = None
        self.status = "prometheus"
        self.interval_s = interval_s
        self.written = 0  # times the file was rewritten
        self.skipped = 0  # periodic flushes that left it as it was
        self._written_at = float("-inf")
        self._behind = False  # a flush since the last rewrite was skipped

    @classmethod
    def from_settings(cls, settings) -> "ExpositionSink":
        return cls(settings.metrics_dir, settings.exposition_interval_s)

    def metric_reader(self):
        if self.file is None:
            self.file = ProcessFile(server_dir(self.metrics_dir))
            self.status = str(self.file.path)
        return self.file.reader

    def export(self, batch) -> None:
        if self.file is None:
            return
        now = time.monotonic()
        if (getattr(batch, "periodic", False) and now - self._written_at < self.interval_s
                and not (self._behind and not batch.rows)):
            self._behind = True
            self.skipped += 1
            return
        self.file.write()
        self._written_at, self._behind = now, False
        self.written += 1

    def stats(self) -> dict:
        return {"written": self.written, "skipped": self.skipped}

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


# -- reading (the API server, or the offline endpoint) ----------------------


_skips: dict[str, tuple[dict[str, int], set[str]]] = {}


class FileCollector:
    """A prometheus_client collector over the files of the live processes in ``directory``.

    Only regular files owned by this user, named ``<pid>.<start time>.prom`` for a live
    process, at most :data:`MAX_FILE_BYTES`, are read (opened without following a symlink
    and without blocking on a FIFO). A file that is none of these, or does not parse, is
    skipped and counted in :attr:`skipped` (one log line per file name); the other files'
    series are collected as before. ``vllm:*`` series in a file are never re-exposed.
    """

    def __init__(self, directory: Path, on_error=None) -> None:
        self.directory = Path(directory)
        self.on_error = on_error
        # reason -> files skipped, over all scrapes, and the names logged: per directory, not per
        # collector (in multiprocess mode the instrumentator builds a registry, so a collector, per scrape)
        self.skipped, self._logged = _skips.setdefault(str(self.directory), ({}, set()))

    def describe(self) -> list:
        return []  # names vary with the run; never collect at registration

    def collect(self) -> Iterable[Any]:
        try:
            return list(self._merged())
        except Exception as exc:  # never break vLLM's /metrics
            if self.on_error is not None:
                self.on_error(exc)
            return []

    def _skip(self, name: str, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if name not in self._logged:
            self._logged.add(name)
            log.warning("spectrace: skipped %s in %s (%s); it is not re-exposed", name, self.directory, reason)

    def _files(self) -> list[str]:
        live = []
        for name in sorted(os.listdir(self.directory)):
            if not name.endswith(SUFFIX) or name.startswith("."):
                continue
            match = _FILE_NAME.fullmatch(name)
            if match is None:
                self._skip(name, "name without a pid and its start time")
            elif _alive(int(match[1]), match[2]):
                live.append(name)
            else:
                try:
                    os.unlink(self.directory / name)
                except OSError:
                    pass
        return live

    def _read(self, name: str) -> str | None:
        try:
            fd = os.open(self.directory / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:  # removed since the listing: its process just exited
            return None
        except OSError as exc:
            self._skip(name, "symlink" if os.path.islink(self.directory / name) else f"cannot open: {exc.strerror or exc}")
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                self._skip(name, "not a regular file")
            elif info.st_uid != os.getuid():
                self._skip(name, "owned by another user")
            elif info.st_size > MAX_FILE_BYTES:
                self._skip(name, "over the size cap")
            else:
                data = os.read(fd, MAX_FILE_BYTES + 1)
                if len(data) > MAX_FILE_BYTES:
                    self._skip(name, "over the size cap")
                    return None
                try:
                    return data.decode("utf-8")
                except UnicodeDecodeError:
                    self._skip(name, "malformed")
        except OSError as exc:
            self._skip(name, f"cannot read: {exc.strerror or exc}")
        finally:
            os.close(fd)
        return None

    def _merged(self) -> Iterable[Any]:
        from prometheus_client.metrics_core import Metric
        from prometheus_client.parser import text_string_to_metric_families

        merged: dict[str, Any] = {}
        for name in self._files():
            text = self._read(name)
            if text is None:
                continue
            try:
                families = [f for f in text_string_to_metric_families(text) if not f.name.startswith("vllm:")]
            except Exception:  # one bad file never empties the others' series
                self._skip(name, "malformed")
                continue
            for family in families:
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                into.samples.extend(family.samples)
        return merged.values()


# -- the offline engine's endpoint ------------------------------------------

_standalone: dict[int, Any] = {}


def serve_standalone(directory: Path, host: str, port: int, on_error=None, what: str = "offline engine") -> bool:
    """Serve the directory's series on ``host:port``/metrics, once per process.

    A taken port is one log line (the series stay in the store); no other port is tried.
    """
    if os.getpid() in _standalone:
        return True
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(FileCollector(directory, on_error))
    try:
        server = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        log.error(
            "spectrace: Prometheus port %s:%d is not available (%s): this %s's series are "
            "not served; set SPECTRACE_PROMETHEUS_PORT to a free port",
            host,
            port,
            exc.strerror or exc,
            what,
        )
        _standalone[os.getpid()] = None
        return False
    _standalone[os.getpid()] = server
    log.info("spectrace: Prometheus metrics of this %s on http://%s:%d/metrics", what, host, port)
    return True
