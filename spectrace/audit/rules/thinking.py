"""Thinking mode per request, and the phase of each verify step. Pure: plain dicts and ints in.

A drafter trained on thinking output and served with thinking off (or the reverse) accepts far less
(z-lab/dflash#60: 9.5 -> 2.7-3.9 tokens per round; z-lab/dflash#133: 25 % on, 60 % off). No checkpoint
records its training mode; the request does:

- ``chat_template_kwargs`` (``enable_thinking``, ``thinking``, ``thinking_mode``) merged over the server's
  ``--default-chat-template-kwargs`` (the request's keys win, as vLLM merges them);
- the rendered prompt's tail: ``<think>\\n\\n</think>\\n\\n`` (Qwen3 with thinking off: an empty, closed
  think block) means off; a prompt ending in an open ``<think>`` means on.

``thinking_mode`` gives the request's mode (``on`` / ``off`` / ``unknown``) and where it was read
(``kwarg``, ``default``, ``prompt_tail``, ``none``). ``PhaseTracker`` follows each request's
output, step by step, into its reasoning and answer phases at the think start / end markers. The mode is one request-slice dimension
(``spectrace.audit.rules.slices``: ``thinking_mode``); the run judge's Wilson comparison (``slice_gap``)
of its values (and of the phases: ``phase_gap``) is ``THINKING_MODE_GAP``.
"""

from __future__ import annotations

from typing import Any, Sequence

# the chat-template keys that switch thinking, in the order they are read
KWARGS = ("enable_thinking", "thinking", "thinking_mode")
MODES = ("on", "off", "unknown")
SOURCES = ("kwarg", "default", "prompt_tail", "none")
PHASES = ("reasoning", "answer")
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


def thinking_mode(request_kwargs: dict[str, Any] | None, default_kwargs: dict[str, Any] | None = None,
                  prompt_ids: Sequence[int] | None = None, start_id: int | Sequence[int] | None = None,
                  end_id: int | Sequence[int] | None = None) -> tuple[str, str]:
    """(mode, source): the request's kwarg, else the server's default kwarg (``kwarg_mode``), else the prompt's
    tail."""
    if (found := kwarg_mode(request_kwargs, default_kwargs)) is not None:
        return found[0], found[1]
    if (mode := mode_from_prompt_tail(prompt_ids, start_id, end_id)) is not None:
        return mode, "prompt_tail"
    return "unknown", "none"


class PhaseTracker:
    """The phase each request is in, step by step, from the tokens each verify step emitted (the drain's, off
    vLLM's threads). A request starts in ``reasoning`` when its prompt left thinking on (its mode ``on``: an open
    think block), else in ``answer``; a think start marker in its output opens ``reasoning``, an end marker closes
    it. Markers are token sequences (vLLM's ``ReasoningConfig`` ids): one split across two steps is matched on the
    tokens the request's last step left (``len(marker) - 1`` of them)."""

    __slots__ = ("start", "end", "_keep", "state", "limit")

    def __init__(self, start: int | Sequence[int], end: int | Sequence[int], limit: int = 65536) -> None:
        self.start, self.end = list(_seq(start)), list(_seq(end))
        self._keep = max(len(self.start), len(self.end), 1) - 1
        self.state: dict[str, tuple[str, list[int]]] = {}  # request id -> (phase, the tokens kept)
        self.limit = limit

    def phase(self, request_id: str, mode: str | None) -> str:
        """The phase ``request_id`` is in now: the one its next step drafts in."""
        state = self.state.get(request_id)
        return state[0] if state is not None else ("reasoning" if mode == "on" else "answer")

    def feed(self, request_id: str, mode: str | None, tokens: Sequence[int] | None) -> None:
        """The tokens one step emitted for ``request_id`` (``mode``: its thinking mode, read where it is new)."""
        if not tokens:
            return
        state = self.state.get(request_id)
        if state is None:
            if len(self.state) >= self.limit:
                self.state.pop(next(iter(self.state)))
            state = ("reasoning" if mode == "on" else "answer", [])
        phase, kept = state
        seq = kept + list(tokens)
        # where the last of each marker ends in ``seq`` (-1: absent); the later one says the phase now
        start_at, end_at = (_end_of(seq, marker) for marker in (self.start, self.end))
        if end_at >= 0 or start_at >= 0:
            phase = "answer" if end_at > start_at else "reasoning"
        self.state[request_id] = (phase, seq[len(seq) - self._keep:] if self._keep else [])

    def finish(self, request_id: str) -> None:
        self.state.pop(request_id, None)


def phase_counts(steps: Sequence[tuple[str, int, int]]) -> dict[str, tuple[int, int, int]]:
    """(phase, drafted, accepted) per verify step -> phase: (steps, drafted, accepted)."""
    out: dict[str, list[int]] = {}
    for phase, drafted, accepted in steps:
        c = out.setdefault(phase, [0, 0, 0])
        c[0] += 1
        c[1] += drafted
        c[2] += accepted
    return {p: tuple(c) for p, c in out.items()}


def phase_gap(by_phase: dict[str, tuple[int, int, int]], k: int) -> Any:
    """The phase (reasoning / answer) that accepts far below the other (``slices.slice_gap``, a step counted as a
    request), or None; ``by_phase`` from ``phase_counts``."""
    from spectrace.audit.rules.slices import slice_gap

    run = tuple(sum(c[i] for c in by_phase.values()) for i in range(3))
    gaps = [g for phase in PHASES if phase in by_phase
            if (g := slice_gap("thinking_phase", phase, by_phase[phase], run, k)) is not None]
    return min(gaps, key=lambda g: g.rate, default=None)
