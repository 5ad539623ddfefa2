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
-- same steps at one token per request (spectrace.acceptance.no_draft_step_ns).
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
), priced AS (
    SELECT *, CASE WHEN b IS NULL OR b < 0 THEN v
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
