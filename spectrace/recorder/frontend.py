"""Frontend hooks: run start, config resolution, engine started.

vLLM 0.32 sites (``engine/arg_utils.py``, ``config/model.py``,
``v1/engine/llm_engine.py``, ``v1/engine/async_llm.py``):

- ``EngineArgs.create_engine_config`` resolves every config of one engine: a run
  starts here (root span ``spectrace.run``).
- ``get_config`` as imported by ``vllm.config.model`` builds each model's
  transformers config (target first, then the draft from
  ``SpeculativeConfig.__post_init__``). We note what it returned; the declared
  ``config.json`` is read from disk next to it.
- ``LLMEngine.__init__`` / ``AsyncLLM.__init__`` return once the engine core is
  up: the root span ends there, so it is exported even if the server is killed.

Records that a failing load must not lose (config, findings) are flushed
synchronously.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import spectrace
from spectrace.console import RECORDED_ITEMS, bounded
from spectrace.request_ids import client_ids
from spectrace.values import RunInfo
from spectrace.vllm_objects.configs import ConfigCapture, assign_roles, config_to_dict, read_declared, run_info, vllm_resolved
from spectrace.vllm_objects.requests import chat_thinking
from spectrace.load_facts import RESOLUTION
from spectrace.recorder import api_server, resolution, runtime
from spectrace.recorder.around import around
from spectrace.recorder.hooks import Hook

ROLE = "frontend"


# -- hooks -----------------------------------------------------------------------


def _begin(rt, engine_args, usage_context=None, headless=False, *args, **kwargs):
    run = rt.begin_run()
    rt.enter_role(ROLE)
    if headless:  # a headless node's launcher: no API server will serve this node's series
        with runtime.guard("headless.prometheus_endpoint") as own:
            if own is not None:
                api_server.serve_headless_node()
    return run


def _resolved(rt, run, vllm_config, engine_args, *args, **kwargs) -> None:
    if run is not None:
        record_resolution(rt, run, engine_args, vllm_config, None)


def _resolution_failed(rt, run, exc, engine_args, *args, **kwargs) -> None:
    if run is not None:
        record_resolution(rt, run, engine_args, None, exc)
        rt.end_run_span(exc)


# EngineArgs.create_engine_config: a run starts (its root span), the resolution is recorded
wrap_create_engine_config = around(before=_begin, after=[(None, _resolved)], failed=_resolution_failed)


def _started(rt, model, *args, **kwargs) -> int:
    return time.time_ns()


def _config_read(rt, start, config, model, *args, **kwargs) -> None:
    _capture(rt, ConfigCapture(str(model), start or 0, time.time_ns(), config))


def _config_failed(rt, start, exc, model, *args, **kwargs) -> None:
    _capture(rt, ConfigCapture(str(model), start or 0, time.time_ns(), None, f"{type(exc).__name__}: {exc}"))


# vllm.config.model.get_config: what transformers resolved, per model, kept for the run
wrap_get_config = around(before=_started, after=[(None, _config_read)], failed=_config_failed)


def _capture(rt, capture: ConfigCapture) -> None:
    if rt.run is not None and rt.run.root_span is not None:
        rt.run.model_captures.append(capture)


def _engine_up(rt, state, result, *args, **kwargs) -> None:
    rt.end_run_span()


def _engine_failed(rt, state, exc, *args, **kwargs) -> None:
    rt.end_run_span(exc)


# LLMEngine / AsyncLLM __init__: the engine is up (or failed): the run's root span ends
wrap_engine_init = around(after=[(None, _engine_up)], failed=_engine_failed)


def _serving(rt, state, result, engine=None, *args, **kwargs) -> None:
    """An AsyncLLM is up: this process serves (an API server, or a program of its own on AsyncLLM), so the hooks
    that wait for one install now (``Hook.later``). Only for vLLM's own AsyncLLM (not an object posing as one)."""
    module = sys.modules.get("vllm.v1.engine.async_llm")
    if module is None or not isinstance(engine, module.AsyncLLM):
        return
    if not rt.hooks.installed.keys() >= {hook.name for hook in HOOKS if hook.later}:
        rt.install([hook for hook in HOOKS if hook.later], now=True)


