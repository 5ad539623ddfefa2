-- Acceptance per run and draft position (engine-core counts): accepted / drafted tokens at each position,
-- with the run's target, drafter, method and k. What the dashboards' "acceptance by position" shows.
WITH run AS (
    SELECT run_id, any_value(target_model) AS target_model, any_value(draft_model) AS draft_model,
           any_value(method) AS method, any_value(num_speculative_tokens) AS k, min(started_at) AS started_at
    FROM runs
    GROUP BY run_id
)
SELECT a.run_id, r.target_model, r.draft_model, r.method, r.k, a.position, a.drafted, a.accepted,
       round(a.rate, 4) AS rate
FROM acceptance_by_position a
LEFT JOIN run r USING (run_id)
ORDER BY r.started_at, a.run_id, a.position;
