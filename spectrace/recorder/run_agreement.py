"""One run identity for every rank of one engine, on every host.

On one host the run travels by environment inheritance (``SPECTRACE_ACTIVE_RUN``, set by the
frontend that resolved the config). A rank on another host (``--nnodes`` with a headless node,
Ray workers on other machines) inherited nothing of that frontend: its node started a run of its
own. The ranks of one engine already share torch.distributed's rendezvous store (the
``TCPStore`` vLLM's ``init_distributed_environment`` creates, on CPU and GPU alike). At
``load_model``, after the distributed environment is up and before the worker records
anything of the engine, the engine's first rank publishes its run (``<run_id>;<traceparent>``)
under one key per data-parallel engine, and every other rank reads it once and adopts it.

Data parallelism: each DP engine is a run of its own, ``<frontend run>.dp<index>``
(:func:`join_dp_engine`, in the engine core and in each worker, before the agreement), so the
ranks of two DP engines (both rank 0 within their engine) never mix in one run; the index is also
the ``engine`` label of the series, as on vLLM's ``/metrics``. vLLM reconfigures a non-MoE DP
engine as DP=1 with its index kept, so there engine 0 keeps the frontend's run itself.

Store operations only: no collective is added to vLLM's groups. A rank waits at most
:data:`WAIT_S` for the key (rank 0 not traced, an older spectrace there, a store that fails): it
then keeps its node's run, with one log line, and vLLM's startup goes on as if spectrace were
absent.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

from spectrace.settings import ACTIVE_RUN_ENV
from spectrace.recorder.runtime import Run

log = logging.getLogger("vllm.spectrace")

KEY = "spectrace/run"
WAIT_S = 30.0


def engine_key(dp_index: int) -> str:
    """The store key of one data-parallel engine's run (its ranks share one store across DP)."""
    return f"{KEY}/dp{dp_index}"


def dp_index(vllm_config: Any) -> int:
    parallel = getattr(vllm_config, "parallel_config", None)
    index = getattr(parallel, "data_parallel_index", None)
    if not isinstance(index, int):
        index = getattr(parallel, "data_parallel_rank", 0)
    return index if isinstance(index, int) else 0


def dp_size(vllm_config: Any) -> int:
    size = getattr(getattr(vllm_config, "parallel_config", None), "data_parallel_size", 1)
    return size if isinstance(size, int) else 1


def dp_run_id(run_id: str, index: int) -> str:
    return f"{run_id}.dp{index}"


def join_dp_engine(rt: Any, vllm_config: Any) -> bool:
    """In a DP engine's process (engine core, worker): move to the engine's own run; True if it moved."""
    run = rt.run
    index = dp_index(vllm_config)
    # A non-MoE DP engine's config says size 1 (vLLM's reconfigure_for_independent_dp_rank) and
    # keeps its index: engine 0 of such an engine set stays on the frontend's run, engine i > 0
    # moves to <run>.dp<i>. A MoE DP engine keeps its size: every engine moves, 0 included.
    if run is None or (dp_size(vllm_config) < 2 and index == 0):
        return False
    suffix = dp_run_id("", index)
    if run.run_id.endswith(suffix):
        return False
    engine = Run(dp_run_id(run.run_id, index), run.traceparent, info=dict(run.info))
    rt.set_run(engine)
    os.environ[ACTIVE_RUN_ENV] = engine.env_value()
    return True


def default_store() -> Any:
    """torch.distributed's default store when the world has more than one rank, else None."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    return dist.distributed_c10d._get_default_store()


def agree(rt: Any, rank: int | None, vllm_config: Any, store: Any = None, wait_s: float = WAIT_S) -> str | None:
    """Publish (rank 0) or adopt (any other rank) the engine's run; returns the outcome in words.

    ``store`` is torch.distributed's default store unless given (tests pass one of the same shape).
    Never raises: a failure is one log line and the rank keeps the run it has.
    """
    try:
        store = store if store is not None else default_store()
        if store is None or rank is None:
            return None
        key = engine_key(dp_index(vllm_config))
        if rank == 0:
            store.set(key, rt.run.env_value() if rt.run is not None else "")
            return "published"
        store.wait([key], timedelta(seconds=wait_s))
        value = store.get(key).decode()
    except Exception as exc:
        local = rt.run.run_id if rt.run is not None else None
        log.warning(
            "spectrace: rank %s did not learn rank 0's run within %.0f s (%s: %s); it records under this "
            "node's run %s", rank, wait_s, type(exc).__name__, exc, local,
        )
        return "local"
    run = Run.from_env_value(value)
    local = rt.run
    if run is None:
        log.warning("spectrace: rank 0 of this engine records no run; rank %s keeps this node's run %s",
                    rank, local.run_id if local is not None else None)
        return "local"
    if local is not None and local.run_id == run.run_id:
        return "same"
    if local is not None:
        run.info.update(local.info)
    rt.set_run(run)
    os.environ[ACTIVE_RUN_ENV] = run.env_value()
    log.info("spectrace: rank %s joins run %s of rank 0 (this node had started %s)",
             rank, run.run_id, local.run_id if local is not None else None)
    return "joined"
