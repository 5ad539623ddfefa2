"""Records an engine process's shipper could not hand to a pipeline process, kept where the store cannot lose them.

The shipper (``spectrace.recorder.shipper``) counts every record it could not hand over: messages a pipeline process
never acknowledged before it died or was stopped, messages written to no pipeline process (restarts exhausted, a pipe
that stayed full). A pipeline process it starts again is told the count and writes it; a count no pipeline process
took (the last one died, or was stopped at the engine's exit) must outlive both. So the shipper keeps it in two places
of its own, as well as its log:

- the **ledger**: ``<SPECTRACE_DIR>/.lost/<host>.<pid>.<start time>.json``, the count no pipeline process has written
  yet (rewritten as it grows, removed once a pipeline process took it). The next pipeline process started on this host
  for this store, of any engine, claims the ledgers of processes that are gone (:func:`claim`) and writes each into the
  store's ``internal_errors`` (hook :data:`HOOK`, the lost engine's pid, host and run, ``count`` the records);
- **its own exposition file** beside the pipeline process's in the metrics directory (``<pid>.<start>.shipper.prom``,
  read by vLLM's ``/metrics`` like every process's file): ``spectrace_shipper_lost_records_total`` (every record this
  process's shipper lost, its lifetime) and ``spectrace_tracing_stopped`` (1 once restarts are exhausted, with the
  reason), written only once something was lost.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from spectrace import files, identity

HOOK = "shipper.lost_records"  # internal_errors.hook of a ledger's row
FOLDER = ".lost"
MAX_LEDGER_BYTES = 64 << 10
_NAME = re.compile(r"(?P<host>[A-Za-z0-9_.-]{1,255})\.(?P<pid>[1-9][0-9]*)\.(?P<start>[0-9]+)\.json")


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (as the exposition files are named), else "0"."""
    return identity.start_time(pid) or "0"


