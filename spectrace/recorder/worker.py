"""Worker hooks.

vLLM 0.32 site: ``v1/worker/gpu_worker.py::Worker.load_model`` (``CPUWorker``
inherits it) builds and loads target and drafter on the worker. After it returns,
the layers hold what they will really execute. Before it runs, the distributed environment is
up: the ranks agree on one run there (``spectrace.recorder.run_agreement``).
"""

from __future__ import annotations

from spectrace.recorder.around import around
from spectrace.recorder import layout, run_agreement, runtime, taps, weights
from spectrace.recorder.hooks import Hook

ROLE = "worker"


def _rank(worker) -> int | None:
    rank = getattr(worker, "rank", None)
    return rank if isinstance(rank, int) else None


class _Load:
    """What ``load_model``'s hook keeps between before and after: the rank and the span."""

    __slots__ = ("rank", "span")

    def __init__(self, rank: int | None, span) -> None:
        self.rank = rank
        self.span = span


def _load_start(rt, worker, *args, **kwargs) -> _Load:
    rank = _rank(worker)
    # every rank of the engine under rank 0's run, on every host (before anything is recorded);
    # a data-parallel engine is a run of its own
    run_agreement.join_dp_engine(rt, worker.vllm_config)
    run_agreement.agree(rt, rank, worker.vllm_config)
    rt.note_vllm_config(worker.vllm_config)
    rt.enter_role(ROLE, rank)
    return _Load(rank, rt.start_span("spectrace.worker.load_model", role=ROLE, rank=rank))


def _load_failed(rt, load, exc, worker, *args, **kwargs) -> None:
    rank, span = (load.rank, load.span) if load is not None else (_rank(worker), None)
    layout.record_load_error(rt, worker, exc, ROLE, rank, span)
    with runtime.guard("worker.weights") as weights_rt:  # its own guard: the span still ends
        if weights_rt is not None:
            weights.record_failed_load(weights_rt, worker, ROLE, rank, span)
    rt.end_span(span, exc)


def _layout(rt, load, result, worker, *args, **kwargs) -> None:
    if load is not None:
        layout.record_runtime_layout(rt, worker, ROLE, load.rank, load.span)


def _taps(rt, load, result, worker, *args, **kwargs) -> None:
    if load is not None:
        taps.record_taps(rt, worker, ROLE, load.rank, load.span)


def _weights(rt, load, result, worker, *args, **kwargs) -> None:
    if load is not None:
        weights.record_model_weights(rt, worker, ROLE, load.rank, load.span)


def _load_done(rt, load, result, worker, *args, **kwargs) -> None:
    if load is not None:
        rt.end_span(load.span)


# Worker.load_model: the worker's role and rank, then what the built model runs (layout, taps)
wrap_load_model = around(
    before=_load_start,
    after=[("worker.layout", _layout), ("worker.taps", _taps), ("worker.weights", _weights), (None, _load_done)],
    failed=_load_failed,
)


HOOKS = [
    Hook("worker.load_model", "vllm.v1.worker.gpu_worker:Worker.load_model", wrap_load_model),
    *weights.HOOKS,
]
