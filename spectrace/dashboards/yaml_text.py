"""YAML as the provisioning files want it (a leaf: ``build`` and ``export`` both use it)."""

from __future__ import annotations

import json
from typing import Any


def to_yaml(document: Any) -> str:
    """YAML with multi-line strings (PromQL, descriptions) as literal blocks."""
    try:
        import yaml
    except ImportError:  # JSON is YAML too
        return json.dumps(document, indent=2, ensure_ascii=False) + "\n"

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump(document, Dumper=Dumper, sort_keys=False, allow_unicode=True, width=1_000_000, default_flow_style=False)
