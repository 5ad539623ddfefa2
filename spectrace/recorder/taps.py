"""Reads the hidden-state taps of the loaded target (worker, after ``load_model``).

The taps are read by ``spectrace.vllm_objects.taps``; the collector judges them (``spectrace.collector.judging``:
``spectrace.audit.audit_taps``, as ``spectrace doctor`` does on meta-built models), into ``hidden_state_taps``, the
``spectrace.hidden_states.taps`` span and the taps on ``/metrics``.
"""

from __future__ import annotations

from typing import Any

from spectrace.load_facts import TAPS
from spectrace.vllm_objects import layers as read_layers
from spectrace.vllm_objects import taps as read_taps
from spectrace.vllm_objects.configs import model_runner


def record_taps(rt, worker: Any, role: str, rank: int | None, span: Any = None) -> None:
    vllm_config = worker.vllm_config
    spec = vllm_config.speculative_config
    if not read_taps.taps_apply(spec, model_runner(vllm_config)):
        return
    runner = worker.model_runner
    facts = read_taps.tap_facts(vllm_config, read_layers.target_model(runner), read_layers.draft_model(runner))
    rt.facts(TAPS, facts, role=role, rank=rank, span=span)
    rt.flush()
