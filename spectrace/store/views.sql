-- Derived views over the recorded tables. Each block starts with "-- view: NAME".
-- Rates divide accepted by drafted at the same position (vLLM divides by the
-- number of drafts, which is biased when draft length varies).

-- view: acceptance_by_position
SELECT run_id, position,
       sum(drafted) AS drafted,
       sum(accepted) AS accepted,
       CASE WHEN sum(drafted) > 0 THEN sum(accepted) / sum(drafted) END AS rate
FROM verify_counts
WHERE source = 'engine_core'
GROUP BY run_id, position
ORDER BY run_id, position;

-- view: acceptance_by_context
SELECT run_id, context_bucket, position,
       sum(drafted) AS drafted,
       sum(accepted) AS accepted,
       CASE WHEN sum(drafted) > 0 THEN sum(accepted) / sum(drafted) END AS rate
FROM verify_counts
WHERE source = 'engine_core'
GROUP BY run_id, context_bucket, position
ORDER BY run_id, context_bucket, position;

-- view: acceptance_by_context_range
SELECT run_id, context_range, position,
       sum(drafted) AS drafted,
       sum(accepted) AS accepted,
       CASE WHEN sum(drafted) > 0 THEN sum(accepted) / sum(drafted) END AS rate
FROM verify_counts
WHERE source = 'engine_core' AND context_range IS NOT NULL
GROUP BY run_id, context_range, position
ORDER BY run_id, context_range, position;

-- view: speculation_cost
-- The speed-up estimate (README, "Does speculation pay?"): L * no_draft / step, where
-- no_draft fits each step's verification time as a + b * scheduled tokens and prices the
-- same steps at one token per request (spectrace.audit.rules.acceptance.no_draft_step_ns).
WITH s AS (
    SELECT run_id, rank,
           sum(steps)::DOUBLE AS n, sum(step_ns)::DOUBLE AS step_ns, sum(draft_ns)::DOUBLE AS draft_ns,
           sum(request_steps)::DOUBLE AS request_steps, sum(tokens)::DOUBLE AS tokens,
           sum(scheduled_tokens)::DOUBLE AS t, sum(scheduled_tokens_sq) AS t2,
           sum(tokens_x_verify_ns) AS tv, sum(requests)::DOUBLE AS r
    FROM speculation_steps
    WHERE steps > 0
    GROUP BY run_id, rank
), fit AS (
    SELECT *, step_ns - draft_ns AS v, n * t2 - t * t AS spread,
           CASE WHEN n * t2 - t * t > 1e-9 * greatest(n * t2, 1)
                THEN (n * tv - t * (step_ns - draft_ns)) / (n * t2 - t * t) END AS b
    FROM s
), priced AS (  -- an intercept below 0 (a slope too steep for noisy times): the fit through the origin
    SELECT *, CASE WHEN b IS NULL OR b < 0 THEN v
                   WHEN v - b * t < 0 AND t2 > 0 THEN tv / t2 * r
                   ELSE greatest(n * ((v - b * t) / n) + b * r, 0) END AS no_draft_ns
    FROM fit
)
SELECT run_id, rank,
       n::BIGINT AS steps,
       step_ns / n / 1e6 AS step_ms,
       draft_ns / n / 1e6 AS draft_ms,
       v / n / 1e6 AS verify_ms,
       no_draft_ns / n / 1e6 AS no_draft_ms,
       CASE WHEN request_steps > 0 THEN tokens / request_steps END AS mean_acceptance_length,
       CASE WHEN request_steps > 0 AND step_ns > 0 THEN tokens / request_steps * no_draft_ns / step_ns END AS speedup_estimate
FROM priced
ORDER BY run_id, rank;

-- view: acceptance_by_slice
-- Acceptance per request slice (spectrace.audit.rules.slices.request_slice: a penalty, logit bias, temperature band,
-- prefix-cache hit, prompt-length band, ...): run x dimension x value, the rest of the same run beside it.
-- Complete counts (request_counts); requests without a request_slices row are left out.
WITH req AS (
    SELECT run_id, request_id, any_value("slice") AS s
    FROM request_slices
    GROUP BY run_id, request_id
), joined AS (
    SELECT c.run_id, c.request_id, sum(c.drafted) AS drafted, sum(c.accepted) AS accepted, any_value(r.s) AS s
    FROM request_counts c
    JOIN req r USING (run_id, request_id)
    GROUP BY c.run_id, c.request_id
), per AS (
    SELECT run_id, d AS dimension, s::JSON ->> d AS value,
           count(*) AS requests, sum(drafted) AS drafted, sum(accepted) AS accepted
    FROM joined, unnest(json_keys(s::JSON)) AS u(d)
    GROUP BY run_id, d, s::JSON ->> d
), whole AS (
    SELECT run_id, count(*) AS requests, sum(drafted) AS drafted, sum(accepted) AS accepted
    FROM joined
    GROUP BY run_id
)
SELECT p.run_id, p.dimension, p.value, p.requests, p.drafted, p.accepted,
       CASE WHEN p.drafted > 0 THEN p.accepted / p.drafted END AS rate,
       w.requests - p.requests AS rest_requests,
       w.drafted - p.drafted AS rest_drafted,
       CASE WHEN w.drafted > p.drafted THEN (w.accepted - p.accepted) / (w.drafted - p.drafted) END AS rest_rate
