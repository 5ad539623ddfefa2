"""Model configs as plain data: the declared ``config.json`` and a resolved config object.

Shared by the live hooks (``spectrace.tracer``) and ``spectrace doctor``; imports
nothing heavy (transformers only when a config must come from the HF cache).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_declared(model: str) -> dict[str, Any] | None:
    """The raw ``config.json`` of ``model`` as written (local dir or HF cache)."""
    path = Path(model)
    if path.is_dir():
        file = path / "config.json"
        return json.loads(file.read_text()) if file.exists() else None
    try:
        from transformers import PretrainedConfig

        config_dict, _ = PretrainedConfig.get_config_dict(model, local_files_only=True)
        return config_dict
    except Exception:
        return None


def config_to_dict(config: Any) -> dict[str, Any] | None:
    """A config object as JSON data (``to_dict()``, values that JSON lacks as strings)."""
    if config is None:
        return None
    try:
        data = config.to_dict()
    except Exception:
        data = dict(getattr(config, "__dict__", {}))
    return json.loads(json.dumps(data, default=str))
