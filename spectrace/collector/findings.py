"""How a finding is written, wherever a judge found it: a ``findings`` row, an event on its span, one log line.

Every judge in the collector hands its findings here: the load-time judge (``spectrace.collector.judging``) and the
run judge the drain feeds (``spectrace.collector.drain``). The findings gauge follows the rows
(``spectrace.sinks.metrics.MetricsSink``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("vllm.spectrace")

_LEVEL = {"error": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO}


def emit(rt, findings: list, *, role: str, span: Any = None, rank: int | None = None, run: Any = None) -> None:
    """``findings`` (``spectrace.audit.Finding``) as rows of ``role`` / ``rank`` / ``run``, events on ``span`` (if
    it records) and log lines at their severity."""
    now = time.time_ns()
    for finding in findings:
        rt.record("findings", {"ts": now, **finding.as_row()}, role=role, rank=rank, run=run)
        if span is not None and span.is_recording():
            span.add_event(
                f"spectrace.finding.{finding.code}",
                {
                    "code": finding.code,
                    "severity": finding.severity,
                    "model_role": finding.model_role or "",
                    "message": finding.message,
                    "fix": finding.fix,
                    "caused_by": finding.caused_by or "",
                },
            )
        log.log(
            _LEVEL.get(finding.severity, logging.INFO),
            "spectrace %s %s [%s]: %s%s",
            finding.severity.upper(),
            finding.code,
            finding.model_role or "-",
            finding.message,
            f" Fix: {finding.fix}" if finding.fix else "",
        )
