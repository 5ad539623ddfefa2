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
