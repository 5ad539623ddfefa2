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
-- The speed-up estimate (README, "Does speculation pay?"): L * (step - draft) / step.
SELECT run_id, rank,
       sum(steps) AS steps,
       sum(step_ns) / sum(steps) / 1e6 AS step_ms,
       sum(draft_ns) / sum(steps) / 1e6 AS draft_ms,
       (sum(step_ns) - sum(draft_ns)) / sum(steps) / 1e6 AS verify_ms,
       CASE WHEN sum(request_steps) > 0 THEN sum(tokens) / sum(request_steps) END AS mean_acceptance_length,
       CASE WHEN sum(request_steps) > 0 AND sum(step_ns) > 0
            THEN sum(tokens) / sum(request_steps) * (sum(step_ns) - sum(draft_ns)) / sum(step_ns) END AS speedup_estimate
FROM speculation_steps
WHERE steps > 0
GROUP BY run_id, rank
ORDER BY run_id, rank;