def _safe_host(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", host)[:255] or "host"


class Ledger:
    """One engine process's ledger file and exposition file (either may be off: no duckdb / prometheus exporter)."""

    def __init__(self, settings, pid: int, host: str) -> None:
        self.settings = settings
        self.pid, self.host = pid, host
        start = _start_time(pid)
        self.path = Path(settings.dir) / FOLDER / f"{_safe_host(host)}.{pid}.{start}.json" if "duckdb" in settings.exporters else None
        self.metrics_path: Path | None = None  # set by the shipper once the metrics directory is known
        self.metrics_name = f"{pid}.{start}.shipper.prom"

    # -- the ledger ------------------------------------------------------------------

    def write(self, unreported: int, total: int, messages: int, reasons: list[str], run_id: str | None) -> None:
        """The count no pipeline process has written yet (``unreported``), or no file when it is 0. Raises OSError."""
        if self.path is None:
            return
        if unreported <= 0:
            self.remove()
            return
        folder_mode, file_mode = files.modes(self.settings.store_group)  # the store's
        files.make_folder(self.path.parent, Path(self.settings.dir), folder_mode)  # another user's: UnsafeFolder
        doc = {"pid": self.pid, "host": self.host, "run_id": run_id, "records": int(unreported), "lost_in_all": int(total),
               "messages": int(messages), "reasons": reasons[-8:], "ts": time.time_ns()}
        _replace(self.path, json.dumps(doc).encode(), file_mode)

    def remove(self) -> None:
        if self.path is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass

    # -- the exposition file ---------------------------------------------------------

    def write_metrics(self, lost_records: int, stopped: str | None, labels: dict[str, str]) -> None:
        """``spectrace_shipper_lost_records_total`` and ``spectrace_tracing_stopped`` in this process's own file."""
        if self.metrics_path is None:
            return
        base = {"pid": str(self.pid), **{k: v for k, v in labels.items() if v}}
        text = (
            "# HELP spectrace_shipper_lost_records_total Records this traced process's shipper could not hand to a "
            "pipeline process\n# TYPE spectrace_shipper_lost_records_total counter\n"
            f"spectrace_shipper_lost_records_total{_labels(base)} {int(lost_records)}\n"
            "# HELP spectrace_tracing_stopped 1: this process's pipeline process died past its restarts; nothing more "
            "is recorded, every record is counted as lost\n# TYPE spectrace_tracing_stopped gauge\n"
            f"spectrace_tracing_stopped{_labels({**base, 'reason': stopped or ''})} {1 if stopped else 0}\n"
        )
        _replace(self.metrics_path, text.encode(), 0o600)

    def remove_metrics(self) -> None:
        if self.metrics_path is not None:
            try:
                os.unlink(self.metrics_path)
            except OSError:
                pass


def _replace(path: Path, data: bytes, mode: int) -> None:
    """``data`` as the file ``path``: through a hidden name created here (never through a planted link), renamed."""
    files.write_durably(path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp"), path, mode,
                        lambda out: out.write(data), sync=False)


def _labels(labels: dict[str, str]) -> str:
    def value(v: str) -> str:
        return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    return "{" + ",".join(f'{k}="{value(v)}"' for k, v in labels.items()) + "}"




def claim(settings, host: str) -> list[tuple[Path, dict[str, Any]]]:
    """The ledgers of this host's processes that are gone, each renamed to a name only this process holds (two
    pipeline processes starting at once never both take one): (claimed path, its document). A file that is not a
    ledger (a link, another user's, too large, not its JSON) is left where it is."""
    if "duckdb" not in settings.exporters:
        return []
    folder = Path(settings.dir) / FOLDER
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    mine = _safe_host(host)
    out = []
    for entry in entries:
        match = _NAME.fullmatch(entry.name)
        if match is None or match["host"] != mine or identity.alive(int(match["pid"]), match["start"]):
            continue
        claimed = folder / f".claimed.{os.getpid()}.{entry.name}"
        try:
            st = os.lstat(entry.path)
            if not entry.is_file(follow_symlinks=False) or st.st_uid != os.geteuid() or st.st_size > MAX_LEDGER_BYTES:
                continue
            os.rename(entry.path, claimed)
        except OSError:
            continue  # taken by another process meanwhile
        try:
            fd = os.open(claimed, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as inp:
                doc = json.loads(inp.read(MAX_LEDGER_BYTES))
            records = int(doc["records"])
            if records <= 0:
                raise ValueError("no records")
            doc["records"] = records
        except (OSError, ValueError, KeyError, TypeError):
            try:
                os.rename(claimed, entry.path)  # not a ledger this code wrote: left as it was
            except OSError:
                pass
            continue
        out.append((claimed, doc))
    return out


def write_claimed(rt, host: str) -> int:
    """The ledgers :func:`claim` takes, each one row of ``rt``'s ``internal_errors`` (hook :data:`HOOK`, ``count``
    the records, under the lost process's pid, host and run), flushed, then removed; how many records. Whichever
    process writes the store calls it at its start: a pipeline process (``spectrace.collector.process``), or
    with ``SPECTRACE_PIPELINE=thread`` the traced process itself. Never raises (a failure is one counted error)."""
    import logging

    try:
        claimed = claim(rt.settings, host)
    except Exception as exc:
        rt.count_error("pipeline.losses", exc)
        return 0
    for _, doc in claimed:
        reasons = "; ".join(str(r) for r in doc.get("reasons") or [])[:400]
        rt.pipeline.append("internal_errors", {
            **rt.common("process"), "run_id": doc.get("run_id"), "pid": doc.get("pid"), "host": doc.get("host"),
            "ts": time.time_ns(), "hook": HOOK, "count": int(doc["records"]),
            "error": f"lost by the shipper of pid {doc.get('pid')}, which exited: {reasons}"[:500]})
        logging.getLogger("vllm.spectrace").warning(
            "spectrace: pid %s on this host exited with %d records its pipeline processes never wrote; written into "
            "the store (internal_errors, hook %s)", doc.get("pid"), doc["records"], HOOK)
    if claimed:
        rt.flush()
        for path, _ in claimed:
            try:
                os.unlink(path)
            except OSError:
                pass
    return sum(doc["records"] for _, doc in claimed)
