"""Records the runtime attention layout of the loaded models (worker, after ``load_model``).

What each layer executes is read by ``spectrace.vllm_objects.layers``; the plans and
``LAYOUT_MISMATCH`` findings come from ``spectrace.audit`` — the same two calls
``spectrace doctor`` makes on models built on the meta device.
"""

from __future__ import annotations

from typing import Any

from spectrace import audit
from spectrace.values import LayoutVerdicts
from spectrace.vllm_objects import layers as read_layers
from spectrace.vllm_objects.configs import config_to_dict, model_configs, read_declared
from spectrace.recorder import audit_live


def record_runtime_layout(rt, worker: Any, role: str, rank: int | None, span: Any = None) -> None:
    """attention_layout rows for target and drafter, and LAYOUT_MISMATCH findings."""
    vllm_config = worker.vllm_config
    runtime = read_layers.runtime_layers(read_layers.loaded_models(worker.model_runner), vllm_config)
    configs = model_configs(vllm_config)
    spec = vllm_config.speculative_config
    method = spec.method if spec is not None else None
    rows = []
    statuses = []
    findings = []
    for model_role, layers in runtime.items():
        model_config = configs.get(model_role)
        if model_config is None or not layers:
            continue
        plans, model_findings = audit.audit_model_layout(
            model_role, read_declared(model_config.model), config_to_dict(model_config.hf_config), layers, method=method
        )
        rows += [{"model_role": model_role, **plan.as_row(), "process": role} for plan in plans]
        statuses += audit.layout_status(plans, model_findings)
        findings += model_findings
    rt.records("attention_layout", rows, role=role, rank=rank)
    if rt.verify is not None:
        rt.verify.note_layout(runtime)  # the engine core's judge, when it runs in this process
    if rt.metered:
        rt.pipeline.note(LayoutVerdicts(rt.run.run_id if rt.run is not None else None,
                                        [{**row, "status": status} for row, status in zip(rows, statuses)]))
    audit_live.emit_findings(rt, findings, role=role, span=span, rank=rank)
    rt.flush()


def record_load_error(rt, worker: Any, error: BaseException, role: str, rank: int | None, span: Any = None) -> None:
    """vLLM refused to build the model: a LOAD_FAILED finding in config terms."""
    draft = model_configs(worker.vllm_config).get("draft")
    finding = audit.explain_build_error(
        f"{type(error).__name__}: {error}",
        read_declared(draft.model) if draft is not None else None,
        config_to_dict(draft.hf_config) if draft is not None else None,
    )
    audit_live.emit_findings(rt, [finding], role=role, span=span, rank=rank)
    rt.flush()
