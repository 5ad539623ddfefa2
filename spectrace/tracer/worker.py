"""Worker hooks.

vLLM 0.32 site: ``v1/worker/gpu_worker.py::Worker.load_model`` (``CPUWorker``
inherits it) builds and loads target and drafter on the worker. After it returns,
the layers hold what they will really execute.
"""

from __future__ import annotations

from spectrace.tracer import runtime
from spectrace.tracer.hooks import Hook

ROLE = "worker"


def _rank(worker) -> int | None:
    rank = getattr(worker, "rank", None)
    return rank if isinstance(rank, int) else None


def wrap_load_model(original):
    def load_model(self, *args, **kwargs):
        rt = runtime.get()
        rank = _rank(self)
        with runtime.guard("worker.load_model"):
            if rt is not None:
                rt.note_vllm_config(self.vllm_config)
                rt.enter_role(ROLE, rank)
        if rt is None:
            return original(self, *args, **kwargs)
        from spectrace.tracer import layout

        with rt.span("spectrace.worker.load_model", role=ROLE, rank=rank) as span:
            try:
                result = original(self, *args, **kwargs)
            except BaseException as exc:
                with runtime.guard("worker.load_model"):
                    layout.record_load_error(rt, self, exc, ROLE, rank, span)
                raise
            with runtime.guard("worker.layout"):
                layout.record_runtime_layout(rt, self, ROLE, rank, span)
            with runtime.guard("worker.taps"):
                from spectrace.tracer import taps

                taps.record_taps(rt, self, ROLE, rank, span)
        return result

    return load_model


HOOKS = [
    Hook("worker.load_model", "vllm.v1.worker.gpu_worker:Worker.load_model", wrap_load_model),
]