FROM per p
JOIN whole w USING (run_id)
ORDER BY p.run_id, p.dimension, p.value;

-- view: prefix_cache_hits
-- Per run: requests with drafts, their prompt tokens and the tokens the prefix cache restored. With an
-- EAGLE-family drafter vLLM drops the last matched block of every hit: each hit request lost at least
-- block_size tokens (a one-block match dropped reads as a miss, so this is a lower bound).
SELECT run_id,
       count(*) AS requests,
       count(*) FILTER (WHERE cached_tokens > 0) AS requests_hit,
       sum(prompt_tokens) AS prompt_tokens,
       sum(cached_tokens) AS cached_tokens,
       CASE WHEN sum(prompt_tokens) > 0 THEN sum(cached_tokens) / sum(prompt_tokens) END AS token_hit_rate,
       any_value(block_size) AS block_size,
       bool_or(eagle_block_drop) AS eagle_block_drop,
       CASE WHEN bool_or(eagle_block_drop)
            THEN count(*) FILTER (WHERE cached_tokens > 0) * any_value(block_size) ELSE 0 END AS dropped_tokens_at_least,
       CASE WHEN sum(prompt_tokens) > 0 THEN
            (sum(cached_tokens) + CASE WHEN bool_or(eagle_block_drop)
                                       THEN count(*) FILTER (WHERE cached_tokens > 0) * any_value(block_size) ELSE 0 END)
            / sum(prompt_tokens) END AS token_hit_rate_without_drop_at_least
FROM (SELECT run_id, request_id, any_value(prompt_tokens) AS prompt_tokens, any_value(cached_tokens) AS cached_tokens,
             any_value(block_size) AS block_size, any_value(eagle_block_drop) AS eagle_block_drop
      FROM request_slices GROUP BY run_id, request_id)
GROUP BY run_id
ORDER BY run_id;

-- view: speedup_baseline
-- What k pays, measured step costs (spectrace.audit.rules.speedup.Baseline): per run at k and batch-size band ('all', then each
-- band the run ran: spectrace.bands, rendered in), its decode-only steps at k
-- (lowest worker rank) whose batch size steps without drafts of the same target model on the same host (any run)
-- also measured; sums over those steps of the no-draft mean step time at their batch size (plain_ns), of their own
-- verification (step less drafting) and drafting times, and how many no-draft steps measured them. chunk_ns and
-- decode_ns split the run's whole worker time at every batch size it decoded at k (chunk_steps): what its steps
-- with a prefill chunk cost beyond a decode step of the same batch size at k (steps that verified nothing: all of
-- it), and every step priced as that decode step.
WITH k_run AS (
    SELECT run_id, max(position) + 1 AS k FROM verify_counts WHERE source = 'engine_core' GROUP BY run_id
), target AS (
    SELECT run_id, any_value(target_model) AS target_model FROM runs GROUP BY run_id
), lowest AS (
    SELECT run_id, min(coalesce(rank, -1)) AS r FROM decode_steps GROUP BY run_id
), mine AS (
    SELECT d.run_id, d.requests, any_value(d.host) AS host, sum(d.steps)::DOUBLE AS n,
           sum(d.step_ns - d.draft_ns)::DOUBLE AS v, sum(d.draft_ns)::DOUBLE AS dr
    FROM decode_steps d
    JOIN lowest l ON d.run_id = l.run_id AND coalesce(d.rank, -1) = l.r
    JOIN k_run k ON d.run_id = k.run_id AND d.drafts = k.k
    GROUP BY d.run_id, d.requests
), chunks AS (
    SELECT c.run_id, c.requests,
           coalesce(sum(c.steps) FILTER (WHERE c.verified), 0)::DOUBLE AS cn,
           coalesce(sum(c.step_ns) FILTER (WHERE c.verified), 0)::DOUBLE AS ct,
           coalesce(sum(c.step_ns) FILTER (WHERE NOT c.verified), 0)::DOUBLE AS cu
    FROM chunk_steps c
    JOIN lowest l ON c.run_id = l.run_id AND coalesce(c.rank, -1) = l.r
    JOIN k_run k ON c.run_id = k.run_id
    GROUP BY c.run_id, c.requests
), sized AS (
    SELECT run_id, requests, m.host, m.n, m.v, m.dr,
           CASE WHEN m.n > 0 THEN coalesce(c.ct - c.cn * (m.v + m.dr) / m.n, 0) ELSE 0 END + coalesce(c.cu, 0) AS chunk,
           CASE WHEN m.n > 0 THEN (m.n + coalesce(c.cn, 0)) * (m.v + m.dr) / m.n ELSE 0 END AS dec,
           {{batch_band(requests)}} AS band
    FROM mine m FULL JOIN chunks c USING (run_id, requests)
), plain AS (
    SELECT t.target_model, d.host, d.requests, sum(d.steps) AS n, sum(d.step_ns - d.draft_ns)::DOUBLE / sum(d.steps) AS b
    FROM decode_steps d JOIN target t USING (run_id)
    WHERE d.drafts = 0
    GROUP BY ALL
), matched AS (
    SELECT s.*, p.b, p.n AS pn
    FROM sized s
    JOIN target t ON t.run_id = s.run_id
    LEFT JOIN plain p ON p.requests = s.requests AND p.host IS NOT DISTINCT FROM s.host AND p.target_model = t.target_model
                     AND s.n > 0
)
SELECT run_id, coalesce(band, 'all') AS batch_band, sum(n) FILTER (WHERE b IS NOT NULL) AS steps,
       sum(n * b) AS plain_ns, sum(v) FILTER (WHERE b IS NOT NULL) AS verify_ns,
       sum(dr) FILTER (WHERE b IS NOT NULL) AS draft_ns, sum(pn)::BIGINT AS baseline_steps,
       greatest(sum(chunk), 0) AS chunk_ns, sum(dec) AS decode_ns
