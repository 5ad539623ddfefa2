"""What requests and the scheduler do to speculation: a request slice that accepts far below its
run (``SLICE_ACCEPTANCE_LOW``), a token budget too small for a full batch of drafts
(``TOKEN_BUDGET_SHORT``). Pure: the slice rule is ``spectrace.audit.rules.slices``; the budget rule follows
vLLM 0.32's ``Scheduler.schedule``.
"""

from __future__ import annotations

from typing import Any

from spectrace.audit import codes
from spectrace.audit.findings import Finding

# why each dimension lowers acceptance, and what to do about it
_CAUSES = {
    "penalty": (
        "the drafter proposes from unpenalized logits while the target verifies after the penalty "
        "(vllm#18902, #19482, #34497)",
        "the drafter cannot see request penalties: route requests with {dimension} to an engine without speculative "
        "decoding (or a lower num_speculative_tokens), or drop the penalty from them{defaults}",
    ),
    "logits": (
        "the drafter proposes a plain argmax; the target verifies after {dimension}",
        "route requests with {dimension} to an engine without speculative decoding, or drop it from them{defaults}",
    ),
    "sampling": (
        "the target samples with {dimension} {value}, the drafter does not",
        "route requests with {dimension} {value} to an engine without speculative decoding, or lower "
        "num_speculative_tokens for that traffic{defaults}",
    ),
    "structured_output": (
        "the grammar rejects drafts the drafter made without it",
        "lower num_speculative_tokens for structured-output traffic, or serve it without speculative decoding",
    ),
    "lora_adapter": (
        "the adapter changes the target only; the drafter drafts for the base model",
        "use a drafter trained for the adapter (or merged weights), or serve the adapter without speculative decoding",
    ),
    "prefix_cache": (
        "the drafter's KV for cache-restored tokens can be stale (vllm#47930, #41838)",
        "reset the prefix cache (POST /reset_prefix_cache) and compare; if acceptance comes back, disable prefix "
        "caching for this drafter (--no-enable-prefix-caching) until vLLM fixes it",
    ),
    "prompt_len": (
        "acceptance depends on the prompt's length",
        "check CONTEXT_CLIFF and the drafter's context (max_position_embeddings, rope scaling, window)",
    ),
}
_KIND = {
    "repetition_penalty": "penalty", "presence_penalty": "penalty", "frequency_penalty": "penalty",
    "logit_bias": "logits", "bad_words": "logits", "allowed_token_ids": "logits", "min_p": "logits",
    "temperature": "sampling", "top_p": "sampling", "top_k": "sampling",
}


def slice_finding(gap: Any, defaults: dict[str, Any] | None = None) -> Finding:
    """``SLICE_ACCEPTANCE_LOW`` for one ``spectrace.audit.rules.slices.SliceGap``; ``defaults``: the run's
    ``generation_config`` sampling defaults (the server applies them to every request)."""
    kind = _KIND.get(gap.dimension, gap.dimension)
    cause, fix = _CAUSES.get(kind, ("", "route this traffic to an engine without speculative decoding"))
    from_defaults = defaults is not None and gap.dimension in defaults and f"{defaults[gap.dimension]:g}" == gap.value
    note = (
        f"; {gap.dimension}={gap.value} is generation_config.json's default, which the server applies to every "
        "request that does not set it: start vLLM with --generation-config vllm (or override it per request)"
        if from_defaults else ""
    )
    values = {"dimension": gap.dimension, "value": gap.value, "defaults": note}
    evidence = gap.as_dict()
    evidence["from_generation_config"] = from_defaults
    evidence["rule"] = "spectrace.audit.rules.slices.slice_gap"
    return codes.finding(
        codes.SLICE_ACCEPTANCE_LOW,
        severity="warning",
        model_role="draft",
        message=f"requests with {gap.dimension}={gap.value} accept {gap.rate:.1%} of their drafts ({gap.accepted} of "
        f"{gap.drafted}, {gap.requests} requests; 95 % {gap.interval[0]:.1%}-{gap.interval[1]:.1%}), the rest of the run "
        f"{gap.rest_rate:.1%} ({gap.rest_accepted} of {gap.rest_drafted}, {gap.rest_requests} requests): "
        + cause.format(**values),
        evidence=evidence,
        fix=fix.format(**values),
    )


