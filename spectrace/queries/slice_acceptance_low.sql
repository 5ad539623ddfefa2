-- Request slices that accept far below the rest of their run: under 75 % of the rest's rate, with at least
-- 100 drafted tokens and 2 requests on each side. The SQL twin of SLICE_ACCEPTANCE_LOW (which also asks
-- the 95 % intervals to lie apart: spectrace.audit.rules.slices.slice_gap).
SELECT run_id, dimension, value, requests, drafted, accepted, round(rate, 4) AS rate,
       rest_requests, rest_drafted, round(rest_rate, 4) AS rest_rate
FROM acceptance_by_slice
WHERE value <> 'unknown'
  AND drafted >= 100 AND rest_drafted >= 100
  AND requests >= 2 AND rest_requests >= 2
  AND rate < 0.75 * rest_rate
ORDER BY run_id, rate / rest_rate, dimension;
