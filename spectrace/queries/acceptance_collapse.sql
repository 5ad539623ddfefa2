-- Runs whose acceptance collapsed: position-0 or overall acceptance below 10 % with at least 200
-- drafted tokens (whole-run engine-core counts). The SQL twin of the SpectraceAcceptanceCollapse alert;
-- collapse_findings counts the live detector's ACCEPTANCE_COLLAPSE findings for the run. A run verified by vLLM's
-- synthetic rejection sampler (SYNTHETIC_ACCEPTANCE) is left out: its acceptance is drawn, not the drafter's.
WITH run AS (
    SELECT run_id, any_value(target_model) AS target_model, any_value(draft_model) AS draft_model,
           any_value(method) AS method, any_value(num_speculative_tokens) AS k
    FROM runs
    GROUP BY run_id
), per_run AS (
    SELECT run_id,
           sum(drafted) AS drafted,
           sum(accepted) AS accepted,
           sum(drafted) FILTER (WHERE position = 0) AS drafted_position_0,
           sum(accepted) FILTER (WHERE position = 0) AS accepted_position_0
    FROM acceptance_by_position
    GROUP BY run_id
)
SELECT p.run_id, r.target_model, r.draft_model, r.method, r.k, p.drafted,
       round(p.accepted_position_0 / p.drafted_position_0, 4) AS position_0_rate,
       round(p.accepted / p.drafted, 4) AS overall_rate,
       (SELECT count(*) FROM findings f WHERE f.run_id = p.run_id AND f.code = 'ACCEPTANCE_COLLAPSE') AS collapse_findings
FROM per_run p
LEFT JOIN run r USING (run_id)
WHERE p.drafted >= 200
  AND NOT EXISTS (SELECT 1 FROM findings s WHERE s.run_id = p.run_id AND s.code = 'SYNTHETIC_ACCEPTANCE')
  AND (p.accepted_position_0 / p.drafted_position_0 < 0.1 OR p.accepted / p.drafted < 0.1)
ORDER BY overall_rate, p.run_id;
