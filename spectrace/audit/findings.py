"""The record every audit function returns: one finding."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from spectrace.console import bounded, clipped


@dataclass
class Finding:
    code: str
    severity: str  # error | warning | info
    component: str  # config | layout | method | vocab | context | load | taps | verification | ranks | weights | rope | dtype (codes.Code.component)
    model_role: str | None
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str = ""
    caused_by: str | None = None

    def __post_init__(self) -> None:
        # output bounded by what is useful: a config's million-entry list is cut with a count, wherever it lands
        self.evidence = bounded(self.evidence)
        self.message = clipped(self.message)

    def as_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["evidence"] = json.dumps(self.evidence, sort_keys=True, default=str)
        return row
