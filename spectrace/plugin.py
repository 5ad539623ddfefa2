"""vLLM general plugin entry point (group ``vllm.general_plugins``).

vLLM calls :func:`register` once in every process it starts (frontend, engine
core, each worker). With tracing off it returns at once: nothing else of
spectrace is imported and nothing is patched. With tracing on, a setting out of
its range is one log line (the variable, the value, the default used instead)
and tracing goes on with the default (:meth:`spectrace.settings.Settings.from_env`);
a failure to start (a missing dependency) is one log line and vLLM runs untraced:
tracing never stops the engine.

vLLM also loads general plugins in its model-inspection subprocess
(``python -m vllm.model_executor.models.registry``, run when its registry cache
is cold): that process runs no engine, so spectrace stays off there too.
"""

import sys

from spectrace.settings import tracing_enabled

INSPECTION_MAIN = "vllm.model_executor.models.registry"  # the module vLLM runs as __main__ to inspect model classes


def register() -> None:
    if not tracing_enabled() or _inspecting():
        return
    try:
        from spectrace.recorder import stages

        stages.start()
    except Exception as exc:  # never let tracing stop vLLM
        import logging

        logging.getLogger("vllm.spectrace").error(
            "spectrace: tracing is off in this process: %s: %s", type(exc).__name__, exc
        )


def _inspecting() -> bool:
    """Whether this process is vLLM's model-inspection subprocess (its ``__main__`` is the registry module)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == INSPECTION_MAIN
