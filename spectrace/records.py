"""The record model: every table spectrace writes, with its columns and types.

Writers (``spectrace.pipeline`` and its sinks) and readers (``spectrace.store``, ``spectrace.lake``) both use
these definitions, so a column exists in exactly one place. Each Parquet segment
carries ``schema_version``; readers accept segments of every older version
(missing columns read as NULL).

Types are DuckDB type names; ``JSON`` columns are stored as strings.
"""

from __future__ import annotations

SCHEMA_VERSION = 1

# Every record carries who wrote it.
COMMON: list[tuple[str, str]] = [
    ("run_id", "VARCHAR"),
    ("process_role", "VARCHAR"),
    ("pid", "BIGINT"),
    ("host", "VARCHAR"),
    ("rank", "INTEGER"),
    ("schema_version", "INTEGER"),
]

TABLES: dict[str, list[tuple[str, str]]] = {
    # One row per engine start (one config resolution), written by the frontend.
    "runs": [
        ("started_at", "TIMESTAMP_NS"),
        ("vllm_version", "VARCHAR"),
        ("spectrace_version", "VARCHAR"),
        ("target_model", "VARCHAR"),
        ("draft_model", "VARCHAR"),
        ("method", "VARCHAR"),
        ("method_inferred", "BOOLEAN"),
        ("num_speculative_tokens", "INTEGER"),
        ("model_runner", "VARCHAR"),
        ("trace_id", "VARCHAR"),
    ],
    # The meaning of the OpenTelemetry Collector ClickHouse exporter's otel_traces.
    "spans": [
        ("trace_id", "VARCHAR"),
        ("span_id", "VARCHAR"),
        ("parent_span_id", "VARCHAR"),
        ("name", "VARCHAR"),
        ("kind", "VARCHAR"),
        ("service_name", "VARCHAR"),
        ("start_time", "TIMESTAMP_NS"),
        ("end_time", "TIMESTAMP_NS"),
        ("status_code", "VARCHAR"),
        ("status_message", "VARCHAR"),
        ("attributes", "JSON"),
        ("resource_attributes", "JSON"),
        ("events", "JSON"),
        ("links", "JSON"),
    ],
    # Which vLLM callables spectrace hooked in this process, and which it could not.
    "hooks": [
        ("ts", "TIMESTAMP_NS"),
        ("hook", "VARCHAR"),
        ("target", "VARCHAR"),
        ("status", "VARCHAR"),  # installed | missing | unsupported | retired | elsewhere (another process's hook)
        ("detail", "VARCHAR"),
        ("vllm_version", "VARCHAR"),
        ("supported_versions", "VARCHAR"),
    ],
    # Segments removed to keep the store under SPECTRACE_MAX_MB.
    "store_evictions": [
        ("ts", "TIMESTAMP_NS"),
        ("evicted_run_id", "VARCHAR"),
        ("segments", "BIGINT"),  # files removed
        ("bytes", "BIGINT"),
        ("reason", "VARCHAR"),  # max_mb (the run's files) | retention (its files older than SPECTRACE_RETENTION)
    ],
    # Exceptions raised inside spectrace's own hooks (vLLM went on).
    "internal_errors": [
        ("ts", "TIMESTAMP_NS"),
        ("hook", "VARCHAR"),
        ("error", "VARCHAR"),
        ("count", "BIGINT"),
    ],
    # Raw and resolved config per model (the config-resolution step).
    "model_configs": [
        ("ts", "TIMESTAMP_NS"),
        ("model_role", "VARCHAR"),  # target | draft
        ("model", "VARCHAR"),
        ("declared", "JSON"),
        ("transformers_class", "VARCHAR"),
        ("transformers_resolved", "JSON"),
        ("vllm_class", "VARCHAR"),
        ("vllm_resolved", "JSON"),
        ("error", "VARCHAR"),
    ],
    # Field by field: declared vs resolved.
    "config_fields": [
        ("model_role", "VARCHAR"),
        ("field", "VARCHAR"),
        ("declared", "JSON"),
        ("resolved", "JSON"),
        ("status", "VARCHAR"),  # ok | dropped | changed | defaulted
    ],
    # Per attention layer: declared vs resolved vs runtime.
    "attention_layout": [
        ("model_role", "VARCHAR"),
        ("layer_index", "INTEGER"),
        ("layer_name", "VARCHAR"),
        ("declared_type", "VARCHAR"),
        ("declared_window", "INTEGER"),
        ("resolved_type", "VARCHAR"),
        ("resolved_window", "INTEGER"),
        ("runtime_type", "VARCHAR"),
        ("runtime_window", "INTEGER"),
        ("kv_cache_spec", "VARCHAR"),
        ("causal", "BOOLEAN"),
        ("process", "VARCHAR"),
    ],
    "findings": [
        ("ts", "TIMESTAMP_NS"),
        ("code", "VARCHAR"),
        ("severity", "VARCHAR"),  # error | warning | info
        ("component", "VARCHAR"),
        ("model_role", "VARCHAR"),
        ("message", "VARCHAR"),
        ("evidence", "JSON"),
        ("fix", "VARCHAR"),
        ("caused_by", "VARCHAR"),
    ],
    # Which target layers the drafter was trained on vs which ones vLLM taps.
    "hidden_state_taps": [
        ("model_role", "VARCHAR"),
        ("declared_field", "VARCHAR"),
        ("declared_ids", "JSON"),
        ("expected_ids", "JSON"),
        ("tapped_ids", "JSON"),
        ("input_taps", "INTEGER"),
        ("status", "VARCHAR"),
        ("capture_point", "VARCHAR"),  # what tap k captures (the input of layer k, pre-norm), from the target's model code
    ],
    # One row per request-step with drafts (sampled by SPECTRACE_STEP_SAMPLE).
    "verify_steps": [
        ("ts", "TIMESTAMP_NS"),
        ("step", "BIGINT"),
        ("request_id", "VARCHAR"),
        ("context_len", "BIGINT"),
        ("num_drafted", "INTEGER"),
        ("num_accepted", "INTEGER"),
        ("num_emitted", "INTEGER"),  # tokens the step emitted for the request: num_accepted + 1, less where it stopped
        ("greedy", "BOOLEAN"),
        ("structured_output", "BOOLEAN"),
        ("draft_token_ids", "JSON"),  # only with SPECTRACE_RECORD_TOKENS=1
    ],
    # Complete per-position counts, aggregated per flush (never sampled).
    "verify_counts": [
        ("ts", "TIMESTAMP_NS"),
        ("source", "VARCHAR"),  # engine_core | worker
        ("position", "INTEGER"),
        ("context_bucket", "VARCHAR"),
        ("context_range", "VARCHAR"),  # the bucket split at the run's own boundaries (context_boundaries)
        ("drafted", "BIGINT"),
        ("accepted", "BIGINT"),
    ],
    # Context lengths where a model of the run changes behaviour, from its configs (engine core).
    "context_boundaries": [
        ("ts", "TIMESTAMP_NS"),
        ("tokens", "BIGINT"),
        ("model_role", "VARCHAR"),
        ("field", "VARCHAR"),  # sliding_window, max_position_embeddings, ...
    ],
    # Per flush: draft rows (two or more drafts) and those that are one token id repeated.
    "draft_shapes": [
        ("ts", "TIMESTAMP_NS"),
        ("rows", "BIGINT"),
        ("repeated_rows", "BIGINT"),
        ("repeated_drafted", "BIGINT"),
        ("repeated_accepted", "BIGINT"),
    ],
    # Per flush and worker rank: host time of the steps that verified drafts, drafting's
    # share, and the tokens they yielded (accepted + 1 per request-step).
    "speculation_steps": [
        ("ts", "TIMESTAMP_NS"),
        ("steps", "BIGINT"),
        ("step_ns", "BIGINT"),
        ("draft_ns", "BIGINT"),
        ("request_steps", "BIGINT"),
        ("tokens", "BIGINT"),
        # the sums that fit verification time as affine in scheduled tokens (acceptance.no_draft_step_ns)
        ("scheduled_tokens", "BIGINT"),
        ("scheduled_tokens_sq", "DOUBLE"),
        ("tokens_x_verify_ns", "DOUBLE"),
        ("requests", "BIGINT"),
    ],
    # Acceptance length (accepted + 1) histogram per flush, request-steps with drafts.
    "acceptance_lengths": [
        ("ts", "TIMESTAMP_NS"),
        ("source", "VARCHAR"),
        ("length", "INTEGER"),
        ("count", "BIGINT"),
    ],
    # One row per request with drafts (engine core, at its first verified step): the parameters that
    # change what the target verifies, no prompt text and no token id (spectrace.vllm_objects.requests).
    "request_slices": [
        ("ts", "TIMESTAMP_NS"),
        ("request_id", "VARCHAR"),
        ("temperature", "DOUBLE"),
        ("top_p", "DOUBLE"),
        ("top_k", "INTEGER"),
        ("min_p", "DOUBLE"),
        ("repetition_penalty", "DOUBLE"),
        ("presence_penalty", "DOUBLE"),
        ("frequency_penalty", "DOUBLE"),
        ("logit_bias_tokens", "INTEGER"),  # how many tokens the logit bias names
        ("allowed_tokens", "INTEGER"),
        ("bad_words", "INTEGER"),
        ("structured_output", "VARCHAR"),  # json | regex | choice | grammar | json_object | structural_tag
        ("lora_adapter", "VARCHAR"),
        ("prompt_tokens", "BIGINT"),
        ("cached_tokens", "BIGINT"),  # restored from the prefix cache (local + external)
        ("thinking_mode", "VARCHAR"),  # on | off | NULL (unknown): spectrace.audit.rules.thinking
        ("thinking_source", "VARCHAR"),  # kwarg | default | prompt_tail: where the mode was read
        ("generation_defaults", "JSON"),  # fields whose value is generation_config.json's default
        ("slice", "JSON"),  # dimension -> the request's banded value (spectrace.audit.rules.slices.request_slice)
        ("block_size", "INTEGER"),  # the KV cache's block size
        ("eagle_block_drop", "BOOLEAN"),  # vLLM dropped the last matched block of a hit (EAGLE-family drafters)
    ],
    # Per flush and request (engine core, complete): request-steps with drafts, drafted, accepted.
    "request_counts": [
        ("ts", "TIMESTAMP_NS"),
        ("request_id", "VARCHAR"),
        ("request_steps", "BIGINT"),
        ("drafted", "BIGINT"),
        ("accepted", "BIGINT"),
        ("emitted", "BIGINT"),  # tokens these steps emitted: accepted + steps, less what a stop cut (EOS, max_tokens)
        ("histogram", "JSON"),  # request-steps by accepted drafts, dense from 0 (vLLM's acceptance_histogram)
    ],
    # Per flush (engine core, where a reasoning parser's think markers are known): the verify steps by the phase
    # each was drafted in: reasoning (inside a think block) or answer (spectrace.audit.rules.thinking.PhaseTracker).
    "thinking_phases": [
        ("ts", "TIMESTAMP_NS"),
        ("phase", "VARCHAR"),  # reasoning | answer
        ("request_steps", "BIGINT"),
        ("drafted", "BIGINT"),
        ("accepted", "BIGINT"),
    ],
    # Once per chat completion of a speculating run (API server: OpenAIServingChat): the request's thinking mode as
    # its chat_template_kwargs set it, or as the server's --default-chat-template-kwargs did. Only the mode and the
    # key's name are kept, never a kwarg's other values. Joined to the engine's requests by the response id.
    "chat_requests": [
        ("ts", "TIMESTAMP_NS"),
        ("external_request_id", "VARCHAR"),  # chatcmpl-…: the response's id (request_outputs.external_request_id)
        ("thinking_mode", "VARCHAR"),  # on | off
        ("thinking_source", "VARCHAR"),  # kwarg | default
        ("thinking_key", "VARCHAR"),  # enable_thinking | thinking | thinking_mode
    ],
    # Once per finished request of a speculating run (frontend: vLLM's OutputProcessor): the ids the user sees,
    # the tokens they got, and vLLM's own per-request speculative metrics where --per-request-spec-decode-metrics
    # kept them. Joined to request_counts by the engine's request_id (view request_spec_decode).
    "request_outputs": [
        ("ts", "TIMESTAMP_NS"),
        ("request_id", "VARCHAR"),  # the engine's: vLLM's internal id (the user's and a random suffix)
        ("external_request_id", "VARCHAR"),  # the client's: the OpenAI response's id (cmpl-…, no per-prompt suffix)
        ("choice_index", "INTEGER"),  # the client's choice index in that response (n>1, several prompts)
        ("output_tokens", "BIGINT"),  # tokens the user got (after stop strings)
        ("finish_reason", "VARCHAR"),
        ("vllm_spec_decode", "JSON"),  # vLLM's RequestSpecDecodeMetrics.to_dict(), where it kept them
    ],
    # Per flush (engine core, synchronous scheduling): draft tokens the worker proposed
    # (Scheduler.update_draft_token_ids) and draft tokens the scheduled steps verified.
    "draft_budget": [
        ("ts", "TIMESTAMP_NS"),
        ("proposed", "BIGINT"),
        ("verified", "BIGINT"),
        ("steps", "BIGINT"),  # steps that verified drafts
        ("new_requests", "BIGINT"),  # requests whose first verified step was in this flush
    ],
    # Per flush (engine core): the steps that verified drafts by batch-size band (requests with drafts in the
    # step) and the k they drafted (the most drafts one request got): dynamic speculation
    # (num_speculative_tokens_per_batch_size) changes k with the batch, the token budget trims it.
    "step_shapes": [
        ("ts", "TIMESTAMP_NS"),
        ("batch_band", "VARCHAR"),
        ("k", "INTEGER"),
        ("steps", "BIGINT"),
        ("request_steps", "BIGINT"),
        ("drafted", "BIGINT"),
        ("accepted", "BIGINT"),
        # of these steps, those whose run's previous verified step drafted another k (NULL: written before
        # spectrace counted switches)
        ("k_switches", "BIGINT"),
    ],
    # Per flush (engine core) and batch-size band (requests with drafts in the step): drafted and accepted
    # tokens per draft position, as verify_counts has them per context range: "What k pays" by load.
    "band_positions": [
        ("ts", "TIMESTAMP_NS"),
        ("batch_band", "VARCHAR"),
        ("position", "INTEGER"),
        ("drafted", "BIGINT"),
        ("accepted", "BIGINT"),
    ],
    # Per flush and worker rank: decode-only steps by shape (every request scheduled 1 + drafts tokens, no
    # prefill chunk), with or without drafts: the step-cost table "What k pays" prices other k with. A run
    # without speculation measures drafts = 0, which a run at k never schedules (spectrace.audit.rules.speedup).
    "decode_steps": [
        ("ts", "TIMESTAMP_NS"),
        ("requests", "INTEGER"),
        ("drafts", "INTEGER"),  # per request
        ("steps", "BIGINT"),
        ("step_ns", "BIGINT"),
        ("draft_ns", "BIGINT"),
    ],
    # Per flush and worker rank: the other steps, those that carried a prefill chunk, by batch size and whether
    # they verified drafts: what a run spends beside its decode-only steps, which "What k pays" holds fixed
    # when it prices another k (spectrace.audit.rules.speedup: the run's whole worker time, not its decode steps alone).
    "chunk_steps": [
        ("ts", "TIMESTAMP_NS"),
        ("requests", "INTEGER"),
        ("verified", "BOOLEAN"),  # the step verified drafts (its decode requests carried them)
        ("steps", "BIGINT"),
        ("step_ns", "BIGINT"),
        ("draft_ns", "BIGINT"),
        ("scheduled_tokens", "BIGINT"),
    ],
    # Per flush, run and process role (engine_core, frontend): the host time a step takes outside the worker — the
    # engine core's Scheduler.schedule + update_from_output, the frontend's OutputProcessor.process_outputs (one
    # engine step's chunks joined) — with the sums that fit it as affine in the tokens the step emitted: what k pays
    # prices it beside the worker's step (spectrace.audit.rules.speedup.HostCost; issue #36).
    "host_steps": [
        ("ts", "TIMESTAMP_NS"),
        ("steps", "BIGINT"),
        ("host_ns", "BIGINT"),
        ("tokens", "BIGINT"),
        ("tokens_sq", "DOUBLE"),
        ("tokens_x_ns", "DOUBLE"),
    ],
    # Per model and rank, after load: its checkpoint (safetensors headers only), what vLLM loaded into it,
    # whose embeddings and head the drafter uses, the dtype and RoPE it runs with (issue #24).
    "model_weights": [
        ("model_role", "VARCHAR"),
        ("model", "VARCHAR"),
        ("checkpoint_files", "INTEGER"),
        ("checkpoint_tensors", "INTEGER"),
        ("checkpoint_dtypes", "JSON"),  # safetensors dtype -> tensor count
        ("manifest_error", "VARCHAR"),
        ("manifest_ms", "DOUBLE"),  # time spent reading the headers
        ("quantization", "VARCHAR"),
        ("parameters", "INTEGER"),
        ("loaded", "INTEGER"),  # parameters vLLM's loader says it filled (NULL: not captured)
        ("unloaded", "JSON"),  # parameter names no checkpoint tensor reached (shared modules excluded)
        ("unused_tensors", "JSON"),  # checkpoint tensors matching no loaded parameter
        ("embed_tokens", "VARCHAR"),  # own | target (the drafter's, per rank)
        ("lm_head", "VARCHAR"),
        ("declared_dtype", "VARCHAR"),
        ("runtime_dtype", "VARCHAR"),
        ("declared_rope", "JSON"),
        ("runtime_rope", "JSON"),
    ],
    # One row per reading a `spectrace probe` served (or skipped): the same prompts, greedy, a fixed token budget,
    # under the served reading and each candidate (a doctor fix, a tap set, the target's RoPE base), with vLLM's
    # per-request counters summed and a 95 % interval from the per-request spread (issue #59). run_id: the served
    # reading's traced run (else the probe's id); candidate_run_id: the candidate's own.
    "probes": [
        ("ts", "TIMESTAMP_NS"),
        ("probe_id", "VARCHAR"),  # the rows of one probe
        ("candidate", "VARCHAR"),  # served | fix CODE | taps [..] | rope BASE | causal true|false
        ("kind", "VARCHAR"),  # served | fix | taps | rope | causal
        ("source", "VARCHAR"),  # the finding code whose fix or doubt proposed it
        ("reading", "VARCHAR"),  # what the verdict says when it wins: "trained on taps [1, 2, 3]"
        ("patch", "JSON"),  # the change to the drafter's config.json (a scratch copy)
        ("taps", "JSON"),  # the vLLM tap ids it serves (served and taps candidates)
        ("status", "VARCHAR"),  # ok | failed | crashed | skipped
        ("error", "VARCHAR"),
        ("candidate_run_id", "VARCHAR"),
        ("target_model", "VARCHAR"),
        ("draft_model", "VARCHAR"),
        ("method", "VARCHAR"),
        ("num_speculative_tokens", "INTEGER"),
        ("prompts", "INTEGER"),
        ("max_tokens", "INTEGER"),
        ("drafted", "BIGINT"),
        ("accepted", "BIGINT"),
        ("acceptance", "DOUBLE"),  # accepted / drafted over every request
        ("acceptance_low", "DOUBLE"),  # its 95 % interval (ratio estimator over requests, Student t)
        ("acceptance_high", "DOUBLE"),
        ("per_position", "JSON"),  # share of steps whose i-th draft was accepted
        ("mean_acceptance_length", "DOUBLE"),  # tokens per verification step, the bonus token included
        ("tokens_per_s", "DOUBLE"),  # output tokens / generate wall time (eager engine: not production speed)
        ("delta", "DOUBLE"),  # acceptance minus the served reading's
        ("delta_half_width", "DOUBLE"),  # of delta's 95 % interval, paired by prompt
        ("best", "BOOLEAN"),  # the reading that accepts best
        ("verdict", "VARCHAR"),  # the probe's verdict, on every row
    ],
}

JSON_COLUMNS = {
    (table, name) for table, cols in TABLES.items() for name, kind in cols if kind == "JSON"
}


def columns(table: str) -> list[tuple[str, str]]:
    """All columns of ``table``: common columns first, then the table's own."""
    own = TABLES[table]
    own_names = {name for name, _ in own}
    return [c for c in COMMON if c[0] not in own_names] + own