FROM matched
GROUP BY GROUPING SETS ((run_id), (run_id, band))
HAVING sum(n) FILTER (WHERE b IS NOT NULL) > 0
ORDER BY run_id, batch_band;

-- view: request_spec_decode
-- Per request, in the field's schema: vLLM's per-request speculative metrics (--per-request-spec-decode-metrics,
-- RequestSpecDecodeMetrics.to_dict: its names and meanings; spectrace needs no vLLM flag), with what the request
-- really emitted beside what the verifier accepted, the ids the user sees, its slice and its run's findings.
--   acceptance_histogram[j]: the request's verify steps that accepted j drafts (dense, j = 0 .. k);
--   num_spec_steps = sum(h); num_accepted_draft_tokens = sum(j * h[j]); draft_acceptance_rate: drafts only;
--   mean_acceptance_length: accepted + 1 per step (with the bonus token), as vLLM reports it;
--   emitted_tokens: tokens those steps emitted (a step that stopped the request, by EOS, max_tokens or a stop
--   token, emitted fewer than it accepted + 1); emitted_per_step: what the steps gave the user per step.
-- output_tokens (the frontend's, after stop strings) = emitted_tokens + the tokens of the request's steps
-- without drafts (its first token, steps where it drafted nothing) - what a stop string cut.
WITH counts AS (
    SELECT run_id, request_id, sum(request_steps) AS num_spec_steps, sum(drafted) AS num_draft_tokens,
           sum(accepted) AS num_accepted_draft_tokens, sum(emitted) AS emitted_tokens,
           max(json_array_length(histogram)) AS width
    FROM request_counts
    GROUP BY run_id, request_id
), parts AS (
    SELECT run_id, request_id, generate_subscripts(h, 1) - 1 AS j, unnest(h) AS n
    FROM (SELECT run_id, request_id, histogram::BIGINT[] AS h FROM request_counts WHERE histogram IS NOT NULL)
), hist AS (
    SELECT run_id, request_id, j, sum(n) AS n FROM parts GROUP BY ALL
), k AS (
    SELECT run_id, max(num_speculative_tokens) AS k FROM runs GROUP BY run_id
), dense AS (
    SELECT c.run_id, c.request_id, unnest(range(greatest(coalesce(k.k, 0) + 1, coalesce(c.width, 0))::BIGINT)) AS j
    FROM counts c LEFT JOIN k USING (run_id)
), histograms AS (
    SELECT d.run_id, d.request_id, list(coalesce(h.n, 0) ORDER BY d.j) AS acceptance_histogram
    FROM dense d LEFT JOIN hist h USING (run_id, request_id, j)
    GROUP BY d.run_id, d.request_id
), outputs AS (
    SELECT request_id, any_value(external_request_id) AS external_request_id, any_value(choice_index) AS choice_index,
           any_value(output_tokens) AS output_tokens,
           any_value(finish_reason) AS finish_reason, any_value(vllm_spec_decode) AS vllm_spec_decode
    FROM request_outputs
    GROUP BY request_id
), slices AS (
    SELECT run_id, request_id, any_value("slice") AS "slice" FROM request_slices GROUP BY run_id, request_id
), run_findings AS (
    SELECT run_id, list(DISTINCT code ORDER BY code) AS run_findings
    FROM findings WHERE severity IN ('error', 'warning') AND caused_by IS NULL
    GROUP BY run_id
)
SELECT c.run_id, c.request_id, o.external_request_id, o.choice_index,
       k.k AS num_spec_tokens,
       h.acceptance_histogram,
       c.num_spec_steps,
       c.num_accepted_draft_tokens,
       c.num_draft_tokens,
       CASE WHEN c.num_spec_steps > 0 THEN 1 + c.num_accepted_draft_tokens / c.num_spec_steps ELSE 1.0 END
           AS mean_acceptance_length,
       CASE WHEN c.num_draft_tokens > 0 THEN c.num_accepted_draft_tokens / c.num_draft_tokens ELSE 0.0 END
           AS draft_acceptance_rate,
       c.emitted_tokens,
       CASE WHEN c.num_spec_steps > 0 THEN c.emitted_tokens / c.num_spec_steps END AS emitted_per_step,
       o.output_tokens,
       o.finish_reason,
       s."slice",
       f.run_findings,
       o.vllm_spec_decode
FROM counts c
LEFT JOIN k USING (run_id)
LEFT JOIN histograms h USING (run_id, request_id)
LEFT JOIN outputs o USING (request_id)
LEFT JOIN slices s USING (run_id, request_id)
LEFT JOIN run_findings f USING (run_id)
ORDER BY c.run_id, c.request_id;

-- view: request_thinking
-- Each request with drafts, its thinking mode and where it was read: the chat request's chat_template_kwargs
-- (kwarg), else the server's --default-chat-template-kwargs (default), both read by the API server (chat_requests,
-- joined by the response id); else the rendered prompt's tail against the reasoning parser's think markers
-- (prompt_tail, engine core: request_slices); else unknown (none). Complete counts (request_counts).
WITH chat AS (
    SELECT o.request_id, any_value(c.thinking_mode) AS thinking_mode, any_value(c.thinking_source) AS thinking_source
    FROM chat_requests c
    JOIN (SELECT DISTINCT request_id, external_request_id FROM request_outputs) o USING (external_request_id)
    GROUP BY o.request_id
), tail AS (
    SELECT run_id, request_id, any_value(thinking_mode) AS thinking_mode, any_value(thinking_source) AS thinking_source
    FROM request_slices
    GROUP BY run_id, request_id
), counted AS (
    SELECT run_id, request_id, sum(drafted) AS drafted, sum(accepted) AS accepted
    FROM request_counts
    GROUP BY run_id, request_id
)
SELECT c.run_id, c.request_id,
       coalesce(ch.thinking_mode, t.thinking_mode, 'unknown') AS thinking_mode,
       coalesce(ch.thinking_source, t.thinking_source, 'none') AS thinking_source,
       c.drafted, c.accepted
