"""The probe's engine process: ``python -m spectrace.probe.child``, one vLLM engine per job, one after another.

Jobs arrive on stdin, one JSON object a line; each answer is one stdout line starting with :data:`MARK`
(``{"started": name}`` when an engine starts, then the result); everything else on stdout is vLLM's log. vLLM
loads plugins per process and reads its environment at start, so the parent sets it (multiprocessing off: the
engine core and worker run here). A job that raises is a failed result and the next job runs; a crash of the
process itself is the parent's to see (it starts another child for the jobs left).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from typing import Any

MARK = "@@spectrace-probe "


def _say(payload: dict[str, Any]) -> None:
    sys.stdout.write(MARK + json.dumps(payload) + "\n")
    sys.stdout.flush()


def _run_id() -> str | None:
    """The traced run this engine started: the frontend hook writes it into the environment (``ACTIVE_RUN_ENV``)."""
    from spectrace.settings import ACTIVE_RUN_ENV, inherited

    value = inherited(ACTIVE_RUN_ENV)
    return value.partition(";")[0] or None if value else None


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM, SamplingParams

    started = time.time()
    result: dict[str, Any] = {"name": job["name"], "ok": False, "requests": [], "error": None}
    llm = None
    from spectrace.settings import ACTIVE_RUN_ENV

    os.environ.pop(ACTIVE_RUN_ENV, None)  # a run id read after this engine is this engine's
    try:
        kwargs = dict(job["engine"])
        kwargs["speculative_config"] = job["speculative"]
        kwargs.setdefault("disable_log_stats", False)
        kwargs["per_request_spec_decode_metrics"] = "summary"
        llm = LLM(**kwargs)
        params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=True)
        generating = time.perf_counter()
        outputs = llm.generate(job["prompts"], params, use_tqdm=False)
        result["generate_seconds"] = time.perf_counter() - generating
        for output in outputs:
            completion = output.outputs[0]
            metrics = getattr(completion, "spec_decode_metrics", None)
            result["requests"].append({"output_tokens": len(completion.token_ids),
                                       "spec_decode": metrics.to_dict() if metrics is not None else None})
        result["ok"] = True
    except Exception as exc:  # the parent reports it in one line and serves the next candidate
        result["error"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
    result["run_id"] = _run_id()
    del llm
    gc.collect()
    result["seconds"] = time.time() - started
    return result


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        _say({"started": job["name"]})
        _say({"result": run_job(job)})


if __name__ == "__main__":
    main()
