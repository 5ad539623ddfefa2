"""Worker hooks.

vLLM 0.32 site: ``v1/worker/gpu_worker.py::Worker.load_model`` (``CPUWorker``
inherits it) builds and loads target and drafter on the worker. After it returns,
the layers hold what they will really execute.
"""

from __future__ import annotations

from spectrace.tracer import layout, runtime, taps
from spectrace.tracer.hooks import Hook

ROLE = "worker"


def _rank(worker) -> int | None:
    rank = getattr(worker, "rank", None)
    return rank if isinstance(rank, int) else None


def wrap_load_model(original, hook: str):
    def load_model(self, *args, **kwargs):
        rank = _rank(self)
        span = None
        with runtime.guard(hook) as rt:
            if rt is not None:
                rt.note_vllm_config(self.vllm_config)
                rt.enter_role(ROLE, rank)
                span = rt.start_span("spectrace.worker.load_model", role=ROLE, rank=rank)
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            with runtime.guard(hook) as rt:
                if rt is not None:
                    layout.record_load_error(rt, self, exc, ROLE, rank, span)
                    rt.end_span(span, exc)
            raise
        with runtime.guard("worker.layout") as rt:
            if rt is not None:
                layout.record_runtime_layout(rt, self, ROLE, rank, span)
        with runtime.guard("worker.taps") as rt:
            if rt is not None:
                taps.record_taps(rt, self, ROLE, rank, span)
        with runtime.guard(hook) as rt:
            if rt is not None:
                rt.end_span(span)
        return result

    return load_model


HOOKS = [
    Hook("worker.load_model", "vllm.v1.worker.gpu_worker:Worker.load_model", wrap_load_model),
]
