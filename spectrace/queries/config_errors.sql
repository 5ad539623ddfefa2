-- Error findings: where vLLM resolved the target or drafter differently from what the checkpoint declares,
-- with the evidence and the fix. The SQL twin of the SpectraceConfigError alert.
WITH run AS (
    SELECT run_id, any_value(target_model) AS target_model, any_value(draft_model) AS draft_model
    FROM runs
    GROUP BY run_id
)
SELECT f.run_id, r.target_model, r.draft_model, f.model_role, f.code, f.component, f.message, f.fix, f.evidence, f.ts
FROM findings f
LEFT JOIN run r USING (run_id)
WHERE f.severity = 'error'
ORDER BY f.ts, f.run_id, f.code;
