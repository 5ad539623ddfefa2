"""One vLLM engine kept alive in its own process, generating on demand (bench/speedup_by_k.py).

    python -m bench.engine_server '<json spec>'     (stdin: one command a line; stdout: one JSON line each)

The spec is a ``spectrace.testing.engine.EngineSpec`` as a dict (its ``extra_llm_kwargs``, ``sampling`` and
``prompts`` used as the engine runner uses them). Commands: ``gen`` runs one ``LLM.generate`` of the spec's
prompts and answers ``{"cpu": s, "wall": s, "tokens": n}`` (the CPU time of this process, all its threads:
frontend, engine core and worker run in it, multiprocessing off); ``quit`` flushes spectrace (when traced) and
answers ``{"run_id": ...}``. The first line out is ``{"ready": true}`` once the engine is built. Environment:
``spectrace.testing.engine.base_env`` (set by the parent).
"""

from __future__ import annotations

import json
import sys
import time


def _say(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(raw: str) -> None:
    from vllm import LLM, SamplingParams

    from spectrace.testing.engine import EngineSpec, _current_run_id, _flush_spectrace

    spec = EngineSpec(**json.loads(raw))
    kwargs = dict(model=spec.target, tokenizer=spec.tokenizer or spec.target, dtype="float32",
                  enforce_eager=spec.enforce_eager, max_model_len=spec.max_model_len,
                  kv_cache_memory_bytes=64 << 20, disable_log_stats=False, seed=0)
    if spec.speculative:
        kwargs["speculative_config"] = spec.speculative
    kwargs.update(spec.extra_llm_kwargs)
    sampling = spec.sampling or [{}]
    params = [SamplingParams(**{"temperature": 0.0, "max_tokens": spec.max_tokens, **sampling[i % len(sampling)]})
              for i in range(len(spec.prompts))]
    llm = LLM(**kwargs)
    _say({"ready": True})
    for line in sys.stdin:
        command = line.strip()
        if command == "gen":
            cpu, wall = time.process_time(), time.perf_counter()
            outputs = llm.generate(spec.prompts, params, use_tqdm=False)
            _say({"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall,
                  "tokens": sum(len(o.outputs[0].token_ids) for o in outputs)})
        elif command == "quit":
            _flush_spectrace()
            _say({"run_id": _current_run_id()})
            return
        else:
            _say({"error": f"unknown command {command!r}"})


if __name__ == "__main__":
    main(sys.argv[1])
