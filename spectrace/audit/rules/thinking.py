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

from spectrace.readings import KWARGS, _end_of, _last, _mode_of, _seq, kwarg_mode, mode_from_prompt_tail  # noqa: F401

MODES = ("on", "off", "unknown")
SOURCES = ("kwarg", "default", "prompt_tail", "none")
PHASES = ("reasoning", "answer")


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
