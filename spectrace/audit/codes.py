"""The finding codes: one entry per code spectrace emits (code, severities, meaning, fix), and ``CAUSES``:
the failures seen in the field that they name, with where each was reported.

Every ``Finding`` is built with one of the constants below, never a bare string;
docs/reference/codes.md is generated from ``REGISTRY``
(``python -m tools.docs_reference``) and the PromQL code lists
(``spectrace.dashboards.promql``) are read from it, so a new code, or a changed
meaning, reaches the docs and the dashboards from here. A code is stable once
released: dashboards, alert rules and stored findings name it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spectrace.audit.findings import Finding

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Code:
    code: str
    component: str  # the Finding.component of every finding with this code
    severities: tuple[str, ...]  # every severity it is emitted at, the root cause's first
    severity_text: str  # the docs' severity line: when which severity
    meaning: str
    fix: str

    def finding(
        self,
        severity: str | None = None,
        *,
        model_role: str | None,
        message: str,
        evidence: dict[str, Any] | None = None,
        fix: str | None = None,
        caused_by: str | None = None,
    ) -> Finding:
        """A finding with this code: its component from here; its severity one this code declares (the root
        cause's when not given); its fix this code's unless the caller names a more concrete one (the value to
        set, the flag to pass), or ``""`` for a consequence whose root's fix is the fix."""
        severity = self.severities[0] if severity is None else severity
        if severity not in self.severities:
            raise ValueError(f"{self.code} is not emitted at severity {severity!r} (declared: {self.severities})")
        return Finding(
            code=self.code,
            severity=severity,
            component=self.component,
            model_role=model_role,
            message=message,
            evidence=evidence if evidence is not None else {},
            fix=self.fix if fix is None else fix,
            caused_by=caused_by,
        )


REGISTRY: dict[str, Code] = {}


def _code(code: str, component: str, severities: tuple[str, ...], severity_text: str, meaning: str, fix: str) -> str:
    assert code not in REGISTRY and set(severities) <= set(SEVERITIES), code
    REGISTRY[code] = Code(code, component, severities, severity_text, meaning, fix)
    return code


def finding(code: str, severity: str | None = None, **fields: Any) -> Finding:
    """``REGISTRY[code].finding(...)``: every finding spectrace emits is built here."""
    return REGISTRY[code].finding(severity, **fields)


def codes(*, component: str | None = None, severity: str | None = None) -> tuple[str, ...]:
    """The registered codes of ``component`` that can be emitted at ``severity``, in registry order."""
    return tuple(
        c.code
        for c in REGISTRY.values()
        if (component is None or c.component == component) and (severity is None or severity in c.severities)
    )


# -- config: declared vs resolved
SWA_DROPPED = _code(
    "SWA_DROPPED", "config", ("error", "warning"),
    "error (warning when vLLM runs the target's same window anyway: a `draft_model` drafter)",
    "a declared sliding window or sliding layer that no layer gets after resolution",
    'add "use_sliding_window": true and an explicit "layer_types" list to config.json, '
    'or give the window as "dflash_config": {"swa_window_size": N}',
)
LAYER_TYPES_DEFAULTED = _code(
    "LAYER_TYPES_DEFAULTED", "config", ("warning", "info"),
    "warning (info when caused by `SWA_DROPPED`)",
    "`layer_types` absent and derived by transformers",
    'declare "layer_types" explicitly in config.json',
)
FIELD_DROPPED = _code(
    "FIELD_DROPPED", "config", ("warning", "info"),
    "warning (info when caused by another finding)",
    "an attention-relevant declared field vanished on resolution",
    "check why the field is lost on load",
)
FIELD_CHANGED = _code(
    "FIELD_CHANGED", "config", ("warning", "info"),
    "warning (info when caused by another finding)",
    "an attention-relevant declared field changed on resolution",
    "check why the field changes on load",
)
# -- layout: what runs
LAYOUT_MISMATCH = _code(
    "LAYOUT_MISMATCH", "layout", ("error", "info"),
    "error (info when caused by `SWA_DROPPED`)",
    "a layer's runtime type or window differs from its resolved or declared config",
    "check the vLLM version's support for this config's layer layout",
)
CAUSAL_INFERRED = _code(
    "CAUSAL_INFERRED", "layout", ("warning", "info"),
    "info: vLLM's fallback is the published drafters' convention, the config cannot say it is wrong; "
    "warning when acceptance collapses in the run (raised by `ACCEPTANCE_COLLAPSE`) or a probe measures a better "
    "reading (raised by `PROBE_BETTER_READING`)",
    "a DFlash drafter declares no causality (`is_causal`, `dflash_config.causal`) and vLLM's updater set none; vLLM "
    "chose per layer from `layer_types` (sliding causal, full not): live and in `doctor`",
    'declare how the drafter was trained: "dflash_config": {"causal": true|false} (or "is_causal")',
)
# -- the pair: method, vocabulary, context
METHOD_INFERRED = _code(
    "METHOD_INFERRED", "method", ("warning", "info"),
    "warning (info when caused by `METHOD_MISMATCH`)",
    "no method given; vLLM inferred it from the path",
    'pass "method" explicitly in --speculative-config',
)
METHOD_MISMATCH = _code(
    "METHOD_MISMATCH", "method", ("error", "info"),
    "error (info when caused by `METHOD_DOWNGRADED`)",
    "the drafter's architecture says DFlash / EAGLE3 / MTP, the method resolved to something else",
    'pass the method the architecture implies as "method" in --speculative-config',
)
METHOD_DOWNGRADED = _code(
    "METHOD_DOWNGRADED", "method", ("error",),
    "error",
    "vLLM builds the drafter its checkpoint declares (the algorithm in `speculators_model_type` / "
    "`speculators_config.algorithm` or the architecture) but runs a lesser method: an EAGLE-3 drafter as `eagle` "
    "(no hidden-state taps, its fc never runs), a DFlash2 drafter built as `DFlashDraftModel` (no candidate "
    "selector); from the architecture and model class vLLM resolved (live and in `doctor`)",
    "pass the method the drafter's algorithm names, or declare the architecture vLLM must build",
)
SYNTHETIC_ACCEPTANCE = _code(
    "SYNTHETIC_ACCEPTANCE", "method", ("warning",),
    "warning: meant for benchmarks, not a misconfiguration, but no acceptance number of the run says anything about "
    "the drafter; the acceptance alerts do not fire on a run that has it",
    "vLLM verifies with its synthetic rejection sampler (`rejection_sample_method: synthetic`, with "
    "`synthetic_acceptance_length` or `synthetic_acceptance_rates`): drafts are accepted at a drawn rate, not "
    "judged by the target; named before the first request (live and in `doctor`)",
    'remove "rejection_sample_method": "synthetic" from --speculative-config to measure the drafter',
)
VOCAB_MISMATCH = _code(
    "VOCAB_MISMATCH", "vocab", ("error",),
    "error",
    "draft and target vocabularies cannot line up",
    "use a drafter trained for this target's tokenizer",
)
DRAFT_CONTEXT_SHORT = _code(
    "DRAFT_CONTEXT_SHORT", "context", ("warning", "info"),
    "warning (dflash, mtp, draft_model: the drafter runs only up to its own context); info for eagle / eagle3, "
    "which vLLM runs up to the target's context on purpose (`_maybe_override_draft_max_position_embeddings`): "
    "acceptance past the boundary settles it (`CONTEXT_CLIFF`)",
    "the drafter's effective context is shorter than the target's",
    "give the drafter the target's rope scaling (e.g. the same YaRN factor) or cap --max-model-len",
)
# -- vLLM's refusals
LOAD_FAILED = _code(
    "LOAD_FAILED", "load", ("error", "info"),
    "error (info when caused)",
    "vLLM refused to build the model; explained in config terms when a finding accounts for it",
    "the caused_by finding's fix; else the model runner the error names, or vLLM's error",
)
# -- the live acceptance
ACCEPTANCE_COLLAPSE = _code(
    "ACCEPTANCE_COLLAPSE", "verification", ("error",),
    "error (`caused_by` the first likely cause the run's configs hold: a missing or wrong vocabulary map, weights "
    "not loaded, a lossy dtype, a dropped sliding window, a RoPE finding; all of them in `likely_causes`)",
    "live acceptance fell below the threshold",
    "check the run's findings (spectrace report): a dropped sliding window, wrong hidden-state taps "
    "or a mismatched drafter all look like this",
)
ACCEPTANCE_RECOVERED = _code(
    "ACCEPTANCE_RECOVERED", "verification", ("info",),
    "info (caused by `ACCEPTANCE_COLLAPSE`)",
    "live acceptance came back above the threshold",
    "",
)
# -- acceptance in time (spectrace.audit.rules.drift)
ACCEPTANCE_STEP_CHANGE = _code(
    "ACCEPTANCE_STEP_CHANGE", "verification", ("warning",),
    "warning (an `ACCEPTANCE_COLLAPSE` beside it when the new level is also below the floor)",
    "acceptance stepped down at a moment of the run and stayed down, against the run's own level for the same "
    "context ranges and draft positions; the evidence has when (`onset_ts_ns`), the rates before and after, and the "
    "requests that ran across the change (`carried_requests`: their own acceptance before and after shows it is the "
    "engine, not the requests' mix)",
    "look at what changed at that moment: a weight reload or update, a LoRA swap, a drafter or target redeployed, "
    "a cache reset, a configuration pushed to the fleet",
)
ACCEPTANCE_DECAY = _code(
    "ACCEPTANCE_DECAY", "verification", ("warning",),
    "warning",
    "acceptance declines steadily with time, not with the context or the draft position (the fit is stratified by "
    "both): the evidence has when the decline began (`onset_ts_ns`), its slope per hour, and the levels at its start "
    "and now",
    "look at what accumulates while the server runs: a cache or state that is never reset (prefix cache, drafter "
    "KV), memory fragmentation, a drift of the traffic's language or domain away from the drafter's training data; "
    "a restart that restores acceptance says it is state",
)
ACCEPTANCE_RESTORED = _code(
    "ACCEPTANCE_RESTORED", "verification", ("info",),
    "info (caused by `ACCEPTANCE_STEP_CHANGE` or `ACCEPTANCE_DECAY`)",
    "acceptance came back to its level before the step change or decay (`recovered_ts_ns`)",
    "",
)
# -- hidden-state taps
TAP_DEFAULTED = _code(
    "TAP_DEFAULTED", "taps", ("warning", "info"),
    "info when vLLM's fallback is the common trainers' default (2, N//2, N-3): right unless the drafter was trained "
    "otherwise; warning when the fallback is another (the target model overrides it), or when acceptance collapses "
    "in the run (raised by `ACCEPTANCE_COLLAPSE`), or a probe measures other taps better (raised by `PROBE_BETTER_READING`)",
    "the drafter declares no hidden-state layer ids; vLLM uses its default taps",
    "declare the ids the drafter was trained on (eagle_aux_hidden_state_layer_ids, or "
    "dflash_config.target_layer_ids for DFlash)",
)
TAP_MISMATCH = _code(
    "TAP_MISMATCH", "taps", ("error", "info"),
    "error (info when caused by `TAP_COUNT_MISMATCH`)",
    "the ids vLLM taps differ from the ones the drafter was trained on (same count: silent)",
    "declare the ids in a field this vLLM reads for this model runner, or upgrade vLLM",
)
TAP_COUNT_MISMATCH = _code(
    "TAP_COUNT_MISMATCH", "taps", ("error",),
    "error",
    "the number of taps differs from what the drafter's input projection takes",
    "declare the drafter's layer ids in a field this vLLM reads",
)
TAP_OUT_OF_RANGE = _code(
    "TAP_OUT_OF_RANGE", "taps", ("error",),
    "error",
    "a declared id outside the target's layers",
    "use a drafter trained for this target, or correct the declared layer ids",
)
TAP_CONVENTION = _code(
    "TAP_CONVENTION", "taps", ("error", "info"),
    "error when the producer is told from the checkpoint and vLLM reads its ids in another convention (then "
    "`TAP_MISMATCH` is info, caused by it); info when top-level `eagle_aux_hidden_state_layer_ids` are declared "
    "and who trained the drafter cannot be told (right for speculators and any trainer that taps with vLLM; one "
    "layer early for one trained through SGLang: acceptance at position 0, or `spectrace probe`, settles it)",
    "the drafter's tap ids are in its trainer's convention, told from what the checkpoint carries (speculators' "
    "`speculators_config`: vLLM ids; SpecForge's nested `eagle_config`: SGLang's, id L the output of layer L; the "
    "DFlash reference's `dflash_config`), and vLLM reads them in its own (tap k: the input of layer k)",
    "declare the ids in vLLM's convention as top-level eagle_aux_hidden_state_layer_ids (the finding's fix names them)",
)
# -- agreement: engine core vs workers, rank vs rank
VERIFY_DISAGREEMENT = _code(
    "VERIFY_DISAGREEMENT", "verification", ("error",),
    "error",
    "the engine core's accepted counts differ from what a worker verified (judged when a run is over; not for the "
    "last run of an engine that was killed, whose step in flight would read as a disagreement)",
    "the numbers vLLM reports are not what the device verified; report to vLLM",
)
RANK_DISAGREEMENT = _code(
    "RANK_DISAGREEMENT", "ranks", ("error",),
    "error",
    "two tensor-parallel ranks of one engine built a different layout or window, tap different layers, or verified "
    "different counts (from the store: `spectrace report`)",
    "every rank must build and verify the same model: check per-rank config overrides and the vLLM build on each "
    "device, and report to vLLM if the configs are identical",
)
# -- the acceptance curve
CONTEXT_CLIFF = _code(
    "CONTEXT_CLIFF", "verification", ("error", "warning"),
    "error (warning when a config finding explains it: `caused_by`)",
    "acceptance past a context boundary from the run's configs (a declared window, the drafter's "
    "`max_position_embeddings` or rope original length, the target's window) is under half of acceptance before it "
    "(≥ 100 drafted tokens each side, ≥ 20 % before)",
    "give the drafter the target's context (its max_position_embeddings, rope scaling and window), "
    "or cap --max-model-len at the boundary",
)
POSITION_CLIFF = _code(
    "POSITION_CLIFF", "verification", ("error",),
    "error",
    "position i accepts ≥ 20 % while position i+1 accepts under 5 % of what position i accepted (≥ 100 drafted each)",
    "check the drafter's taps and its drafting mode (parallel_drafting), or lower num_speculative_tokens",
)
DUMMY_DRAFTS = _code(
    "DUMMY_DRAFTS", "verification", ("error", "warning"),
    "error (warning caused by `DRAFT_CONTEXT_SHORT` when they are vLLM's length gate: token 0 for a whole batch once "
    "its longest context + k passes the drafter's max_model_len; caused by `DRAFT_VOCAB_MAP_MISSING`, "
    "`DRAFT_VOCAB_MAP_INVALID` or `DRAFT_WEIGHTS_UNLOADED` when the run has one: predictions on wrong ids)",
    "≥ 50 % of draft rows (≥ 50 rows of two or more drafts) are one token id repeated, the target rejects them "
    "(< 10 % accepted), and they are placeholders, not predictions: token 0 (what vLLM sends in place of drafts, "
    "and what constant logits give) in ≥ 50 % of the rows, or one and the same id in ≥ 90 % of the rows whatever "
    "the request; a drafter repeating wrong predictions (other ids in other rows) is left to the acceptance "
    "findings; counted in the background from the draft lists vLLM holds, no token id stored",
    "check the drafter's final norm and lm_head weights; for the length gate, give the drafter the target's context",
)
SPECULATION_NOT_PAYING = _code(
    "SPECULATION_NOT_PAYING", "verification", ("warning",),
    "warning",
    "the speed-up (the time a token takes without drafts over the time it takes at the k in force, with the step time "
    "without drafts fitted from the run: an estimate, not measured) is under 1 over the run's steps so far that verified drafts "
    "(≥ 50 worker steps; the window `spectrace report`, `top` and the gauge use)",
    "turn speculative decoding off for this traffic, lower num_speculative_tokens, or use a better drafter",
)
SPECULATION_K_BETTER = _code(
    "SPECULATION_K_BETTER", "verification", ("warning",),
    "warning (`spectrace report`, from the store)",
    "another number of speculative tokens k' (0: no speculation) pays ≥ 15 % more than the k in force, predicted by "
    "\"What k pays\" with the step times measured on this target and host (`step_source` `baseline`: a run without "
    "drafts in the store); the model's measured accuracy on CPU is ±15 % (BENCHMARKS.md), hence the margin",
    "set num_speculative_tokens to the k' named (per batch size: the entry of num_speculative_tokens_per_batch_size "
    "for the batch sizes the run served); k' = 0: turn speculative decoding off for this traffic",
)
# -- requests and the scheduler: slices the drafter cannot see, the token budget (#24)
SLICE_ACCEPTANCE_LOW = _code(
    "SLICE_ACCEPTANCE_LOW", "verification", ("warning",),
    "warning",
    "requests sharing one parameter value (a penalty, logit bias, bad words, allowed tokens, min-p, temperature band, "
    "top-p/top-k, a grammar, a LoRA adapter, a prefix-cache hit, a prompt-length band) accept under 75 % of the rest "
    "of the run's rate, the 95 % intervals apart (≥ 100 drafted tokens and ≥ 2 requests each side; a request-step's "
    "k drafts count as one trial); the drafter proposes without what the target verifies with",
    "for penalties, logit bias, bad words, allowed tokens, min-p: the drafter cannot see them, route such requests to "
    "an engine without speculative decoding or drop the parameter (`--generation-config vllm` where "
    "generation_config.json sets it); a LoRA adapter: a drafter for the adapter; a prefix-cache hit: reset the prefix cache",
)
THINKING_MODE_GAP = _code(
    "THINKING_MODE_GAP", "verification", ("warning",),
    "warning",
    "requests served with thinking on (or off) accept under 75 % of the other mode's rate, the 95 % intervals apart "
    "(the `thinking_mode` request slice: `chat_template_kwargs` `enable_thinking` / `thinking` / `thinking_mode`, "
    "else `--default-chat-template-kwargs`, else the rendered prompt's tail; ≥ 100 drafted tokens and ≥ 2 requests "
    "each side; a request-step's k drafts count as one trial): the drafter was likely trained in the other mode, "
    "which no checkpoint records",
    "serve with the thinking mode the drafter was trained in (`chat_template_kwargs` / "
    "`--default-chat-template-kwargs`), or retrain or choose a drafter trained on the mode you serve",
)
TOKEN_BUDGET_SHORT = _code(
    "TOKEN_BUDGET_SHORT", "scheduler", ("warning",),
    "warning",
    "`max_num_batched_tokens` is below `max_num_seqs` × (1 + k + the method's drafting slots): a full batch of decoding "
    "requests gets its drafts trimmed or leaves requests waiting (chunked prefill takes from the same budget); "
    "live and in `doctor`",
    "raise --max-num-batched-tokens to the product, or lower --max-num-seqs or num_speculative_tokens",
)
DRAFTS_UNVERIFIED = _code(
    "DRAFTS_UNVERIFIED", "scheduler", ("warning",),
    "warning (caused by `TOKEN_BUDGET_SHORT` when the budget rule holds for the run)",
    "≥ 10 % of the draft tokens the worker proposed never reached verification (≥ 500 proposed; each finished request's "
    "last proposal allowed): the scheduler trimmed them to its token budget; synchronous scheduling (the engine core's "
    "`Scheduler.update_draft_token_ids`)",
    "raise --max-num-batched-tokens (chunked prefill takes from the same budget), or lower num_speculative_tokens",
)
DYNAMIC_K_THRASHING = _code(
    "DYNAMIC_K_THRASHING", "scheduler", ("warning",),
    "warning",
    "dynamic speculation (`num_speculative_tokens_per_batch_size`) is configured and k switched between consecutive "
    "verified steps in ≥ 20 steps and ≥ 25 % of the run's verified steps: the batch sits on a threshold of the "
    "schedule, and drafts proposed at one k are trimmed or thrown away at the next (the k a step drafted: the most "
    "drafts one request got; counted in the background from the engine core's verified steps)",
    "widen or merge the schedule's ranges around the batch sizes where k flips, or set --max-num-seqs / "
    "--max-num-batched-tokens so the batch does not sit on the threshold, or use a static num_speculative_tokens",
)
PREFIX_HITS_DROPPED = _code(
    "PREFIX_HITS_DROPPED", "scheduler", ("warning",),
    "warning",
    "vLLM drops the last matched block of every prefix-cache hit for an EAGLE-family drafter (EAGLE, EAGLE3, MTP, "
    "DFlash), and that block is ≥ 25 % of what ≥ 4 hit requests would have restored (a lower bound: a one-block "
    "match dropped reads as a miss)",
    'try "disable_eagle_block_drop": true in --speculative-config and compare acceptance, or a smaller block size',
)
# -- the drafter's model: weights, RoPE, dtype (issue #24)
DRAFT_WEIGHTS_UNLOADED = _code(
    "DRAFT_WEIGHTS_UNLOADED", "weights", ("error",),
    "error",
    "drafter parameters that no checkpoint tensor reached at load (the names vLLM's loader returns, against the "
    "built drafter's parameters): they run with their initial values; vLLM's own check is off for quantized models "
    "and for drafters whose load_weights returns nothing (EAGLE3, DFlash)",
    "convert the drafter checkpoint again for this vLLM (the tensor names its load_weights expects), "
    "or use a checkpoint that has them",
)
DRAFT_TENSORS_UNUSED = _code(
    "DRAFT_TENSORS_UNUSED", "weights", ("warning", "info"),
    "warning (info next to `DRAFT_WEIGHTS_UNLOADED`)",
    "drafter checkpoint tensors (from the safetensors headers) that match no parameter vLLM loaded",
    "check the tensor names against the drafter class vLLM builds: mis-named or skipped tensors leave parameters "
    "at their initial values",
)
DRAFT_HEAD_REPLACED = _code(
    "DRAFT_HEAD_REPLACED", "weights", ("error", "warning"),
    "error when the drafter's own head has another shape than the target's (it cannot be a copy); warning when vLLM "
    "replaced a head of the same shape without comparing the two",
    "the drafter's checkpoint ships a head of its own (`lm_head.weight`) but the loaded drafter computes its logits "
    "with the target's `lm_head` module: the head it was trained with is unused (vLLM shares the target's head to "
    "save memory when the drafter has none, or when the two are equal; a proposer that shares it otherwise "
    "replaces a trained head)",
    "serve the drafter with its own head: on a vLLM or platform build that shares it regardless, report it there; "
    "until then, a checkpoint without `lm_head.weight` trained on the target's head is the one that matches",
)
ROPE_MISMATCH = _code(
    "ROPE_MISMATCH", "rope", ("error",),
    "error: the method's trainers build the drafter's RoPE from the target's (speculators and SpecForge DFlash, "
    "MTP), so a drafter declaring another misstates its training",
    "a dflash / mtp drafter, which reads the target's positions, rotates them differently: "
    "base, scaling type or factor, original length, partial rotary factor or NeoX/GPT-J layout (config, and the "
    "built rotary modules live)",
    "give the drafter the target's RoPE in its config.json (\"rope_parameters\", or \"rope_theta\" and "
    "\"rope_scaling\" for older readers)",
)
ROPE_DIFFERS = _code(
    "ROPE_DIFFERS", "rope", ("warning", "info"),
    "info: legitimate if trained so, which the configs cannot tell; warning when acceptance collapses in the run "
    "(raised by `ACCEPTANCE_COLLAPSE`) or a probe measures the target's base better (raised by `PROBE_BETTER_READING`)",
    "a `draft_model` drafter's RoPE, or an eagle / eagle3 drafter's (the EAGLE-3 reference trains it with a base of "
    "its own), differs from the target's: the first suspect when its acceptance collapses or falls with context",
    "if acceptance collapses or falls with context, give the drafter the target's RoPE or use one trained with it",
)
DRAFT_DTYPE_LOSSY = _code(
    "DRAFT_DTYPE_LOSSY", "dtype", ("error", "warning", "info"),
    "from the checkpoint's tensors: error (bfloat16 run in float16: overflow; warning for float32 → float16 and "
    "float16 → bfloat16); info when only config.json's dtype says so (often stale: the safetensors headers settle it)",
    "the drafter runs in a dtype it was not trained in (its checkpoint's tensors, else config.json's dtype), lossily; "
    "vLLM builds the draft config with the target's dtype",
    "run the target in the drafter's training dtype (--dtype), so the drafter gets it too",
)


# -- every drafter field (issue #35): declared vs what vLLM builds the drafter from; the vocabulary map
DRAFT_FIELD_DROPPED = _code(
    "DRAFT_FIELD_DROPPED", "config", ("error", "warning", "info"),
    "error when the field changes what the drafter computes (a norm, RoPE, a shape, its taps), warning for "
    "metadata; info when caused by `SWA_DROPPED`, a RoPE or a tap finding",
    "a field the drafter's config.json declares (top level, `transformer_layer_config`, `eagle_config`, "
    "`dflash_config`, `rope_parameters` / `rope_scaling`) is absent from the config vLLM builds the drafter from; "
    "evidence names the vLLM function that lost it",
    "declare the field where this vLLM reads it (the finding's fix names the place)",
)
DRAFT_FIELD_CHANGED = _code(
    "DRAFT_FIELD_CHANGED", "config", ("error", "warning", "info"),
    "error when the field changes what the drafter computes, warning for metadata; info when caused by another "
    "finding or changed by vLLM on purpose (`max_position_embeddings` raised to the target's context)",
    "a declared drafter field has another value in the config vLLM builds the drafter from",
    "declare the field where this vLLM reads it (the finding's fix names the place)",
)
DRAFT_FIELD_OVERRIDDEN = _code(
    "DRAFT_FIELD_OVERRIDDEN", "config", ("error", "warning", "info"),
    "error for a norm or another field that changes the drafter's arithmetic, warning for metadata; info when "
    "caused by another finding",
    "a speculators-format drafter declares a field inside `transformer_layer_config` and vLLM's algorithm updater "
    "overwrites it with its top-level default (`norm_before_fc`, `fc_norm`, `norm_output`, `norm_before_residual` "
    "are read from the top level only)",
    "declare the field at the top level of config.json, next to `speculators_model_type`",
)
DRAFT_FIELD_DEFAULT_DIFFERS = _code(
    "DRAFT_FIELD_DEFAULT_DIFFERS", "config", ("error", "warning", "info"),
    "error for a norm or another field that changes the drafter's arithmetic, warning for metadata; info when "
    "caused by another finding",
    "a speculators-format drafter leaves a field out (speculators writes with `to_diff_dict()`: its defaults are "
    "absent) and vLLM fills in a default that differs from the trainer's (`norm_before_residual`: vLLM True, "
    "speculators False)",
    "declare the trainer's value explicitly at the top level of config.json",
)
DRAFT_VOCAB_MAP_MISSING = _code(
    "DRAFT_VOCAB_MAP_MISSING", "weights", ("error",),
    "error",
    "the drafter's `draft_vocab_size` is below the target's vocabulary but its checkpoint carries no `d2t` map: "
    "vLLM's `draft_id_to_target_id` stays zero, so draft id i is scored as target id i and every draft lands "
    "on the first `draft_vocab_size` target tokens",
    "add the trainer's `d2t` (and `t2d`) tensors to the drafter checkpoint, or convert it again",
)
DRAFT_VOCAB_MAP_INVALID = _code(
    "DRAFT_VOCAB_MAP_INVALID", "weights", ("error", "warning"),
    "error for a `d2t` that maps draft ids wrongly (wrong dtype or length, offsets out of range, target ids "
    "written instead of offsets, all zero, two draft ids on one target); warning for a `t2d` that disagrees",
    "the drafter's vocabulary map is present but does not map draft ids onto distinct valid target ids "
    "(`target = i + d2t[i]`)",
    "regenerate `d2t` as offsets (`target_id - draft_id`, int64, one per draft id) and `t2d` as a boolean mask "
    "over the target vocabulary",
)
DRAFT_SETTING_IGNORED = _code(
    "DRAFT_SETTING_IGNORED", "config", ("error", "warning"),
    "error for an `--hf-overrides` RoPE or position field a drafter sharing the target's positions runs "
    "without; warning otherwise",
    "a setting asked for the drafter was accepted but the drafter does not run with it: "
    "`speculative_config.max_model_len` (the proposer uses the run's), `draft_tensor_parallel_size` (the "
    "drafter's layers are sharded with the run's), an `--hf-overrides` key (applied to the target only)",
    "set it where this vLLM applies it (the drafter's config.json for a model field); vLLM ignores it otherwise",
)
# -- measured: `spectrace probe` (#59)
PROBE_BETTER_READING = _code(
    "PROBE_BETTER_READING", "probe", ("warning",),
    "warning: measured on the pair itself (the same prompts served under each reading, greedy), never guessed; the "
    "doubt it settles (`ROPE_DIFFERS`, `TAP_DEFAULTED`, `CAUSAL_INFERRED`) is said again as a warning beside it "
    "(`evidence.raised_by = PROBE_BETTER_READING`)",
    "`spectrace probe` served the pair under another reading (a doctor fix, another set of taps, the target's RoPE "
    "base) and it accepted more than the served reading, beyond the 95 % interval of the difference (paired by "
    "prompt): the drafter was trained for that reading",
    "declare the winning reading in the drafter's config.json (the finding's fix names the fields and values)",
)

# -- causes seen in the field ---------------------------------------------------------------
# Silent failures reported in vLLM's, speculators' and others' trackers, each with the codes that name it
# (docs/reference/codes.md's "Causes spectrace names" and each code's entry are generated from these).


@dataclass(frozen=True)
class Cause:
    cause: str
    codes: tuple[str, ...]  # the registered codes that name it
    named_as: str  # how the docs print it: the codes, with the field or dimension where it shows
    reports: str  # where it was reported (Markdown links)


CAUSES: tuple[Cause, ...] = (
    Cause(
        "the seed: a DFlash drafter for Qwen3.6-27B accepted 1.1 % instead of 40 %+ — vLLM tapped the target's hidden "
        "states one layer off, built the drafter's sliding-window layers as full attention, and transformers' "
        "`Qwen3Config` had set `sliding_window` to `None` (`use_sliding_window` absent)",
        (TAP_MISMATCH, LAYOUT_MISMATCH, SWA_DROPPED),
        "`TAP_MISMATCH`, `LAYOUT_MISMATCH`, `SWA_DROPPED`",
        "the report spectrace was built from",
    ),
    Cause(
        "drafter parameters no checkpoint tensor reached (quantized MTP/drafter tensors skipped or mis-named; EAGLE3 and DFlash drafters, whose `load_weights` returns nothing to vLLM's check): they keep their `torch.empty` values, 0 % acceptance or mean length 1.00",
        (DRAFT_WEIGHTS_UNLOADED, DRAFT_TENSORS_UNUSED,),
        '`DRAFT_WEIGHTS_UNLOADED`, `DRAFT_TENSORS_UNUSED`',
        '[vllm#35548](https://github.com/vllm-project/vllm/issues/35548), [#37667](https://github.com/vllm-project/vllm/issues/37667), [#47091](https://github.com/vllm-project/vllm/issues/47091), [#49552](https://github.com/vllm-project/vllm/issues/49552), [#43455](https://github.com/vllm-project/vllm/issues/43455)',
    ),
    Cause(
        "a drafter's own `lm_head` (a 32,000-row draft head) overwritten by the target's at load: 25 % acceptance fell to 1.7 %",
        (DRAFT_HEAD_REPLACED,),
        '`DRAFT_HEAD_REPLACED` (`model_weights.lm_head`)',
        '[vllm-ascend#11374](https://github.com/vllm-project/vllm-ascend/issues/11374)',
    ),
    Cause(
        "the drafter's `embed_tokens` / `lm_head` kept or replaced by the target's through a weight-equality test that can differ per rank",
        (RANK_DISAGREEMENT,),
        '`model_weights.embed_tokens`, `.lm_head` per rank; `RANK_DISAGREEMENT`',
        '[vllm#27737](https://github.com/vllm-project/vllm/issues/27737), [#50158](https://github.com/vllm-project/vllm/issues/50158)',
    ),
    Cause(
        "a drafter that shares the target's positions (eagle, eagle3, dflash, mtp) rotating them differently: `rope_scaling` lost in conversion, base pinned to 10000, YaRN read as another schedule, NeoX vs GPT-J, `rope_theta` looked for outside `rope_parameters` (transformers 5)",
        (ROPE_MISMATCH,),
        '`ROPE_MISMATCH`',
        '[speculators#574](https://github.com/vllm-project/speculators/issues/574), [TensorRT-LLM#19036](https://github.com/NVIDIA/TensorRT-LLM/issues/19036)',
    ),
    Cause(
        'an independent `draft_model` drafter with another RoPE: legitimate, the first suspect when its acceptance collapses or falls with context',
        (ROPE_DIFFERS,),
        '`ROPE_DIFFERS` (info)',
        '[speculators#574](https://github.com/vllm-project/speculators/issues/574)',
    ),
    Cause(
        "a drafter trained in bfloat16 run in the target's float16 (vLLM builds the draft config with the target's dtype): overflow, 0 % acceptance",
        (DRAFT_DTYPE_LOSSY,),
        '`DRAFT_DTYPE_LOSSY`',
        '[vllm#55250](https://github.com/vllm-project/vllm/issues/55250)',
    ),
    Cause(
        'request penalties, logit bias, bad words, allowed tokens, min-p (and `generation_config.json` defaults) the drafter proposes without',
        (SLICE_ACCEPTANCE_LOW,),
        '`SLICE_ACCEPTANCE_LOW`',
        '[vllm#18902](https://github.com/vllm-project/vllm/issues/18902), [vllm#19482](https://github.com/vllm-project/vllm/issues/19482), [vllm#34497](https://github.com/vllm-project/vllm/issues/34497), [sglang#33643](https://github.com/sgl-project/sglang/issues/33643)',
    ),
    Cause(
        'a LoRA adapter applied to the target only; a grammar the drafter does not follow',
        (SLICE_ACCEPTANCE_LOW,),
        '`SLICE_ACCEPTANCE_LOW`',
        '#24',
    ),
    Cause(
        'a drafter trained with thinking on served with thinking off, or the reverse (no checkpoint records its training mode)',
        (THINKING_MODE_GAP,),
        '`THINKING_MODE_GAP`',
        '[z-lab/dflash#60](https://github.com/z-lab/dflash/issues/60), [z-lab/dflash#133](https://github.com/z-lab/dflash/issues/133)',
    ),
    Cause(
        'the EAGLE-family block drop: the last matched block of every prefix-cache hit dropped so the drafter can recompute its state (large blocks on hybrid targets: hit rate near 0)',
        (PREFIX_HITS_DROPPED,),
        '`PREFIX_HITS_DROPPED`',
        '[vllm#33270](https://github.com/vllm-project/vllm/issues/33270), [vllm#51769](https://github.com/vllm-project/vllm/issues/51769), [vllm#53670](https://github.com/vllm-project/vllm/issues/53670)',
    ),
    Cause(
        'stale drafter KV for prefix-cache-restored tokens (cache hits accept below misses)',
        (SLICE_ACCEPTANCE_LOW,),
        '`SLICE_ACCEPTANCE_LOW` (dimension `prefix_cache`)',
        '[vllm#47930](https://github.com/vllm-project/vllm/issues/47930), [vllm#41838](https://github.com/vllm-project/vllm/issues/41838)',
    ),
    Cause(
        '`max_num_batched_tokens` below `max_num_seqs × (1 + k)` (plus drafting slots; chunked prefill shares it)',
        (TOKEN_BUDGET_SHORT,),
        '`TOKEN_BUDGET_SHORT`',
        '[vllm#49548](https://github.com/vllm-project/vllm/issues/49548), [vllm#44815](https://github.com/vllm-project/vllm/issues/44815)',
    ),
    Cause(
        'drafts proposed but trimmed by the scheduler, never verified',
        (DRAFTS_UNVERIFIED,),
        '`DRAFTS_UNVERIFIED`',
        '[vllm#49548](https://github.com/vllm-project/vllm/issues/49548), [vllm#44815](https://github.com/vllm-project/vllm/issues/44815)',
    ),
    Cause(
        'dynamic speculation (`num_speculative_tokens_per_batch_size`) thrashing at a schedule threshold: k flips between consecutive steps, drafts proposed at one k are trimmed at the next, serving slower while acceptance is healthy',
        (DYNAMIC_K_THRASHING,),
        '`DYNAMIC_K_THRASHING` (`step_shapes.k_switches`)',
        '[vllm#49548](https://github.com/vllm-project/vllm/issues/49548), [vllm#44815](https://github.com/vllm-project/vllm/issues/44815)',
    ),
    Cause(
        'a number of speculative tokens that pays clearly less than another (too many drafts for the acceptance, or for the batch: the best k falls as the batch grows)',
        (SPECULATION_K_BETTER,),
        '`SPECULATION_K_BETTER` (`spectrace report`, "What k pays" by batch size)',
        '[vllm#44336](https://github.com/vllm-project/vllm/issues/44336), [vllm#48627](https://github.com/vllm-project/vllm/issues/48627), [sglang#21599](https://github.com/sgl-project/sglang/issues/21599), [llm-d#2074](https://github.com/llm-d/llm-d/issues/2074) (#26)',
    ),
    Cause(
        "drafter fields vLLM drops or replaces on the way to the drafter: `norm_before_fc`, `fc_norm`, `norm_output` "
        "declared where vLLM does not read them, `norm_before_residual` defaulted to True against speculators' False, "
        "`rope_scaling` lost by a converter",
        (DRAFT_FIELD_DROPPED, DRAFT_FIELD_CHANGED, DRAFT_FIELD_OVERRIDDEN, DRAFT_FIELD_DEFAULT_DIFFERS),
        "`DRAFT_FIELD_DROPPED`, `DRAFT_FIELD_CHANGED`, `DRAFT_FIELD_OVERRIDDEN`, `DRAFT_FIELD_DEFAULT_DIFFERS` (`config_fields`)",
        "[vllm#38111](https://github.com/vllm-project/vllm/issues/38111), [vllm#46488](https://github.com/vllm-project/vllm/issues/46488), [vllm#52816](https://github.com/vllm-project/vllm/issues/52816), [speculators#574](https://github.com/vllm-project/speculators/issues/574), [speculators#706](https://github.com/vllm-project/speculators/issues/706), [speculators#613](https://github.com/vllm-project/speculators/issues/613), [speculators#649](https://github.com/vllm-project/speculators/issues/649), [speculators#921](https://github.com/vllm-project/speculators/issues/921) (#35)",
    ),
    Cause(
        "an EAGLE-3 drafter with a reduced vocabulary whose `d2t` map is missing or wrong: draft ids land on the first N target tokens, acceptance collapses",
        (DRAFT_VOCAB_MAP_MISSING, DRAFT_VOCAB_MAP_INVALID),
        "`DRAFT_VOCAB_MAP_MISSING`, `DRAFT_VOCAB_MAP_INVALID`",
        "[NeMo-Automodel#2447](https://github.com/NVIDIA-NeMo/Automodel/pull/2447), [verl-SpeCo#66](https://github.com/verl-project/verl-SpeCo/pull/66), [SpecForge#534](https://github.com/sgl-project/SpecForge/pull/534) (#35)",
    ),
    Cause(
        "EAGLE-3 taps guessed as `(2, N//2, N-3)` when the checkpoint declares no ids (Llama-3.3-70B-Eagle3: 1.21 % acceptance against 58.9 %)",
        (TAP_DEFAULTED,),
        "`TAP_DEFAULTED` (`hidden_state_taps.status` = defaulted)",
        "[vllm#50170](https://github.com/vllm-project/vllm/issues/50170) (#35)",
    ),
    Cause(
        "a method silently downgraded: an EAGLE-3 checkpoint served as `eagle` skips its fc and accepts exactly "
        "1.00 tokens a step; DFlash2's architecture rewritten to `DFlashDraftModel`, which skips its candidate selector",
        (METHOD_DOWNGRADED,),
        "`METHOD_DOWNGRADED` (evidence `declared_algorithm`, `built_architecture`, `model_class`, `method`)",
        "[sglang#21272](https://github.com/sgl-project/sglang/issues/21272), "
        "[vllm#52816](https://github.com/vllm-project/vllm/issues/52816) (#58)",
    ),
    Cause(
        "synthetic acceptance: `rejection_sample_method: synthetic` with `synthetic_acceptance_length` makes every "
        "acceptance number fake (SGLang's `SGLANG_SIMULATE_ACC_LEN` and TensorRT-LLM's "
        "`TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS` are the same knob in those engines; vLLM reads neither)",
        (SYNTHETIC_ACCEPTANCE,),
        "`SYNTHETIC_ACCEPTANCE` (the acceptance alerts are held off)",
        "[vllm#38045](https://github.com/vllm-project/vllm/issues/38045) (#58)",
    ),
    Cause(
        "a SpecForge EAGLE-3 drafter declares its taps in SGLang's convention (`eagle_config."
        "eagle_aux_hidden_state_layer_ids`, id L the output of layer L) and vLLM reads them verbatim as its own (tap k "
        "the input of layer k): one layer early on every tap, position-0 acceptance about 10 % where 45 % is expected "
        "(V1 reads the nested ids; V2 does not and taps its default, whose last tap is one layer early for "
        "SpecForge's gpt-oss-20B drafter)",
        (TAP_CONVENTION, TAP_MISMATCH),
        "`TAP_CONVENTION` (evidence `producer`, `ids_to_declare`), `TAP_MISMATCH`",
        "[vllm#43671](https://github.com/vllm-project/vllm/issues/43671), [SpecForge configs/gpt-oss-20B-eagle3.json]"
        "(https://github.com/sgl-project/SpecForge/blob/a6b6b02/configs/gpt-oss-20B-eagle3.json) (#58)",
    ),
    Cause(
        "acceptance that changes with time, not with the request: it falls to 0 % after the server has run a while "
        "(vllm-ascend), or steps down at a reload, a LoRA swap or a cache reset; the collapse detector compares "
        "against an absolute floor, not the run's own level, and says nothing of when",
        (ACCEPTANCE_DECAY, ACCEPTANCE_STEP_CHANGE, ACCEPTANCE_RESTORED),
        "`ACCEPTANCE_DECAY`, `ACCEPTANCE_STEP_CHANGE` (evidence `onset_ts_ns`, `carried_requests`), then "
        "`ACCEPTANCE_RESTORED`",
        "[vllm-ascend#10118](https://github.com/vllm-project/vllm-ascend/issues/10118) (#58)",
    ),
    Cause(
        "draft settings accepted and never applied: `speculative_config.max_model_len` a no-op in V1 (20–73 k-token "
        "documents fall to 5–8 %), `draft_tensor_parallel_size` ignored, `--hf-overrides` (YaRN) not reaching an MTP drafter",
        (DRAFT_SETTING_IGNORED,),
        "`DRAFT_SETTING_IGNORED`",
        "[vllm#52258](https://github.com/vllm-project/vllm/issues/52258), [vllm#31886](https://github.com/vllm-project/vllm/issues/31886), [vllm#58080](https://github.com/vllm-project/vllm/issues/58080) (#35)",
    ),
)