# AsyncLLM.__init__: as LLMEngine's, and the API server's own hooks install
wrap_async_engine_init = around(after=[(None, _engine_up), (None, _serving)], failed=_engine_failed)


def _request_finished(rt, processor, req_state, finish_reason, *args, **kwargs) -> None:
    """One finished request of a speculating run: the ids the user sees, the tokens they got (after stop
    strings), and vLLM's own per-request speculative metrics where its flag kept them."""
    run = rt.run
    if run is None or not run.info.get("method"):
        return
    detokenizer = getattr(req_state, "detokenizer", None)
    metrics = getattr(req_state, "spec_decode_metrics", None)
    parent = getattr(req_state, "parent_req", None)
    response_id, choice = client_ids(str(getattr(req_state, "external_req_id", None) or req_state.request_id),
                                     getattr(req_state, "request_index", 0),
                                     getattr(getattr(parent, "sampling_params", None), "n", 1))
    now = time.time_ns()
    output_tokens = detokenizer.num_output_tokens() if detokenizer is not None else None
    reason = str(finish_reason) if finish_reason is not None else None
    rt.record("request_outputs", {
        "ts": now,
        "request_id": str(req_state.request_id),
        "external_request_id": response_id,
        "choice_index": choice,
        "output_tokens": output_tokens,
        "finish_reason": reason,
        "vllm_spec_decode": json.dumps(metrics.to_dict()) if metrics is not None else None,
    }, role=ROLE, run=run)
    # The request as the client saw it, from its arrival to now; the engine core's ``spectrace.request`` span
    # carries the same ``spectrace.request.id`` (vLLM's internal id) and the drafts' counts.
    arrival = getattr(req_state, "arrival_time", None)
    start = int(arrival * 1e9) if isinstance(arrival, (int, float)) and 0 < arrival * 1e9 <= now else now
    attributes = {"spectrace.request.id": str(req_state.request_id), "spectrace.request.response_id": response_id,
                  "spectrace.request.choice_index": choice}
    if output_tokens is not None:
        attributes["spectrace.request.output_tokens"] = int(output_tokens)
    if reason is not None:
        attributes["spectrace.request.finish_reason"] = reason
    rt.start_span("spectrace.request.output", role=ROLE, run=run, start_time=start,
                  attributes=attributes).end(end_time=now)


# OutputProcessor._update_stats_from_finished: once per finished request (never per step)
wrap_request_finished = around(before=_request_finished)


def _chat_request(rt, serving, request, raw_request=None, *args, **kwargs) -> None:
    """One chat completion of a speculating run: its thinking mode as its ``chat_template_kwargs`` set it, or as
    the server's ``--default-chat-template-kwargs`` did, under the response id vLLM gives it (``chatcmpl-`` and the
    ``X-Request-Id`` header, else the request's ``request_id``: ``OpenAIServingChat._base_request_id``)."""
    run = rt.run
    if run is None or not run.info.get("method"):
        return
    found = chat_thinking(getattr(request, "chat_template_kwargs", None),
                          getattr(serving, "default_chat_template_kwargs", None))
    if found is None:
        return
    headers = getattr(raw_request, "headers", None)
    base = headers.get("X-Request-Id") if headers is not None else None
    if base is None:
        base = getattr(request, "request_id", None)
    if not isinstance(base, str):
        return
    mode, source, key = found
    rt.record("chat_requests", {"ts": time.time_ns(), "external_request_id": f"chatcmpl-{base}"[:256],
                                "thinking_mode": mode, "thinking_source": source, "thinking_key": key},
              role=ROLE, run=run)


# OpenAIServingChat._create_chat_completion: once per chat request, before vLLM renders it; installed once an AsyncLLM
# is up (an API server's process), so no engine core or worker imports the chat server
wrap_chat_request = around(before=_chat_request)