def thinking_finding(gap: Any) -> Finding:
    """``THINKING_MODE_GAP`` for one ``SliceGap`` of the ``thinking_mode`` dimension (a request's mode) or of
    ``thinking_phase`` (a verify step's phase: reasoning or answer)."""
    evidence = gap.as_dict()
    evidence["rule"] = "spectrace.audit.rules.slices.slice_gap"
    what = "requests with thinking" if gap.dimension == "thinking_mode" else "verify steps in the phase"
    return codes.finding(
        codes.THINKING_MODE_GAP,
        severity="warning",
        model_role="draft",
        message=f"{what} {gap.value} accept {gap.rate:.1%} of their drafts ({gap.accepted} of {gap.drafted}, "
        f"{gap.requests} {'requests' if gap.dimension == 'thinking_mode' else 'steps'}; 95 % {gap.interval[0]:.1%}-"
        f"{gap.interval[1]:.1%}), the rest {gap.rest_rate:.1%} ({gap.rest_accepted} of {gap.rest_drafted}): the "
        f"drafter was likely trained with thinking {'off' if gap.value in ('on', 'reasoning') else 'on'}; no "
        "checkpoint records its training mode",
        evidence=evidence,
    )


def drafting_slots(method: str | None, k: int, parallel: bool = False) -> int:
    """Extra input slots a decoding request takes for drafting: vLLM 0.32's
    ``SpeculativeConfig.max_num_new_slots_for_drafting``."""
    if method == "dflash":
        return k
    if parallel:
        return k if method == "draft_model" else k - 1
    return 1 if method == "draft_model" else 0


def token_budget_findings(
    *, method: str | None, k: int | None, max_num_seqs: int | None, max_num_batched_tokens: int | None,
    parallel: bool = False, chunked_prefill: bool | None = None, dynamic_k: Any = None,
) -> list[Finding]:
    """``TOKEN_BUDGET_SHORT``: ``max_num_seqs`` decoding requests need ``1 + k`` scheduled tokens each and
    ``1 + k + slots`` of ``max_num_batched_tokens`` (``Scheduler.schedule``: ``input_budget -= num_new_tokens +
    draft_slots``); below that a full batch trims drafts or leaves requests waiting, and chunked prefill takes
    from the same budget."""
    if not k or not max_num_seqs or not max_num_batched_tokens:
        return []
    slots = drafting_slots(method, k, parallel)
    needed = max_num_seqs * (1 + k + slots)
    if max_num_batched_tokens >= needed:
        return []
    per_request = 1 + k + slots
    fits = max_num_batched_tokens // per_request
    return [codes.finding(
        codes.TOKEN_BUDGET_SHORT,
        severity="warning",
        model_role=None,
        message=f"max_num_batched_tokens {max_num_batched_tokens} is below max_num_seqs {max_num_seqs} x (1 + k {k}"
        + (f" + {slots} drafting slot{'s' if slots > 1 else ''}" if slots else "") + f") = {needed}: "
        f"a batch of more than {fits} decoding requests gets its drafts trimmed or leaves requests waiting"
        + ("; chunked prefill takes from the same budget" if chunked_prefill else ""),
        evidence={"max_num_batched_tokens": max_num_batched_tokens, "max_num_seqs": max_num_seqs,
                  "num_speculative_tokens": k, "drafting_slots": slots, "needed": needed,
                  "full_draft_requests": fits, "chunked_prefill": chunked_prefill,
                  "num_speculative_tokens_per_batch_size": dynamic_k,
                  "vllm_rule": "vllm.v1.core.sched.scheduler.Scheduler.schedule (input_budget, draft_slots); "
                               "vllm.config.speculative.SpeculativeConfig.max_num_new_slots_for_drafting"},
        fix=f"raise --max-num-batched-tokens to at least {needed}, or lower --max-num-seqs to {max(fits, 1)} "
        "or num_speculative_tokens",
    )]


UNVERIFIED_MIN_PROPOSED = 500  # proposed draft tokens before the share is judged
UNVERIFIED_SHARE = 0.10


