-- Runs whose acceptance stepped down or decays in time: each ACCEPTANCE_STEP_CHANGE or ACCEPTANCE_DECAY, when it
-- began, the rates before and after, and when it was restored (NULL: not restored). The live detector's findings
-- (spectrace.audit.rules.drift), with the requests that ran across the change (their own rates before and after:
-- the engine changed, not the requests); restored_at is the run's next ACCEPTANCE_RESTORED. The SQL twin of the
-- SpectraceAcceptanceShifted alert.
SELECT f.run_id,
       f.code,
       json_extract_string(f.evidence, '$.onset') AS onset,
       CAST(json_extract(f.evidence, '$.rate_before') AS DOUBLE) AS rate_before,
       CAST(json_extract(f.evidence, '$.rate_after') AS DOUBLE) AS rate_after,
       CAST(json_extract(f.evidence, '$.carried_requests') AS BIGINT) AS carried_requests,
       CAST(json_extract(f.evidence, '$.carried_rate_before') AS DOUBLE) AS carried_rate_before,
       CAST(json_extract(f.evidence, '$.carried_rate_after') AS DOUBLE) AS carried_rate_after,
       (SELECT min(r.ts) FROM findings r
        WHERE r.run_id = f.run_id AND r.code = 'ACCEPTANCE_RESTORED' AND r.ts >= f.ts) AS restored_at
FROM findings f
WHERE f.code IN ('ACCEPTANCE_STEP_CHANGE', 'ACCEPTANCE_DECAY')
ORDER BY f.ts, f.run_id;
