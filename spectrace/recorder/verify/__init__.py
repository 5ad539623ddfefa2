"""Per-step draft verification, the engine's side: hooks → capture (the drain is the collector's:
``spectrace.collector.drain``).

- ``hooks`` / ``hooks_v2``: the per-step hooks on vLLM's threads (V1 model runner and the
  scheduler; the V2 model runner), which append named records to the capture;
- ``capture``: those records and the bounded per-process buffers, and the facts of each run's config;
- ``run_config``: what the drain reads of a run's ``VllmConfig``, once (shipped to a pipeline process as values).
"""

from spectrace.recorder.verify.capture import ENGINE, MAX_BUFFERED_STEPS, WORKER, EngineStep, StepTiming, WorkerStep  # noqa: F401
from spectrace.recorder.verify.capture import VerifyCapture  # noqa: F401
from spectrace.recorder.verify.hooks import (  # noqa: F401
    HOOKS,
    wrap_add_request,
    wrap_bookkeeping_sync,
    wrap_execute_model,
    wrap_update_from_output,
)
