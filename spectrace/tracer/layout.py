"""Runtime attention layout, read from the built model (worker) and the KV specs (engine core)."""

from __future__ import annotations

from typing import Any


def record_runtime_layout(rt, worker: Any, role: str, rank: int | None) -> None:
    return None


def record_kv_cache_specs(rt, engine_core: Any, vllm_config: Any, role: str) -> None:
    return None