def unverified_drafts(proposed: int, verified: int, requests: int, k: int) -> dict[str, Any] | None:
    """The drafting work that never reached verification, when it is at least ``UNVERIFIED_SHARE`` of what was
    proposed (``proposed`` ≥ ``UNVERIFIED_MIN_PROPOSED``). Each request's last proposal is drafted after its last
    token and never verified: ``requests × k`` is allowed for that before anything counts."""
    if proposed < UNVERIFIED_MIN_PROPOSED:
        return None
    unverified = proposed - verified - requests * k
    if unverified < UNVERIFIED_SHARE * proposed:
        return None
    return {"proposed": proposed, "verified": verified, "requests": requests, "num_speculative_tokens": k,
            "finished_allowance": requests * k, "unverified": unverified, "share": round(unverified / proposed, 4)}


def unverified_finding(evidence: dict[str, Any], budget: list[Finding]) -> Finding:
    """``DRAFTS_UNVERIFIED``; ``budget``: the run's ``TOKEN_BUDGET_SHORT`` findings (its cause when present)."""
    cause = budget[0] if budget else None
    evidence = {**evidence, "token_budget": cause.evidence if cause is not None else None}
    return codes.finding(
        codes.DRAFTS_UNVERIFIED,
        severity="warning",
        model_role="draft",
        message=f"{evidence['share']:.1%} of the drafting work never reached verification: {evidence['proposed']} draft "
        f"tokens proposed, {evidence['verified']} verified ({evidence['finished_allowance']} allowed for the last "
        f"proposal of {evidence['requests']} finished requests)"
        + (f"; {cause.message}" if cause is not None else
           "; the scheduler trimmed them to its token budget or dropped them with their request"),
        evidence=evidence,
        fix=cause.fix if cause is not None else
        "raise --max-num-batched-tokens (chunked prefill takes from the same budget), or lower num_speculative_tokens",
        caused_by=codes.TOKEN_BUDGET_SHORT if cause is not None else None,
    )


DROPPED_HITS_SHARE = 0.25  # of the hits the requests would have had
DROPPED_HITS_MIN_REQUESTS = 4


def dropped_hits(cached_tokens: int, requests_hit: int, block_size: int | None, prompt_tokens: int) -> dict[str, Any] | None:
    """What the EAGLE block drop cost the prefix cache, at least: every request that hit lost its last matched block
    (``block_size`` tokens); a request whose only matched block was dropped reads as a miss and is not counted,
    so this is a lower bound. A finding's evidence when the lost tokens are ``DROPPED_HITS_SHARE`` of the hits."""
    if not block_size or requests_hit < DROPPED_HITS_MIN_REQUESTS:
        return None
    lost = requests_hit * block_size
    share = lost / (cached_tokens + lost)
    if share < DROPPED_HITS_SHARE:
        return None
    return {"requests_hit": requests_hit, "cached_tokens": cached_tokens, "block_size": block_size,
            "lost_tokens_at_least": lost, "share_of_hits_lost": round(share, 4), "prompt_tokens": prompt_tokens,
            "hit_rate": round(cached_tokens / prompt_tokens, 4) if prompt_tokens else None,
            "hit_rate_without_drop_at_least": round((cached_tokens + lost) / prompt_tokens, 4) if prompt_tokens else None,
            "vllm_rule": "vllm.config.speculative.SpeculativeConfig.use_eagle_block_drop; "
                         "vllm.v1.core.single_type_kv_cache_manager (drop_eagle_block)"}


def dropped_hits_finding(evidence: dict[str, Any], method: str | None) -> Finding:
    return codes.finding(
        codes.PREFIX_HITS_DROPPED,
        severity="warning",
        model_role="draft",
        message=f"the {method or 'EAGLE-family'} drafter costs the prefix cache at least {evidence['share_of_hits_lost']:.0%} "
        f"of its hits: vLLM drops the last matched block ({evidence['block_size']} tokens) of every hit so the drafter can "
        f"recompute its state; {evidence['requests_hit']} requests restored {evidence['cached_tokens']} tokens and lost at "
        f"least {evidence['lost_tokens_at_least']} (hit rate {evidence['hit_rate']:.1%}, without the drop at least "
        f"{evidence['hit_rate_without_drop_at_least']:.1%}; vllm#33270, #51769)",
        evidence=evidence,
        fix='try "disable_eagle_block_drop": true in --speculative-config and compare acceptance (vllm#53670: '
        "149.6 -> 241.9 tok/s, acceptance unchanged), or a smaller KV-cache block size",
    )
