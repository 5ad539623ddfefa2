"""spectrace's variables reach Ray workers.

vLLM's Ray executor starts workers with only the variables ``vllm/ray/ray_env.py::get_env_vars_to_copy``
names: those in ``vllm.envs``, the prefixes ``VLLM_``, ``HF_``, ``NCCL_``, ... and the names or prefixes
users add in ``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`` / ``VLLM_RAY_EXTRA_ENV_VARS_TO_COPY``
(comma-separated). Neither ``SPECTRACE*`` (tracing itself, its settings, the run a worker joins)
nor the ``OTEL_*`` variables the OTLP exporter reads are among them. With tracing on, the plugin
adds :data:`PREFIXES` to the prefixes variable in its process, before vLLM builds an executor:
added to what the user set, never replacing it. Only variables set in the driver's environment are
copied (vLLM's own rule), so nothing is invented on the workers.
"""

from __future__ import annotations

import os
from typing import MutableMapping

PREFIXES_ENV = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"
# SPECTRACE (the switch) and SPECTRACE_* (settings, SPECTRACE_ACTIVE_RUN); the OpenTelemetry SDK's
# variables spectrace's OTLP sink and resource read (OTEL_EXPORTER_OTLP_*, OTEL_SERVICE_NAME, ...)
PREFIXES = ("SPECTRACE", "OTEL_")


def carry_to_ray_workers(environ: MutableMapping[str, str] | None = None) -> str:
    """Add :data:`PREFIXES` to ``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY``; returns its new value."""
    environ = os.environ if environ is None else environ
    current = [p.strip() for p in environ.get(PREFIXES_ENV, "").split(",") if p.strip()]
    value = ",".join(current + [p for p in PREFIXES if p not in current])
    environ[PREFIXES_ENV] = value
    return value
