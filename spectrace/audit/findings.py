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

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Finding":
        """A ``findings`` row read back from a store or lake (evidence that is not a JSON object kept as text)."""
        evidence = row.get("evidence")
        if isinstance(evidence, str):
            try:
                evidence = json.loads(evidence)
            except ValueError:
                evidence = {"text": evidence}
        return cls(code=str(row["code"]), severity=str(row["severity"]), component=str(row.get("component") or ""),
                   model_role=row.get("model_role"), message=str(row.get("message") or ""),
                   evidence=evidence if isinstance(evidence, dict) else {"value": evidence},
                   fix=str(row.get("fix") or ""), caused_by=row.get("caused_by"))

    def as_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["evidence"] = json.dumps(self.evidence, sort_keys=True, default=str)
        return row