HOOKS = [
    Hook("frontend.create_engine_config", "vllm.engine.arg_utils:EngineArgs.create_engine_config", wrap_create_engine_config),
    Hook("frontend.get_config", "vllm.config.model:get_config", wrap_get_config, within="vllm.config.model:ModelConfig"),
    Hook("frontend.llm_engine_started", "vllm.v1.engine.llm_engine:LLMEngine.__init__", wrap_engine_init),
    Hook("frontend.async_llm_started", "vllm.v1.engine.async_llm:AsyncLLM.__init__", wrap_async_engine_init),
    Hook("frontend.request_finished", "vllm.v1.engine.output_processor:OutputProcessor._update_stats_from_finished",
         wrap_request_finished),
    Hook("frontend.chat_request", "vllm.entrypoints.openai.chat_completion.serving:OpenAIServingChat._create_chat_completion",
         wrap_chat_request, later="when this process's AsyncLLM is up (an API server)"),
]


# -- what gets recorded ----------------------------------------------------------


def record_resolution(rt: "runtime.Runtime", run: "runtime.Run", engine_args: Any, vllm_config: Any, error: BaseException | None) -> None:
    """Write runs / model_configs rows and one ``spectrace.config.resolve`` span per model."""
    info = run_info(engine_args, vllm_config)
    run.info.update(info)
    error_text = f"{type(error).__name__}: {error}" if error is not None else None
    rt.record(
        "runs",
        {
            "started_at": run.started_ns,
            "vllm_version": runtime.vllm_version(),
            "spectrace_version": spectrace.__version__,
            "target_model": info["target_model"],
            "draft_model": info["draft_model"],
            "method": info["method"],
            "method_inferred": info["method_inferred"],
            "num_speculative_tokens": info["num_speculative_tokens"],
            "model_runner": info["model_runner"],
            "trace_id": run.traceparent.split("-")[1] if run.traceparent.count("-") >= 2 else None,
        },
        role=ROLE,
    )
    models = []
    for role, capture in assign_roles(run.model_captures, info["target_model"], info["draft_model"]).items():
        declared = read_declared(capture.model)
        transformers_resolved = config_to_dict(capture.config)
        final = vllm_resolved(vllm_config, role)
        final_dict = config_to_dict(final)
        models.append(
            {
                "model_role": role,
                "model": capture.model,
                "declared": declared,
                "transformers_class": type(capture.config).__name__ if capture.config is not None else None,
                "transformers_resolved": transformers_resolved,
                "vllm_class": type(final).__name__ if final is not None else None,
                "vllm_resolved": final_dict,
                "error": capture.error,
            }
        )
        attributes = {
            "spectrace.model.role": role,
            "spectrace.model.path": capture.model,
            "spectrace.config.declared": json.dumps(bounded(declared, RECORDED_ITEMS), sort_keys=True, default=str),
            "spectrace.config.transformers_class": models[-1]["transformers_class"],
            "spectrace.config.resolved": json.dumps(bounded(transformers_resolved, RECORDED_ITEMS), sort_keys=True, default=str),
            "spectrace.config.vllm_class": models[-1]["vllm_class"],
            "spectrace.config.vllm_resolved": json.dumps(bounded(final_dict, RECORDED_ITEMS), sort_keys=True, default=str),
            "spectrace.method": info["method"] if role == "draft" else None,
            "spectrace.num_speculative_tokens": info["num_speculative_tokens"] if role == "draft" else None,
            "spectrace.model_runner": info["model_runner"],
        }
        with rt.span("spectrace.config.resolve", role=ROLE, attributes=attributes, start_time=capture.start_ns) as span:
            if capture.error:
                span.set_attribute("spectrace.config.error", capture.error)
        rt.record(
            "model_configs",
            {
                **{k: v for k, v in models[-1].items() if k not in ("declared", "transformers_resolved", "vllm_resolved")},
                "ts": capture.end_ns,
                "declared": json.dumps(bounded(declared, RECORDED_ITEMS), default=str),
                "transformers_resolved": json.dumps(bounded(transformers_resolved, RECORDED_ITEMS), default=str),
                "vllm_resolved": json.dumps(bounded(final_dict, RECORDED_ITEMS), default=str),
            },
            role=ROLE,
        )
    if rt.metered:
        rt.pipeline.note(RunInfo(rt.run.run_id if rt.run is not None else None, dict(info), runtime.vllm_version(),
                                 spectrace.__version__))
    rt.facts(RESOLUTION, resolution.resolution_facts(info, models, vllm_config, error_text), role=ROLE,
             span=rt.run.root_span if rt.run is not None else None)
    rt.flush()
