"""Engine-core hooks.

vLLM 0.32 site: ``v1/engine/core.py::EngineCore._initialize_kv_caches`` runs once
per engine start, after the workers have loaded the model; it asks them for
their KV-cache specs (layer name -> spec). The per-layer spec itself is read on
the worker (``spectrace.tracer.layout``); here the engine core joins the run and
spans the KV-cache set-up.
"""

from __future__ import annotations

from spectrace.tracer import runtime
from spectrace.tracer.hooks import Hook

ROLE = "engine_core"


def wrap_initialize_kv_caches(original, hook: str):
    def _initialize_kv_caches(self, vllm_config, *args, **kwargs):
        span = None
        with runtime.guard(hook) as rt:
            if rt is not None:
                rt.note_vllm_config(vllm_config)
                if rt.verify is not None and rt.run is not None:
                    rt.verify.note_config(rt.run.run_id, vllm_config)  # the run's context boundaries
                rt.enter_role(ROLE)
                span = rt.start_span("spectrace.engine_core.init_kv_caches", role=ROLE)
        try:
            result = original(self, vllm_config, *args, **kwargs)
        except BaseException as exc:
            with runtime.guard(hook) as rt:
                if rt is not None:
                    rt.end_span(span, exc)
            raise
        with runtime.guard(hook) as rt:
            if rt is not None:
                rt.end_span(span)
        return result

    return _initialize_kv_caches


HOOKS = [
    Hook("engine_core.kv_caches", "vllm.v1.engine.core:EngineCore._initialize_kv_caches", wrap_initialize_kv_caches),
]
