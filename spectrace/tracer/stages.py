"""Every vLLM hook spectrace installs, stage by stage."""

from __future__ import annotations

from spectrace.tracer.hooks import Hook


def all_hooks() -> list[Hook]:
    from spectrace.tracer import engine_core, frontend, verify, worker

    return [*frontend.HOOKS, *engine_core.HOOKS, *worker.HOOKS, *verify.HOOKS]
