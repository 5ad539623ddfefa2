"""Runs the pure audit (``spectrace.audit``) on what the live hooks captured.

Findings go to the ``findings`` table (flushed at once), become events on the
span at hand, and each is one log line at its severity.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from spectrace import audit

log = logging.getLogger("vllm.spectrace")

_LEVEL = {"error": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO}


def emit_findings(rt, findings: list[audit.Finding], *, role: str, span: Any = None, rank: int | None = None, run: Any = None) -> None:
    now = time.time_ns()
    labels = rt.labels(run.run_id if run is not None else None) if rt.metrics is not None else None
    for finding in findings:
        rt.record("findings", {"ts": now, **finding.as_row()}, role=role, rank=rank, run=run)
        if labels is not None:
            if finding.code == "ACCEPTANCE_RECOVERED":
                rt.metrics.finding("ACCEPTANCE_COLLAPSE", "error", finding.model_role, labels, present=False)
            else:
                rt.metrics.finding(finding.code, finding.severity, finding.model_role, labels)
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


def config_findings(models: list[dict[str, Any]], method: str | None = None) -> tuple[list[audit.FieldDiff], dict[str, list[audit.Finding]]]:
    diffs: list[audit.FieldDiff] = []
    by_role: dict[str, list[audit.Finding]] = {}
    for model in models:
        role = model["model_role"]
        model_diffs, findings = audit.audit_config(role, model["declared"], model["transformers_resolved"])
        if role == "draft" and method == "mtp":
            # vLLM re-reads the target checkpoint for MTP and rewrites its fields through
            # SpeculativeConfig.hf_config_override by design: not a finding.
            findings = [f for f in findings if f.code not in ("FIELD_CHANGED", "FIELD_DROPPED")]
        diffs.extend(model_diffs)
        by_role.setdefault(role, []).extend(findings)
    return diffs, by_role


def audit_resolution(rt, info: dict[str, Any], models: list[dict[str, Any]], vllm_config: Any, error: str | None) -> None:
    """Config audit of one run's resolution (frontend)."""
    diffs, by_role = config_findings(models, info.get("method"))
    findings = [f for role_findings in by_role.values() for f in role_findings]
    target = next((m for m in models if m["model_role"] == "target"), None)
    draft = next((m for m in models if m["model_role"] == "draft"), None)
    max_model_len = getattr(getattr(vllm_config, "model_config", None), "max_model_len", None)
    findings += audit.audit_pair(
        method=info.get("method"),
        method_given=not info.get("method_inferred"),
        draft_path=info.get("draft_model"),
        target=target["transformers_resolved"] if target else None,
        draft=draft["declared"] if draft else None,
        target_max_model_len=max_model_len,
    )
    if error is not None:
        findings.append(audit.explain_load_error(error, findings))
    rt.records("config_fields", [d.as_row() for d in diffs], role="frontend")
    span = rt.run.root_span if rt.run is not None else None
    emit_findings(rt, findings, role="frontend", span=span)


def draft_root_causes(declared: dict | None, resolved: dict | None) -> tuple[set[str], list[audit.Finding]]:
    _, findings = audit.audit_config("draft", declared, resolved)
    return audit.root_causes(findings), findings
