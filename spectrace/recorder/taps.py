"""Records the hidden-state taps of the loaded target (worker, after ``load_model``).

The taps are read by ``spectrace.vllm_objects.taps`` and judged by ``spectrace.audit.audit_taps``,
as ``spectrace doctor`` does on meta-built models.
"""

from __future__ import annotations

from typing import Any

from spectrace import audit
from spectrace.values import Taps
from spectrace.console import EVIDENCE_ITEMS
from spectrace.vllm_objects import layers as read_layers
from spectrace.vllm_objects import taps as read_taps
from spectrace.vllm_objects.configs import model_runner
from spectrace.recorder import audit_live

RULE = "EagleModelMixin.aux_hidden_state_layers of the loaded target (set by the model runner)"


def record_taps(rt, worker: Any, role: str, rank: int | None, span: Any = None) -> None:
    vllm_config = worker.vllm_config
    spec = vllm_config.speculative_config
    if not read_taps.taps_apply(spec, model_runner(vllm_config)):
        return
    runner = worker.model_runner
    facts = read_taps.tap_facts(vllm_config, read_layers.target_model(runner), read_layers.draft_model(runner))
    tap, findings = audit.audit_taps(**facts, rule=RULE)
    rt.record("hidden_state_taps", {"model_role": "draft", **tap.as_row()}, role=role, rank=rank)
    with rt.span(
        "spectrace.hidden_states.taps",
        role=role,
        rank=rank,
        attributes={
            "spectrace.taps.declared_field": tap.declared_field or "",
            # at most EVIDENCE_ITEMS ids each (a list from someone's config can be millions long), and how many in all
            **{f"spectrace.taps.{name}": list((ids or [])[:EVIDENCE_ITEMS]) for name, ids in (
                ("declared_ids", tap.declared_ids), ("expected_ids", tap.expected_ids), ("tapped_ids", tap.tapped_ids))},
            **{f"spectrace.taps.{name}_count": len(ids) for name, ids in (
                ("declared_ids", tap.declared_ids), ("expected_ids", tap.expected_ids), ("tapped_ids", tap.tapped_ids))
               if ids is not None and len(ids) > EVIDENCE_ITEMS},
            "spectrace.taps.status": tap.status,
        },
    ) as taps_span:
        audit_live.emit_findings(rt, findings, role=role, span=taps_span, rank=rank)
    if rt.metered and tap.tapped_ids is not None:
        expected = tap.expected_ids or []
        rt.pipeline.note(Taps(rt.run.run_id if rt.run is not None else None, [
            {"expected_id": expected[i] if i < len(expected) else "none", "tapped_id": tapped}
            for i, tapped in enumerate(tap.tapped_ids)
        ]))
    rt.flush()
