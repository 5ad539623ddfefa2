"""What a reader of vLLM's objects and a judge share: the few record types and readings both sides name (a leaf:
plain values, no numpy, pyarrow or audit).

The recorder reads in vLLM's processes and judges nothing (``spectrace.load_facts``); the audit judges what it read.
What a reading produces, and the audit reads, lives here, so that reading never loads the audit:

- :class:`Stage`: the drafter's config after one step of vLLM's resolution (``vllm_objects.configs.drafter_stages``,
  judged field by field by ``audit.fields``); :func:`is_speculators`: a speculators-format ``config.json``;
- :class:`VocabTensor`: one vocabulary-map tensor of a checkpoint (``vllm_objects.weights.read_vocab_maps``, judged by
  ``audit.vocab``);
- a request's thinking mode from its chat-template kwargs or its rendered prompt's tail (``kwarg_mode``,
  ``mode_from_prompt_tail``: read by ``vllm_objects.requests``; ``audit.rules.thinking`` follows the phases).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence


@dataclass
class Stage:
    """One step of vLLM's resolution: the function, and the drafter's config after it (None: it raised)."""

    rule: str
    config: dict[str, Any] | None
    error: str | None = None
    # where this step put each declared top-level field its output does not hold by name: the output keys that
    # change with that field's value (``vllm_objects.configs._moves`` probes vLLM's own updater); [] where none
    # does (the step does not read it); a field it moved is not lost
    moves: dict[str, list[str] | None] | None = None


def is_speculators(declared: dict[str, Any] | None) -> bool:
    return isinstance(declared, dict) and ("speculators_model_type" in declared or "speculators_config" in declared)


@dataclass
class VocabTensor:
    """One map tensor from the checkpoint: dtype and shape from its header, values when read (else ``error``)."""

    dtype: str
    shape: tuple[int, ...]
    values: Sequence[int] | None = None
    error: str | None = None


# -- thinking mode ------------------------------------------------------------------------------------------------

# the chat-template keys that switch thinking, in the order they are read
KWARGS = ("enable_thinking", "thinking", "thinking_mode")
_OFF_WORDS = {"off", "false", "disabled", "disable", "none", "no", "0"}
_ON_WORDS = {"on", "true", "enabled", "enable", "yes", "1", "think", "thinking"}


def _mode_of(value: Any) -> str | None:
    """on / off for one kwarg's value; None when it says neither (a level such as "high" counts as on)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (int, float)):
        return "on" if value else "off"
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _OFF_WORDS:
            return "off"
        if word in _ON_WORDS or word in ("low", "medium", "high"):
            return "on"
    return None


def kwarg_mode(request_kwargs: dict[str, Any] | None, default_kwargs: dict[str, Any] | None
               ) -> tuple[str, str, str] | None:
    """(mode, source, key) from a chat request's ``chat_template_kwargs`` (source ``kwarg``), else the server's
    ``--default-chat-template-kwargs`` (``default``): vLLM merges the request's over the defaults, key by key."""
    for kwargs, source in ((request_kwargs, "kwarg"), (default_kwargs, "default")):
        if not isinstance(kwargs, dict):
            continue
        for key in KWARGS:
            if key in kwargs and (mode := _mode_of(kwargs[key])) is not None:
                return mode, source, key
    return None


def _seq(marker: int | Sequence[int] | None) -> list[int]:
    if marker is None:
        return []
    return [marker] if isinstance(marker, int) else list(marker)


def _last(tail: list[int], marker: list[int]) -> int:
    """The index where ``marker``'s last occurrence in ``tail`` begins; -1 when absent."""
    n = len(marker)
    return max((i for i in range(len(tail) - n + 1) if tail[i:i + n] == marker), default=-1)


def _end_of(tail: list[int], marker: list[int]) -> int:
    """The index just past ``marker``'s last occurrence in ``tail``; -1 when absent (or no marker)."""
    at = _last(tail, marker) if marker else -1
    return at + len(marker) if at >= 0 else -1


def mode_from_prompt_tail(prompt_ids: Sequence[int] | None, start: int | Sequence[int] | None,
                          end: int | Sequence[int] | None) -> str | None:
    """off when the prompt ends in an empty, closed think block (start, at most 2 tokens such as the template's
    ``\\n\\n``, end), on when its last think marker is an open start; None otherwise. ``start`` / ``end``: a
    marker's token id or ids (vLLM's ``ReasoningConfig`` holds them as lists)."""
    start, end = _seq(start), _seq(end)
    if not prompt_ids or not start or not end:
        return None
    tail = list(prompt_ids[-(16 + len(start) + len(end)):])
    last_start, last_end = _last(tail, start), _last(tail, end)
    if last_start < 0:
        return None
    if last_end > last_start:
        return "off" if last_end - (last_start + len(start)) <= 2 else None
    return "on"
