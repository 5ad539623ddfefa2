"""Per-step draft verification: hooks → capture → drain.

- ``hooks`` / ``hooks_v2``: the per-step hooks on vLLM's threads (V1 model runner and the
  scheduler; the V2 model runner), which append named records to the capture;
- ``capture``: those records and the bounded per-process buffers;
- ``drain``: the flush thread's work on them — rows, counts, metrics, detectors, findings.
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
