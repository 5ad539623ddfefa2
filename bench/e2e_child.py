"""Child process of bench/e2e.py: one vLLM engine (CPU, single process), timed generation only.

    python -m bench.e2e_child '<json request>'

Loads the engine, generates once to warm up, then ``rounds`` timed ``llm.generate`` calls
(or rounds until ``seconds`` have passed). With ``toggle`` (e.g. "ABBA", SPECTRACE=1 set),
tracing is switched off (A: ``runtime.stop()``, every hook removed) and on again (B:
``stages.start()``) between calls, following the pattern: an A/B comparison inside one
process, free of the process-to-process spread. Per round: wall seconds, process CPU seconds
(all threads: vLLM's and spectrace's background flush alike), output tokens, resident
size. Writes JSON to ``request["out"]``. Tracing is whatever the environment says
(SPECTRACE=1 or unset): the parent sets it.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path



def _spectrace_wrapper(value) -> bool:
    """Is ``value`` one of spectrace's hook wrappers (its code lives in spectrace's files)?"""
    code = getattr(getattr(value, "__func__", value), "__code__", None)
    return code is not None and "/spectrace/" in code.co_filename

def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def thread_cpu() -> dict[str, float]:
    """CPU seconds of every live thread, by name (``time.pthread_getcpuclockid``: per-thread clocks)."""
    import threading

    out: dict[str, float] = {}
    for thread in threading.enumerate():
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, TypeError, ValueError):
            continue
        out[thread.name] = out.get(thread.name, 0.0) + seconds
    return out


BACKGROUND = ("spectrace-flush", "Otel")  # spectrace's flush thread, OpenTelemetry export threads


def background_cpu(before: dict[str, float], after: dict[str, float]) -> float:
    """CPU seconds spent by spectrace's background threads between two ``thread_cpu()`` snapshots
    (a thread started in between counts from zero)."""
    return sum(after[name] - before.get(name, 0.0) for name in after if name.startswith(BACKGROUND))


def spectrace_state() -> dict:
    """Is spectrace loaded and patched in here, and how full are its buffers."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    state = {
        "tracer_imported": "spectrace.recorder.runtime" in sys.modules,
        "update_from_output_patched": _spectrace_wrapper(Scheduler.update_from_output),
        "bookkeeping_sync_patched": _spectrace_wrapper(GPUModelRunner._bookkeeping_sync),
    }
    rt = None
    if state["tracer_imported"]:
        from spectrace.recorder import runtime

        rt = runtime.get()
    if rt is not None:
        state.update(
            engine_steps_buffered=len(rt.verify.engine_steps),
            worker_steps_buffered=len(rt.verify.worker_steps),
            request_flags=len(rt.verify.request_flags),
            request_traces=len(getattr(rt.verify, "request_traces", {})),
            writer_buffered=rt.pipeline._buffered if rt else None,
            writer_dropped=rt.pipeline.dropped if rt else None,
            segments_written=rt.pipeline.sink("duckdb").segments_written if rt and rt.pipeline.sink("duckdb") else None,
            errors=dict(rt.errors) if rt else None,
        )
    return state


def set_tracing(on: bool) -> None:
    """Turn spectrace fully off (hooks removed, flush thread stopped, everything flushed) or
    back on (a fresh runtime, hooks installed again), between two generate() calls."""
    from spectrace.recorder import runtime, stages

    if on and runtime._runtime is None:
        stages.start()
    elif not on and runtime._runtime is not None:
        runtime.stop()


class GcClock:
    """Seconds spent in the cyclic garbage collector (any thread), and collections per generation."""

    def __init__(self) -> None:
        import gc

        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._t0 = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0
            self.collections[info["generation"]] += 1

    def snapshot(self) -> tuple[float, list[int]]:
        return self.seconds, list(self.collections)


def main(request: dict) -> None:
    from vllm import LLM, SamplingParams

    gc_clock = GcClock()

    t_start = time.time()
    llm = LLM(
        model=request["target"],
        tokenizer=request["target"],
        dtype="float32",
        enforce_eager=True,
        max_model_len=request.get("max_model_len", 512),
        kv_cache_memory_bytes=request.get("kv_cache_bytes", 64 << 20),
        disable_log_stats=False,
        seed=0,
        speculative_config=request["speculative"],
        max_num_seqs=max(len(request["prompts"]), 8),
    )
    load_s = time.time() - t_start
    params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"], ignore_eos=True)
    prompts = request["prompts"]
    llm.generate(prompts, params, use_tqdm=False)  # warm-up (not timed)
    rounds = []
    deadline = time.time() + request.get("seconds", 0)
    pattern = request.get("toggle")  # e.g. "ABBA": A = tracing off, B = on, in this one process
    i = 0
    while i < request.get("rounds", 1) or time.time() < deadline:
        state = None
        if pattern:
            state = "on" if pattern[i % len(pattern)] == "B" else "off"
            # null experiment ("null_state": "off" or "on"): label the rounds, keep tracing as it is
            set_tracing(state == "on" if not request.get("null_state") else request["null_state"] == "on")
        gc0, n0 = gc_clock.snapshot()
        threads0 = thread_cpu()
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        cpu = cpu_seconds() - cpu0
        threads1 = thread_cpu()
        gc1, n1 = gc_clock.snapshot()
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        rounds.append({"wall_s": wall, "cpu_s": cpu, "tokens": tokens, "rss": rss_bytes(), "t": time.time() - t_start,
                       "state": state, "gc_s": gc1 - gc0, "gc_collections": [b - a for a, b in zip(n0, n1)],
                       "background_cpu_s": background_cpu(threads0, threads1),
                       "main_thread_cpu_s": threads1.get("MainThread", 0.0) - threads0.get("MainThread", 0.0)})
        i += 1
    if pattern and not request.get("null_state"):
        set_tracing(True)
    metrics = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode_num_"):
            metrics[metric.name] = getattr(metric, "value", None)
    result = {
        "load_s": load_s,
        "rounds": rounds,
        "spectrace": spectrace_state(),
        "vllm_spec_metrics": metrics,
        "first_tokens": list(outputs[0].outputs[0].token_ids[:16]),
    }
    Path(request["out"]).write_text(json.dumps(result))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
