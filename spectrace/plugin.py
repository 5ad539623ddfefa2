"""vLLM general plugin entry point (group ``vllm.general_plugins``).

vLLM calls :func:`register` once in every process it starts (frontend, engine
core, each worker). With tracing off it returns at once: nothing is imported
and nothing is patched.
"""

import os


def register() -> None:
    if os.environ.get("SPECTRACE", "").strip().lower() in ("", "0", "false", "no", "off"):
        return
    from spectrace.tracer import runtime

    runtime.start()
