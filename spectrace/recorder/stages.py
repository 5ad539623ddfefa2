"""Every vLLM hook spectrace installs, stage by stage, and the start of tracing in a process."""

from __future__ import annotations

from spectrace.recorder import api_server, engine_core, frontend, ray_carry, runtime, verify, worker
from spectrace.recorder.verify import hooks_v2 as verify_v2
from spectrace.recorder.hooks import Hook


def all_hooks() -> list[Hook]:
    return [*frontend.HOOKS, *engine_core.HOOKS, *worker.HOOKS, *verify.HOOKS, *verify_v2.HOOKS, *api_server.HOOKS]


def start() -> runtime.Runtime:
    """This process's runtime with every hook installed (``spectrace.plugin`` calls it); spectrace's
    variables made to reach Ray workers (``spectrace.recorder.ray_carry``)."""
    ray_carry.carry_to_ray_workers()
    return runtime.start(hooks=all_hooks(), make_capture=verify.VerifyCapture)
