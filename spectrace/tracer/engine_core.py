"""Engine-core hooks.

vLLM 0.32 site: ``v1/engine/core.py::EngineCore._initialize_kv_caches`` runs once
per engine start, after the workers have loaded the model; it asks them for
their KV-cache specs (layer name -> spec).
"""

from __future__ import annotations

from spectrace.tracer import runtime
from spectrace.tracer.hooks import Hook

ROLE = "engine_core"


def wrap_initialize_kv_caches(original):
    def _initialize_kv_caches(self, vllm_config, *args, **kwargs):
        rt = runtime.get()
        with runtime.guard("engine_core.kv_caches"):
            if rt is not None:
                rt.note_vllm_config(vllm_config)
                rt.enter_role(ROLE)
        if rt is None:
            return original(self, vllm_config, *args, **kwargs)
        with rt.span("spectrace.engine_core.init_kv_caches", role=ROLE):
            result = original(self, vllm_config, *args, **kwargs)
        with runtime.guard("engine_core.kv_caches"):
            from spectrace.tracer import layout

            layout.record_kv_cache_specs(rt, self, vllm_config, ROLE)
        return result

    return _initialize_kv_caches


HOOKS = [
    Hook("engine_core.kv_caches", "vllm.v1.engine.core:EngineCore._initialize_kv_caches", wrap_initialize_kv_caches),
]
