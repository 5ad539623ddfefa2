-- Hidden-state tap findings: the drafter is fed target layers other than the ones it declares
-- (TAP_MISMATCH, TAP_CONVENTION, TAP_COUNT_MISMATCH, TAP_OUT_OF_RANGE). The SQL twin of the SpectraceTapMismatch alert.
WITH run AS (
    SELECT run_id, any_value(target_model) AS target_model, any_value(draft_model) AS draft_model,
           any_value(method) AS method
    FROM runs
    GROUP BY run_id
)
SELECT f.run_id, r.target_model, r.draft_model, r.method, f.code, f.severity, f.message, f.evidence, f.fix, f.ts
FROM findings f
LEFT JOIN run r USING (run_id)
WHERE f.code IN ('TAP_MISMATCH', 'TAP_CONVENTION', 'TAP_COUNT_MISMATCH', 'TAP_OUT_OF_RANGE')
  AND f.severity = 'error'
ORDER BY f.ts, f.run_id, f.code;
