"""Engine-core hooks.

vLLM 0.32 site: ``v1/engine/core.py::EngineCore._initialize_kv_caches`` runs once
per engine start, after the workers have loaded the model; it asks them for
their KV-cache specs (layer name -> spec). The per-layer spec itself is read on
the worker (``spectrace.tracer.layout``); here the engine core joins the run and
spans the KV-cache set-up.
"""

from __future__ import annotations

from spectrace.tracer.around import around
from spectrace.tracer import runtime
from spectrace.tracer.hooks import Hook

ROLE = "engine_core"


def _kv_caches_start(rt, engine_core, vllm_config, *args, **kwargs):
    rt.note_vllm_config(vllm_config)
    if rt.verify is not None and rt.run is not None:
        rt.verify.note_config(rt.run.run_id, vllm_config)  # the run's context boundaries
    rt.enter_role(ROLE)
    return rt.start_span("spectrace.engine_core.init_kv_caches", role=ROLE)


# EngineCore._initialize_kv_caches: the engine core's role, its run's config, one span
wrap_initialize_kv_caches = around(
    before=_kv_caches_start,
    after=[(None, lambda rt, span, result, *args, **kwargs: rt.end_span(span))],
    failed=lambda rt, span, exc, *args, **kwargs: rt.end_span(span, exc),
)


HOOKS = [
    Hook("engine_core.kv_caches", "vllm.v1.engine.core:EngineCore._initialize_kv_caches", wrap_initialize_kv_caches),
]
