"""A request's parameters that change what the target verifies, read from the objects the
engine core's scheduler holds (vLLM 0.32, ``v1/request.py::Request``):

- ``sampling_params`` (``SamplingParams``): penalties, logit bias, bad words, allowed tokens,
  min-p, temperature, top-p/top-k, ``structured_outputs``; the server has already applied
  the model's ``generation_config.json`` defaults to it;
- ``lora_request`` (``LoRARequest``): the adapter applied to the target only;
- ``prefill_stats`` (``v1/metrics/stats.py::PrefillStats``): the prompt length and the tokens
  the prefix cache restored, set by ``Scheduler.schedule`` when the request is first scheduled.

The hook keeps references to these three; this reader runs in the drain. No prompt text and no
token id is read: the logit bias, allowed tokens and bad words are counted, not kept.
"""

from __future__ import annotations

from typing import Any

from spectrace import readings

# SamplingParams fields generation_config.json can set (ModelConfig.get_diff_sampling_param), and
# their neutral values: a default "in force" is one the request holds that differs from neutral
GENERATION_FIELDS = {
    "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
    "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
}
_STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def request_parameters(sampling_params: Any, lora_request: Any, prefill_stats: Any, prompt_token_ids: Any = None,
                       think_markers: Any = None) -> dict[str, Any]:
    """Plain values of one request; ``None`` where vLLM holds nothing (a pooling request, not yet scheduled).
    ``think_markers`` (start ids, end ids; ``think_markers``) with the prompt's ids give the thinking mode from
    the rendered prompt's tail (``spectrace.readings.mode_from_prompt_tail``)."""
    p = sampling_params
    out: dict[str, Any] = dict.fromkeys(
        ["temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
         "logit_bias_tokens", "allowed_tokens", "bad_words", "structured_output", "lora_adapter", "prompt_tokens",
         "cached_tokens", "thinking_mode", "thinking_source"]
    )
    if p is not None:
        for name in GENERATION_FIELDS:
            value = getattr(p, name, None)
            out[name] = float(value) if isinstance(value, float) else value
        out["logit_bias_tokens"] = len(p.logit_bias or ())
        out["allowed_tokens"] = len(p.allowed_token_ids or ())
        out["bad_words"] = len(p.bad_words or ())
        structured = getattr(p, "structured_outputs", None)
        if structured is not None:
            out["structured_output"] = next((kind for kind in _STRUCTURED_KINDS if getattr(structured, kind, None)), "set")
    if lora_request is not None:
        out["lora_adapter"] = str(getattr(lora_request, "lora_name", "") or "set")
    if prefill_stats is not None and prefill_stats.num_prompt_tokens > 0:  # 0 until first scheduled
        out["prompt_tokens"] = int(prefill_stats.num_prompt_tokens)
        out["cached_tokens"] = int(prefill_stats.num_cached_tokens)
    if think_markers is not None and prompt_token_ids is not None:
        mode = readings.mode_from_prompt_tail(prompt_token_ids, *think_markers)
        if mode is not None:
            out["thinking_mode"], out["thinking_source"] = mode, "prompt_tail"
    return out


def chat_thinking(request_kwargs: Any, default_kwargs: Any) -> tuple[str, str, str] | None:
    """(mode, source, key) a chat request's ``chat_template_kwargs`` set (``kwarg``) or the server's
    ``--default-chat-template-kwargs`` did (``default``); None where neither names the mode
    (``spectrace.readings.kwarg_mode``)."""
    return readings.kwarg_mode(request_kwargs, default_kwargs)


def think_markers(vllm_config: Any) -> tuple[list[int], list[int]] | None:
    """The reasoning parser's think start and end token ids (``VllmConfig.reasoning_config``, initialized by vLLM
    from ``--reasoning-parser``); None without one."""
    reasoning = getattr(vllm_config, "reasoning_config", None)
    if reasoning is None or not getattr(reasoning, "enabled", False):
        return None
    start = reasoning.reasoning_start_token_ids
    end = reasoning.natural_reasoning_end_token_ids or reasoning.reasoning_end_token_ids
    return (list(start), list(end)) if start and end else None


def generation_defaults(model_config: Any) -> dict[str, Any]:
    """The sampling defaults the server applies from ``generation_config.json`` (and
    ``--override-generation-config``): ``ModelConfig.get_diff_sampling_param``; ``{}`` with
    ``--generation-config vllm``."""
    diff = model_config.get_diff_sampling_param() or {}
    return {name: value for name, value in diff.items() if name in GENERATION_FIELDS}


def defaults_in_force(parameters: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    """The fields whose request value is the ``generation_config`` default and not vLLM's neutral one."""
    return sorted(
        name for name, value in defaults.items()
        if value != GENERATION_FIELDS[name] and parameters.get(name) is not None
        and abs(float(parameters[name]) - float(value)) < 1e-9
    )
