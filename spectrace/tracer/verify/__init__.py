"""Per-step draft verification: hooks → capture → drain.

- ``hooks`` / ``hooks_v2``: the per-step hooks on vLLM's threads (V1 model runner and the
  scheduler; the V2 model runner), which append named records to the capture;
- ``capture``: those records and the bounded per-process buffers;
- ``columns``: a flush's steps counted as numpy columns;
- ``drain``: the flush thread's work on them — record rows and metrics, each batch handed to the run judge
  (``spectrace.audit.run_judge``) whose findings it emits;
- ``run_config``: what the drain reads of a run's ``VllmConfig``, once (shipped to a pipeline process as values).
"""

from spectrace.tracer.verify.capture import ENGINE, MAX_BUFFERED_STEPS, WORKER, EngineStep, StepTiming, WorkerStep  # noqa: F401
from spectrace.tracer.verify.drain import RunCurve, VerifyCapture  # noqa: F401
from spectrace.tracer.verify.hooks import (  # noqa: F401
    HOOKS,
    wrap_add_request,
    wrap_bookkeeping_sync,
    wrap_execute_model,
    wrap_update_from_output,
)
