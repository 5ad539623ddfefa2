"""vLLM general plugin entry point (group ``vllm.general_plugins``).

vLLM calls :func:`register` once in every process it starts (frontend, engine
core, each worker). With tracing off it returns at once: nothing is imported
and nothing is patched. With tracing on, a failure to start (a bad setting, a
missing dependency) is one log line and vLLM runs untraced: tracing never stops
the engine.
"""

import os


def register() -> None:
    if os.environ.get("SPECTRACE", "").strip().lower() in ("", "0", "false", "no", "off"):
        return
    try:
        from spectrace.tracer import stages

        stages.start()
    except Exception as exc:  # never let tracing stop vLLM
        import logging

        logging.getLogger("vllm.spectrace").error(
            "spectrace: tracing is off in this process: %s: %s", type(exc).__name__, exc
        )
