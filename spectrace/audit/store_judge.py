"""One run's verdicts from its records in a store or a lake: ``judge_store(con, run_id)``.

``spectrace report`` (a node's store, or ``--lake``) renders what this returns and decides nothing itself: the
findings the run's processes recorded, and the verdicts only the records of all of them can give — every
tensor-parallel rank's layout, taps and counts side by side (``RANK_DISAGREEMENT``: each rank is a process of its
own), and what k pays priced from this target's runs without drafts (``SPECULATION_K_BETTER``, with the tie rule).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from spectrace.audit.rules import speedup
from spectrace.audit.curve import K_BETTER_MARGIN, best_k, k_better_finding
from spectrace.audit.findings import Finding
from spectrace.audit.ranks import rank_disagreements
from spectrace.audit.rules import active

TIE = 0.02  # predicted speed-ups this close to the best are a tie: the model's error is larger (docs: "What k pays")


@dataclass
class StoreVerdicts:
    """What ``judge_store`` found for one run."""

    recorded: list[Finding]  # written by the run's processes, in the order they were
    derived: list[Finding]  # only the store's records give these (rank disagreement, k better)
    ranks: list[int]  # the worker ranks seen
    hosts: dict[int, str]  # rank -> host (from its layout rows)
    by_k: list[dict[str, Any]] = field(default_factory=list)  # what k pays, whole run (spectrace.audit.rules.speedup.from_store)
    by_k_bands: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # ... and per batch-size band
    best: dict[str, Any] | None = None  # the measured k' that pays most (k' = 0: no speculation)
    ties: list[int] = field(default_factory=list)  # other measured k' within TIE of the best: a tie, not advice
    status: list[active.Status] = field(default_factory=list)  # each recorded finding's standing (rules.active)

    @property
    def pays_unresolved(self) -> bool:
        """The best is to speculate, by less than the model's error over no speculation (K_BETTER_MARGIN): it is not
        shown to pay (docs: "What k pays")."""
        best = self.best
        return best is not None and best["k"] > 0 and best["speedup"] < 1 + K_BETTER_MARGIN

    @property
    def findings(self) -> list[Finding]:
        return self.recorded + self.derived

    def rank_findings(self) -> list[Finding]:
        return [f for f in self.derived if f.component == "ranks"]


def judge_store(con: Any, run_id: str) -> StoreVerdicts:
    """The run's verdicts from the tables of ``con`` (``spectrace.store.open`` or the lake's connection)."""
    recorded = [Finding.from_row(row) for row in _rows(
        con, "select code, severity, component, model_role, message, evidence, fix, caused_by from findings "
        "where run_id = ? order by ts", run_id)]
    ranks, derived, hosts = rank_verdicts(con, run_id)
    by_k, bands = speedup.from_store(con, run_id), speedup.by_band(con, run_id)
    better = k_better_finding(by_k, by_band=bands)
    if better is not None:
        derived.append(better)
    status = active.statuses({"code": f.code, "model_role": f.model_role} for f in recorded)
    return StoreVerdicts(recorded, derived, ranks, hosts, by_k, bands, *k_choice(by_k), status=status)


def k_choice(rows: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, list[int]]:
    """The measured ``k'`` of "What k pays" rows that pays most, and the other measured ``k'`` within :data:`TIE`
    of it (a tie: the model cannot tell them apart)."""
    top = best_k(rows)
    if top is None:
        return None, []
    return top, [r["k"] for r in rows if r is not top and not r["extrapolated"] and r["speedup"] is not None
                 and r["speedup"] >= top["speedup"] * (1 - TIE)]


def _rows(con: Any, sql: str, run_id: str) -> list[dict[str, Any]]:
    cursor = con.execute(sql, [run_id])
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def rank_verdicts(con: Any, run_id: str) -> tuple[list[int], list[Finding], dict[int, str]]:
    """The worker ranks seen for ``run_id``, the RANK_DISAGREEMENT findings among them, and each rank's host."""
    layouts, taps, counts, hosts, weights = rank_records(con, run_id)
    ranks = sorted(set(layouts) | set(taps) | set(counts))
    return ranks, rank_disagreements(layouts, taps, counts, hosts=hosts if len(set(hosts.values())) > 1 else None,
                                     weights=weights), hosts


def rank_records(con: Any, run_id: str) -> tuple[dict, dict, dict, dict, dict]:
    """Per worker rank of ``run_id``: layout rows, tapped ids, verified (drafted, accepted), host, weight rows."""
    layouts: dict[int, list[tuple]] = defaultdict(list)
    hosts: dict[int, str] = {}
    for rank, host, *row in con.execute(
        "select rank, host, model_role, layer_index, runtime_type, runtime_window, causal from attention_layout "
        "where run_id = ? and rank is not null", [run_id]
    ).fetchall():
        layouts[int(rank)].append(tuple(row))
        hosts.setdefault(int(rank), host)
    taps = {
        int(rank): [int(i) for i in json.loads(tapped)] if tapped is not None else None
        for rank, tapped in con.execute(
            "select rank, any_value(tapped_ids) from hidden_state_taps where run_id = ? and rank is not null group by rank",
            [run_id],
        ).fetchall()
    }
    counts = {
        int(rank): (int(drafted), int(accepted))
        for rank, drafted, accepted in con.execute(
            "select rank, sum(drafted), sum(accepted) from verify_counts where run_id = ? and source = 'worker' "
            "and rank is not null group by rank", [run_id]
        ).fetchall()
    }
    weights: dict[int, list[tuple]] = defaultdict(list)
    for rank, *row in con.execute(
        "select rank, model_role, embed_tokens, lm_head, unloaded from model_weights where run_id = ? and rank is not null",
        [run_id],
    ).fetchall():
        weights[int(rank)].append(tuple(row))
    return dict(layouts), taps, counts, hosts, dict(weights)
