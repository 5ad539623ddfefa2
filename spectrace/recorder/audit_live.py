"""Records what the pure audit (``spectrace.audit``) finds in what the live hooks captured.

Findings go to the ``findings`` table (flushed at once), become events on the
span at hand, and each is one log line at its severity.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from spectrace import audit
from spectrace.audit.dtype import dtype_name
from spectrace.vllm_objects.configs import (
    drafter_stages, hf_override_facts, model_configs, scheduler_facts, speculation_facts,
)
from spectrace.vllm_objects.weights import read_manifest, read_vocab_maps

log = logging.getLogger("vllm.spectrace")

_LEVEL = {"error": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO}


def emit_findings(rt, findings: list[audit.Finding], *, role: str, span: Any = None, rank: int | None = None, run: Any = None) -> None:
    now = time.time_ns()
    for finding in findings:  # the findings gauge follows these rows (spectrace.sinks.metrics.MetricsSink)
        rt.record("findings", {"ts": now, **finding.as_row()}, role=role, rank=rank, run=run)
        if span is not None and span.is_recording():
            span.add_event(
                f"spectrace.finding.{finding.code}",
                {
                    "code": finding.code,
                    "severity": finding.severity,
                    "model_role": finding.model_role or "",
                    "message": finding.message,
                    "fix": finding.fix,
                    "caused_by": finding.caused_by or "",
                },
            )
        log.log(
            _LEVEL.get(finding.severity, logging.INFO),
            "spectrace %s %s [%s]: %s%s",
            finding.severity.upper(),
            finding.code,
            finding.model_role or "-",
            finding.message,
            f" Fix: {finding.fix}" if finding.fix else "",
        )


def audit_resolution(rt, info: dict[str, Any], models: list[dict[str, Any]], vllm_config: Any, error: str | None) -> None:
    """Config audit of one run's resolution (frontend): ``audit.judge`` on what the frontend knows.

    The frontend builds no model, so ``runtime_layers`` stays ``None``: the layout is
    judged where it runs (the worker, ``recorder.layout``).
    """
    judged = audit.judge(
        audit.RunFacts(
            models,
            info.get("method"),
            method_given=not info.get("method_inferred"),
            draft_path=info.get("draft_model"),
            max_model_len=getattr(getattr(vllm_config, "model_config", None), "max_model_len", None),
            load_error=error,
            scheduler=scheduler_facts(vllm_config) if vllm_config is not None else None,
            runs_in=runs_in(vllm_config),
            checkpoint_dtypes=checkpoint_dtypes(models),
            drafter_stages=stages_of(models),
            vocab_maps=vocab_maps_of(models),
            draft_settings={"method": info.get("method"), "hf_overrides": hf_override_facts(vllm_config)},
            speculation=speculation_facts(vllm_config) if vllm_config is not None else None,
        )
    )
    rt.records("config_fields", [d.as_row() for d in judged.diffs], role="frontend")
    span = rt.run.root_span if rt.run is not None else None
    emit_findings(rt, judged.findings, role="frontend", span=span)


def runs_in(vllm_config: Any) -> dict[str, str | None] | None:
    """The dtype vLLM builds each model with (``ModelConfig.dtype``; the drafter's is the target's)."""
    if vllm_config is None:
        return None
    return {role: dtype_name(getattr(config, "dtype", None)) for role, config in model_configs(vllm_config).items()}


def checkpoint_dtypes(models: list[dict[str, Any]]) -> dict[str, str | None]:
    """The dtype most of each checkpoint's tensors hold, from its safetensors headers (headers only: no tensor data
    is read). What training wrote, and so what the dtype audit reads before a config's often stale dtype, as doctor
    does."""
    found: dict[str, str | None] = {}
    for model in models:
        if model.get("model"):
            found[model["model_role"]] = dtype_name(read_manifest(model["model"]).main_dtype())
    return found


def _draft(models: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((m for m in models if m.get("model_role") == "draft"), None)


def stages_of(models: list[dict[str, Any]]) -> list[Any] | None:
    """The drafter's config through vLLM's resolution steps (declared → … → ``vllm_resolved``)."""
    draft = _draft(models)
    if draft is None or draft.get("declared") is None:
        return None
    return drafter_stages(draft["declared"], draft.get("transformers_resolved"), draft.get("vllm_resolved"),
                          draft.get("transformers_class"))


def vocab_maps_of(models: list[dict[str, Any]]) -> tuple[bool, dict[str, Any]] | None:
    """The drafter checkpoint's d2t / t2d (small tensors, values read), or None without a drafter."""
    draft = _draft(models)
    if draft is None or not draft.get("model"):
        return None
    return read_vocab_maps(draft["model"])