FROM counted c
LEFT JOIN chat ch USING (request_id)
LEFT JOIN tail t USING (run_id, request_id)
ORDER BY c.run_id, c.request_id;

-- view: acceptance_by_thinking
-- Per run: acceptance by thinking mode (kind 'mode': requests, and the sources their modes were read from) and by
-- the phase each verify step was drafted in (kind 'phase': reasoning or answer, where a reasoning parser's think
-- markers are known; request-steps). THINKING_MODE_GAP compares the values of each kind.
SELECT run_id, 'mode' AS kind, thinking_mode AS value,
       string_agg(DISTINCT thinking_source, ',' ORDER BY thinking_source) AS sources,
       count(*) AS requests, NULL::BIGINT AS request_steps, sum(drafted) AS drafted, sum(accepted) AS accepted,
       CASE WHEN sum(drafted) > 0 THEN sum(accepted) / sum(drafted) END AS rate
FROM request_thinking
GROUP BY run_id, thinking_mode
UNION ALL
SELECT run_id, 'phase', phase, NULL, NULL, sum(request_steps), sum(drafted), sum(accepted),
       CASE WHEN sum(drafted) > 0 THEN sum(accepted) / sum(drafted) END
FROM thinking_phases
GROUP BY run_id, phase
ORDER BY run_id, kind, value;
