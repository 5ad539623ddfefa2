"""Engine-core hooks.

vLLM 0.32 site: ``v1/engine/core.py::EngineCore._initialize_kv_caches`` runs once
per engine start, after the workers have loaded the model; it asks them for
their KV-cache specs (layer name -> spec). The per-layer spec itself is read on
the worker (``spectrace.recorder.layout``); here the engine core joins the run and
spans the KV-cache set-up. A data-parallel engine's core moves to the engine's own run first
(``spectrace.recorder.run_agreement.join_dp_engine``) and writes its ``runs`` row.
"""

from __future__ import annotations

import time

import spectrace
from spectrace.vllm_objects.configs import run_info
from spectrace.recorder.around import around
from spectrace.recorder import run_agreement, runtime
from spectrace.recorder.hooks import Hook

ROLE = "engine_core"


def _kv_caches_start(rt, engine_core, vllm_config, *args, **kwargs):
    if run_agreement.join_dp_engine(rt, vllm_config):  # a data-parallel engine: a run of its own
        _record_dp_run(rt, vllm_config)
    rt.note_vllm_config(vllm_config)
    if rt.verify is not None and rt.run is not None:
        rt.verify.note_config(rt.run.run_id, vllm_config)  # the run's context boundaries
    rt.enter_role(ROLE)
    return rt.start_span("spectrace.engine_core.init_kv_caches", role=ROLE)


def _record_dp_run(rt, vllm_config) -> None:
    """The ``runs`` row of one DP engine's run (the frontend wrote its own run's)."""
    info = run_info(None, vllm_config)
    rt.run.info.update(info)
    parts = rt.run.traceparent.split("-")
    rt.record("runs", {
        "started_at": time.time_ns(), "vllm_version": runtime.vllm_version(), "spectrace_version": spectrace.__version__,
        **{k: info[k] for k in ("target_model", "draft_model", "method", "method_inferred", "num_speculative_tokens",
                                "model_runner")},
        "trace_id": parts[1] if len(parts) >= 3 else None,
    }, role=ROLE)


# EngineCore._initialize_kv_caches: the engine core's role, its run's config, one span
wrap_initialize_kv_caches = around(
    before=_kv_caches_start,
    after=[(None, lambda rt, span, result, *args, **kwargs: rt.end_span(span))],
    failed=lambda rt, span, exc, *args, **kwargs: rt.end_span(span, exc),
)


HOOKS = [
    Hook("engine_core.kv_caches", "vllm.v1.engine.core:EngineCore._initialize_kv_caches", wrap_initialize_kv_caches),
]
