"""Turns what the live hooks captured into audit records (config fields, findings)."""

from __future__ import annotations

from typing import Any


def audit_resolution(rt, info: dict[str, Any], models: list[dict[str, Any]], vllm_config: Any, error: str | None) -> None:
    """Config audit of one run's resolution; filled in by the config-audit stage."""
    return None
