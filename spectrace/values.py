"""The records that are not table rows: values only the metrics sink reads (a leaf: no numpy, pyarrow or audit).

A run's info, the layout's verdict per layer, the taps, the run judge's speed-up estimates, a flush's slice counts,
the hook error counts and the records dropped are not stored as rows of a table (their facts are, in ``runs``,
``attention_layout``, ``hidden_state_taps``, ``speculation_steps``, ``request_slices``, ``internal_errors``), but
``/metrics`` shows them. Whoever computes one hands it to the pipeline (``Pipeline.note``); it travels in the flush's
:class:`~spectrace.pipeline.Batch` (``batch.values``) and, from an engine process, in the typed shipment
(``spectrace.recorder.wire.Shipment.values``) as the same object; :class:`~spectrace.sinks.metrics.MetricsSink` turns
each into its instrument's series. Nothing else touches an instrument.

``run_id``: the run whose common labels the series carry (None: the process's current run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RunInfo:
    """``spectrace_run_info``: what ran (frontend at config resolution, engine core at its VllmConfig)."""

    run_id: str | None
    info: dict[str, Any]
    vllm_version: str | None
    spectrace_version: str


@dataclass(frozen=True)
class LayoutVerdicts:
    """``spectrace_attention_layer``: a worker's ``attention_layout`` rows, each with the audit's verdict
    (``status``)."""

    run_id: str | None
    rows: list[dict[str, Any]]


@dataclass(frozen=True)
class Taps:
    """``spectrace_hidden_states_tap``: per tap, the layer the drafter expects and the one vLLM taps."""

    run_id: str | None
    rows: list[dict[str, Any]]


@dataclass(frozen=True)
class Speedup:
    """``spectrace_speculation_speedup_estimate`` and ``_by_k``: the run judge's estimates for one worker rank
    (``estimate`` None: not judged yet; ``by_k``: ``spectrace.speedup.speedup_by_k``'s rows)."""

    run_id: str | None
    rank: int | None
    estimate: float | None
    by_k: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class SliceCounts:
    """``spectrace_slice_*_tokens_total``: one flush's (dimension, value) -> (drafted, accepted) of one run."""

    run_id: str | None
    counts: dict[tuple[str, str], tuple[int, int]]


@dataclass(frozen=True)
class ErrorCounts:
    """``spectrace_internal_errors_total``: every hook's error count so far (the whole count, not a delta)."""

    counts: dict[str, int]


@dataclass(frozen=True)
class Dropped:
    """``spectrace_export_dropped_total``: records dropped since the last one."""

    count: int


VALUES = (RunInfo, LayoutVerdicts, Taps, Speedup, SliceCounts, ErrorCounts, Dropped)
