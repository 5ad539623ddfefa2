"""Dynamic speculation that thrashes (``DYNAMIC_K_THRASHING``): k flipping between consecutive steps.

vLLM 0.32's scheduler picks the k the worker drafts after each step from that step's batch size
(``Scheduler.schedule``: ``dynamic_sd_lookup[len(num_scheduled_tokens)]``, the table from
``num_speculative_tokens_per_batch_size``). A batch that sits on a threshold of the table makes k
flip from one step to the next, and drafts proposed at one k are trimmed or thrown away at the next:
serving slows although acceptance is healthy (vllm#49548, #44815).

Pure: the facts are what the verification drain counted per run (verified steps and k switches by
batch-size band and k, switches by the k before and after) and the run's configs.
"""

from __future__ import annotations

from typing import Any

from spectrace.audit import codes
from spectrace.audit.findings import Finding
from spectrace.bands import band_order

THRASHING_MIN_SWITCHES = 20  # k switches before the share is judged
THRASHING_SHARE = 0.25  # of the run's verified steps
MAX_TRANSITIONS = 8  # (k before, k after) pairs kept in the evidence, the most frequent first


def k_thrashing(
    by_shape: dict[tuple[str, int], tuple[int, int]],
    transitions: dict[tuple[int, int], int],
    schedule: Any,
) -> dict[str, Any] | None:
    """The evidence of ``DYNAMIC_K_THRASHING``, or None.

    ``by_shape``: (batch band, k) -> (verified steps, of those the steps whose run's previous verified step
    drafted another k); ``transitions``: (k before, k after) -> switches; ``schedule``: the run's
    ``num_speculative_tokens_per_batch_size`` (None or empty: k is static, nothing to judge). Raised when k
    switched in at least ``THRASHING_MIN_SWITCHES`` steps and at least ``THRASHING_SHARE`` of the verified steps.
    """
    if not schedule:
        return None
    steps = sum(n for n, _ in by_shape.values())
    switches = sum(s for _, s in by_shape.values())
    if switches < THRASHING_MIN_SWITCHES or switches < THRASHING_SHARE * steps:
        return None
    shapes = sorted(by_shape.items(), key=lambda item: (band_order(item[0][0]), item[0][1]))
    k_steps: dict[int, int] = {}
    for (_, k), (n, _) in shapes:
        k_steps[k] = k_steps.get(k, 0) + n
    frequent = sorted(transitions.items(), key=lambda item: (-item[1], item[0]))[:MAX_TRANSITIONS]
    return {
        "verified_steps": steps,
        "k_switches": switches,
        "share": round(switches / steps, 4),
        "k_steps": {str(k): n for k, n in sorted(k_steps.items())},
        "transitions": {f"{a}->{b}": n for (a, b), n in frequent},
        "switched_shapes": [{"batch_band": band, "k": k, "steps": n, "k_switches": s} for (band, k), (n, s) in shapes if s],
        "batch_bands": sorted({band for (band, _), (_, s) in shapes if s}, key=band_order),
        "num_speculative_tokens_per_batch_size": [list(entry) for entry in schedule],
        "rule": f">= {THRASHING_MIN_SWITCHES} k switches and >= {THRASHING_SHARE:.0%} of the verified steps, "
                "dynamic speculation configured",
        "vllm_rule": "vllm.v1.core.sched.scheduler.Scheduler.schedule (dynamic_sd_lookup[batch size]: the k drafted "
                     "for the next step)",
    }


def thrashing_finding(
    evidence: dict[str, Any], drafts: dict[str, int] | None = None, budget: list[Finding] | None = None,
    *, max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
) -> Finding:
    """``DYNAMIC_K_THRASHING`` from ``k_thrashing``'s evidence.

    ``drafts``: the run's ``draft_budget`` so far (``proposed``, ``verified``, ``requests`` that verified drafts,
    ``num_speculative_tokens``), None where it was not measured (asynchronous scheduling); ``budget``: the run's
    ``TOKEN_BUDGET_SHORT`` findings, named beside it when the budget also moves the batch.
    """
    unverified = None
    if drafts and drafts.get("proposed"):
        unverified = {
            "proposed": drafts["proposed"], "verified": drafts["verified"],
            "unverified": max(drafts["proposed"] - drafts["verified"], 0),
            # each finished request's last proposal is never verified: at most k tokens of it
            "finished_allowance_at_most": drafts.get("requests", 0) * (drafts.get("num_speculative_tokens") or 0),
        }
    short = budget[0] if budget else None
    evidence = {**evidence, "drafts": unverified, "max_num_seqs": max_num_seqs,
                "max_num_batched_tokens": max_num_batched_tokens,
                "token_budget": short.evidence if short is not None else None}
    *others, last = evidence["k_steps"]
    ks = f"{', '.join(others)} and {last}" if others else last
    flips = ", ".join(f"{pair.replace('->', '→')} ×{n}" for pair, n in list(evidence["transitions"].items())[:4])
    bands = ", ".join(evidence["batch_bands"])
    message = (
        f"k switched in {evidence['k_switches']} of {evidence['verified_steps']} verified steps ({evidence['share']:.1%}): "
        f"dynamic speculation (num_speculative_tokens_per_batch_size {evidence['num_speculative_tokens_per_batch_size']}) "
        f"moved k between {ks} from one step to the next ({flips}) at batch sizes {bands}; drafts proposed at one k are "
        "trimmed or thrown away at the next"
    )
    if unverified is not None:
        message += (f" ({unverified['unverified']} of {unverified['proposed']} proposed draft tokens never verified, "
                    f"at most {unverified['finished_allowance_at_most']} of them finished requests' last proposals)")
    if short is not None:
        message += (f"; {codes.TOKEN_BUDGET_SHORT} holds too (max_num_batched_tokens {short.evidence['max_num_batched_tokens']} "
                    f"fits {short.evidence['full_draft_requests']} requests at k {short.evidence['num_speculative_tokens']}): "
                    "a step at the largest k can schedule fewer requests than are running, and a smaller batch picks another k")
    return codes.finding(
        codes.DYNAMIC_K_THRASHING,
        severity="warning",
        model_role="draft",
        message=message,
        evidence=evidence,
        fix=f"widen or merge the ranges of num_speculative_tokens_per_batch_size around batch sizes {bands}, or set "
        "--max-num-seqs / --max-num-batched-tokens so the batch does not sit on the threshold"
        + (f" (a full batch at the largest k needs {short.evidence['needed']} tokens)" if short is not None else "")
        + ", or use a static num_speculative_tokens",
    )
