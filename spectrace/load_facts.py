"""What a load-time hook read in a vLLM process, for the collector to judge (a leaf: no numpy, pyarrow or audit).

The recorder judges nothing. Where a hook reads the facts of a run's configs or of a loaded model (the frontend's
config resolution, the worker's layout, taps and weights), it hands them on as one :class:`LoadFacts` of plain
values (``Runtime.facts``): from an engine process in the typed shipment (``spectrace.recorder.wire.Shipment.facts``),
in the thread shape straight to the collector. The collector's judge (``spectrace.collector.judging``) turns each into
the rows, value records and findings the hook once wrote itself, in the flush that takes it: a hook that flushes
after it (every load-time hook does) has its findings written when that flush returns, in either shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

# What was read, and so which judge reads it (spectrace.collector.judging.JUDGES)
RESOLUTION = "resolution"  # the frontend's config resolution: the static judge, config_fields
LAYOUT = "layout"  # the worker's built layers: attention_layout, LAYOUT_MISMATCH
BUILD_ERROR = "build_error"  # vLLM refused to build the model: LOAD_FAILED in config terms
TAPS = "taps"  # the loaded target's hidden-state taps: hidden_state_taps, TAP_*
WEIGHTS = "weights"  # what each model loaded: model_weights, the weight, head, RoPE and draft-settings audits
FAILED_LOAD = "failed_load"  # what the drafter's loader filled before vLLM refused the load
KINDS = (RESOLUTION, LAYOUT, BUILD_ERROR, TAPS, WEIGHTS, FAILED_LOAD)


@dataclass
class LoadFacts:
    """One hook's reading: ``kind`` (:data:`KINDS`), who read it (``role``, ``rank``, ``run_id``, ``ts``), the span
    its findings hang under (``parent``: trace id and span id, or None) and ``facts``, the judge's keyword arguments
    as plain values (dicts, lists, strings, numbers and the readers' own small records)."""

    kind: str
    role: str
    rank: int | None
    run_id: str | None
    ts: int
    parent: tuple[int, int] | None
    facts: dict[str, Any] = field(default_factory=dict)


def plain(value: Any) -> Any:
    """``value`` as plain values, the same in either shape: what a pipeline process unpickles must never import vLLM,
    torch or transformers (their objects in a config dict, a dtype, an array). Dicts, lists, tuples and sets are
    walked; spectrace's own dataclasses (a resolution ``Stage``, a checkpoint ``Manifest``) keep their type with
    their fields made plain; an array becomes its list (``tolist``); anything else not a number, a string, a bool
    or None becomes its text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value if type(value) in (bool, int, float, str, type(None)) else _scalar(value)
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [plain(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, (set, frozenset)):
        return {plain(v) for v in value}
    if is_dataclass(value) and not isinstance(value, type) and type(value).__module__.startswith("spectrace."):
        return replace(value, **{f.name: plain(getattr(value, f.name)) for f in fields(value) if f.init})
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        try:
            return plain(tolist())
        except Exception:
            pass
    return str(value)


def _scalar(value: Any) -> Any:
    """A subclass of a plain scalar (an enum on str or int, numpy's bool_ is not one) as the plain scalar."""
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return str(value)
