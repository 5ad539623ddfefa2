"""The ranks of one run compared from the store (each rank is a process of its own, so only the
store sees them all): the rows each rank recorded, judged by ``spectrace.audit.rank_disagreements``.

Ranks on several hosts (``--nnodes``, Ray) write into their own node's store; they meet in the
lake, where the same queries compare them (``spectrace report --lake``)."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from spectrace import audit


def rank_rows(con: Any, run_id: str) -> tuple[dict[int, list[tuple]], dict[int, list[int] | None], dict[int, tuple[int, int]]]:
    """Per worker rank: layout rows, tapped ids, and verified (drafted, accepted) of ``run_id``."""
    layouts: dict[int, list[tuple]] = defaultdict(list)
    for rank, *row in con.execute(
        "select rank, model_role, layer_index, runtime_type, runtime_window, causal from attention_layout "
        "where run_id = ? and rank is not null", [run_id]
    ).fetchall():
        layouts[rank].append(tuple(row))
    taps = {
        rank: [int(i) for i in json.loads(tapped)] if tapped is not None else None
        for rank, tapped in con.execute(
            "select rank, any_value(tapped_ids) from hidden_state_taps where run_id = ? and rank is not null group by rank",
            [run_id],
        ).fetchall()
    }
    counts = {
        rank: (int(drafted), int(accepted))
        for rank, drafted, accepted in con.execute(
            "select rank, sum(drafted), sum(accepted) from verify_counts where run_id = ? and source = 'worker' "
            "and rank is not null group by rank", [run_id]
        ).fetchall()
    }
    return dict(layouts), taps, counts


def rank_hosts(con: Any, run_id: str) -> dict[int, str]:
    """The host each worker rank of ``run_id`` ran on (from its layout rows)."""
    return {
        int(rank): host
        for rank, host in con.execute(
            "select rank, any_value(host) from attention_layout where run_id = ? and rank is not null group by rank",
            [run_id],
        ).fetchall()
    }


def weight_rows(con: Any, run_id: str) -> dict[int, list[tuple]]:
    """Per worker rank: (model_role, embed_tokens, lm_head, unloaded) from ``model_weights``."""
    rows: dict[int, list[tuple]] = defaultdict(list)
    for rank, *row in con.execute(
        "select rank, model_role, embed_tokens, lm_head, unloaded from model_weights "
        "where run_id = ? and rank is not null", [run_id]
    ).fetchall():
        rows[rank].append(tuple(row))
    return dict(rows)


def rank_findings(con: Any, run_id: str) -> tuple[list[int], list[audit.Finding]]:
    """The ranks seen for ``run_id`` and the RANK_DISAGREEMENT findings among them."""
    layouts, taps, counts = rank_rows(con, run_id)
    ranks = sorted(set(layouts) | set(taps) | set(counts))
    hosts = rank_hosts(con, run_id)
    return ranks, audit.rank_disagreements(
        layouts, taps, counts, hosts=hosts if len(set(hosts.values())) > 1 else None, weights=weight_rows(con, run_id)
    )
