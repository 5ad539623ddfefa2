"""Agreement within one engine: rank against rank (``RANK_DISAGREEMENT``), engine core against
its workers (``VERIFY_DISAGREEMENT``)."""

from __future__ import annotations

from typing import Any

from spectrace.audit import codes
from spectrace.audit.findings import Finding


def rank_disagreements(
    layouts: dict[int, list[tuple]],
    taps: dict[int, list[int] | None],
    counts: dict[int, tuple[int, int]],
    *,
    hosts: dict[int, str] | None = None,
    weights: dict[int, list[tuple]] | None = None,
) -> list[Finding]:
    """RANK_DISAGREEMENT where the ranks of one engine (tensor parallelism) differ.

    Every rank builds the whole model and verifies the same batch, so each one's
    ``layouts`` (per rank: ``(model_role, layer_index, runtime_type, runtime_window, causal)``
    rows), ``taps`` (tapped ids) and verified ``counts`` (drafted, accepted) must equal
    the lowest rank's; so must ``weights`` (per rank: ``(model_role, embed_tokens, lm_head,
    unloaded)`` rows from ``model_weights``: whether the drafter uses its own embeddings and head
    or the target's, which vLLM decides per rank by comparing weights). One finding per aspect
    that differs, naming the ranks (and, where ``hosts`` is given, the host of each rank: the
    ranks of one engine may run on several).
    """
    findings = []
    for aspect, by_rank, what in (
        ("layout", {r: sorted(rows) for r, rows in layouts.items()}, "attention layout (type, window, causal per layer)"),
        ("taps", taps, "hidden-state taps"),
        ("counts", counts, "verified drafted / accepted tokens"),
        ("weights", {r: sorted(rows) for r, rows in (weights or {}).items()},
         "the drafter's embeddings and head (own or the target's) or its unloaded parameters"),
    ):
        if len(by_rank) < 2:
            continue
        ranks = sorted(by_rank)
        reference = by_rank[ranks[0]]
        differ = [r for r in ranks[1:] if by_rank[r] != reference]
        if not differ:
            continue
        evidence: dict[str, Any] = {"aspect": aspect, "ranks": ranks, "differing_ranks": differ}
        if hosts:
            evidence["hosts"] = {str(r): hosts.get(r) for r in ranks}
        if aspect == "layout":
            evidence["layers"] = {
                str(r): [row for row in by_rank[r] if row not in reference] for r in differ
            }
            evidence["reference_layers"] = [row for row in reference if any(row not in by_rank[r] for r in differ)]
        else:
            evidence["values"] = {str(r): by_rank[r] for r in ranks}
        findings.append(
            codes.finding(
                codes.RANK_DISAGREEMENT,
                severity="error",
                model_role=None,
                message=f"rank(s) {differ} differ from rank {ranks[0]} in {what}",
                evidence=evidence,
            )
        )
    return findings


def disagreement_finding(engine: tuple[int, int] | list[int], worker: tuple[int, int] | list[int], rank: int | None, run_id: str) -> Finding:
    """``VERIFY_DISAGREEMENT``: the engine core's (drafted, accepted) totals of a run differ from a worker rank's."""
    return codes.finding(
        codes.VERIFY_DISAGREEMENT,
        severity="error",
        model_role="draft",
        message=f"engine core counted {engine[0]} drafted / {engine[1]} accepted, "
        f"worker rank {rank} verified {worker[0]} / {worker[1]}",
        evidence={"engine_core": engine, "worker": worker, "rank": rank, "run_id": run_id},
    )
