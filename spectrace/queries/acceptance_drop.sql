-- Runs whose acceptance is below half of their deployment's baseline: the acceptance of the other runs
-- of the same target, drafter and method started in the 24 hours before (at least 200 drafted tokens on
-- each side). The SQL twin of the SpectraceAcceptanceDrop alert. Runs verified by vLLM's synthetic rejection
-- sampler (SYNTHETIC_ACCEPTANCE) are neither judged nor a baseline: their acceptance is drawn.
WITH run AS (
    SELECT run_id, any_value(target_model) AS target_model, any_value(draft_model) AS draft_model,
           any_value(method) AS method, min(started_at) AS started_at
    FROM runs
    GROUP BY run_id
), totals AS (
    SELECT r.run_id, r.target_model, r.draft_model, r.method, r.started_at,
           sum(a.drafted) AS drafted, sum(a.accepted) AS accepted
    FROM acceptance_by_position a
    JOIN run r USING (run_id)
    WHERE NOT EXISTS (SELECT 1 FROM findings s WHERE s.run_id = r.run_id AND s.code = 'SYNTHETIC_ACCEPTANCE')
    GROUP BY r.run_id, r.target_model, r.draft_model, r.method, r.started_at
)
SELECT t.run_id, t.target_model, t.draft_model, t.method, t.started_at, t.drafted,
       round(t.accepted / t.drafted, 4) AS rate,
       round(sum(b.accepted) / sum(b.drafted), 4) AS baseline_rate,
       round((t.accepted / t.drafted) / (sum(b.accepted) / sum(b.drafted)), 4) AS of_baseline,
       count(*) AS baseline_runs
FROM totals t
JOIN totals b
  ON b.run_id <> t.run_id
 AND b.target_model IS NOT DISTINCT FROM t.target_model
 AND b.draft_model IS NOT DISTINCT FROM t.draft_model
 AND b.method IS NOT DISTINCT FROM t.method
 AND b.started_at >= t.started_at - INTERVAL 24 HOUR
 AND b.started_at < t.started_at
WHERE t.drafted >= 200
GROUP BY t.run_id, t.target_model, t.draft_model, t.method, t.started_at, t.drafted, t.accepted
HAVING sum(b.drafted) >= 200
   AND t.accepted / t.drafted < 0.5 * sum(b.accepted) / sum(b.drafted)
ORDER BY t.started_at, t.run_id;
