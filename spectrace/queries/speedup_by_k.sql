-- What k pays: per run, k' = 0 .. k (the k in force), context range ('all', then each of the run's
-- ranges) and batch-size band ('all', then each band the run verified at: acceptance and step costs of the steps
-- at that batch size, spectrace.audit.rules.acceptance.BATCH_BANDS), the expected accepted length at k' (exact from the per-position counts: a request-step that
-- accepted j of k drafts accepts min(j, k') of k'), the step time at k' (verification priced per scheduled
-- token, drafting per draft position, one pass for dflash), the host time per step outside the worker at k' (engine
-- core and frontend, host_steps: affine in the tokens a step emits), the tokens a request-step really gives at k'
-- (emitted_length: L less what stops cut, a request's prefill step counted; request_counts, request_outputs) and
-- the speed-up over decoding without drafts, per token given.
-- The SQL twin of spectrace.audit.rules.speedup.speedup_by_k (which also extrapolates past k); model and limits: README,
-- "What k pays". The step cost is the run's whole for every context range and the band's own for a band, priced from measured
-- decode-only steps where steps without drafts of the same target and host exist at the run's batch sizes
-- (step_source 'baseline', view speedup_baseline), else from the run's own fit ('fit'). With 'baseline' the run's
-- prefill chunks are held fixed beside its decode steps (chunk_share: their part of the run's worker time).
WITH acc AS (
    SELECT run_id, 'all' AS context_range, 'all' AS batch_band, position, sum(drafted) AS drafted, sum(accepted) AS accepted
    FROM verify_counts WHERE source = 'engine_core' GROUP BY run_id, position
    UNION ALL
    SELECT run_id, context_range, 'all', position, sum(drafted), sum(accepted)
    FROM verify_counts WHERE source = 'engine_core' AND context_range IS NOT NULL GROUP BY run_id, context_range, position
    UNION ALL
    SELECT run_id, 'all', batch_band, position, sum(drafted), sum(accepted)
    FROM band_positions WHERE batch_band IS NOT NULL GROUP BY run_id, batch_band, position
), k_run AS (
    SELECT run_id, max(position) + 1 AS k FROM acc WHERE context_range = 'all' AND batch_band = 'all' GROUP BY run_id
), band AS (
    SELECT run_id, context_range, batch_band, max(drafted) FILTER (WHERE position = 0) AS request_steps
    FROM acc GROUP BY run_id, context_range, batch_band
), curve AS (
    SELECT a.run_id, a.context_range, a.batch_band, a.position + 1 AS k_new,
           1 + sum(a.accepted) OVER (PARTITION BY a.run_id, a.context_range, a.batch_band ORDER BY a.position)
             / b.request_steps AS expected_length
    FROM acc a JOIN band b USING (run_id, context_range, batch_band)
    WHERE b.request_steps > 0
    UNION ALL
    SELECT run_id, context_range, batch_band, 0, 1.0 FROM band WHERE request_steps > 0
), lowest AS (
    SELECT run_id, min(coalesce(rank, -1)) AS r FROM speculation_steps WHERE steps > 0 GROUP BY run_id
), cost AS (
    SELECT s.run_id, sum(steps)::DOUBLE AS n, sum(step_ns)::DOUBLE AS step_ns, sum(draft_ns)::DOUBLE AS draft_ns,
           sum(scheduled_tokens)::DOUBLE AS t, sum(scheduled_tokens_sq) AS t2, sum(tokens_x_verify_ns) AS tv,
           sum(requests)::DOUBLE AS r
    FROM speculation_steps s JOIN lowest l ON s.run_id = l.run_id AND coalesce(s.rank, -1) = l.r
    WHERE s.steps > 0
    GROUP BY s.run_id
), slope AS (
    SELECT *, step_ns - draft_ns AS v,
           CASE WHEN n * t2 - t * t > 1e-9 * greatest(n * t2, 1)
                THEN greatest((n * tv - t * (step_ns - draft_ns)) / (n * t2 - t * t), 0) ELSE 0 END AS b0
    FROM cost
), fit AS (  -- a + b * tokens; an intercept below 0: the fit through the origin (acceptance.verify_fit)
    SELECT *, CASE WHEN v - b0 * t < 0 AND t2 > 0 THEN 0 ELSE (v - b0 * t) / n END AS a,
           CASE WHEN v - b0 * t < 0 AND t2 > 0 THEN tv / t2 ELSE b0 END AS b
    FROM slope
), baseline AS (
    SELECT run_id, batch_band, steps AS n, plain_ns, verify_ns AS v, draft_ns AS dr,
           CASE WHEN decode_ns > 0 AND chunk_ns > 0 THEN chunk_ns / decode_ns ELSE 0 END AS rho
    FROM speedup_baseline
    WHERE baseline_steps >= 20 AND plain_ns > 0  -- spectrace.audit.rules.speedup.MIN_BASELINE_STEPS
), host AS (  -- host time per step outside the worker, per process role (spectrace.audit.rules.speedup.HostCost)
    SELECT run_id, process_role, sum(steps)::DOUBLE AS n, sum(host_ns)::DOUBLE AS v, sum(tokens)::DOUBLE AS t,
           sum(tokens_sq) AS t2, sum(tokens_x_ns) AS tv
    FROM host_steps GROUP BY run_id, process_role HAVING sum(steps) > 0
), host_slope AS (
    SELECT *, CASE WHEN n * t2 - t * t > 1e-9 * greatest(n * t2, 1)
                   THEN greatest((n * tv - t * v) / (n * t2 - t * t), 0) ELSE 0 END AS b0
    FROM host
), host_fit AS (
    SELECT *, CASE WHEN v - b0 * t < 0 AND t2 > 0 THEN 0 ELSE (v - b0 * t) / n END AS a,
           CASE WHEN v - b0 * t < 0 AND t2 > 0 THEN tv / t2 ELSE b0 END AS b
    FROM host_slope
), reference AS (  -- L(k), or the longest measured where the counts stop short of k
    SELECT c.run_id, c.context_range, c.batch_band, arg_max(c.expected_length, c.k_new) AS lk
    FROM curve c JOIN k_run k USING (run_id) WHERE c.k_new <= k.k GROUP BY ALL
), emitted AS (  -- per run: accepted and emitted over verify request-steps, output tokens of finished requests
    SELECT c.run_id, CASE WHEN sum(c.accepted) + sum(c.request_steps) > 0
                          THEN least(greatest(1 - sum(c.emitted)::DOUBLE / (sum(c.accepted)::DOUBLE + sum(c.request_steps)::DOUBLE), 0), 1)
                          ELSE 0 END AS waste,
           CASE WHEN coalesce(any_value(o.n), 0) > 0 THEN any_value(o.tokens) / any_value(o.n) ELSE 0 END AS out_n
    FROM request_counts c
    LEFT JOIN (SELECT run_id, count(*)::DOUBLE AS n, sum(output_tokens)::DOUBLE AS tokens FROM request_outputs
               WHERE output_tokens IS NOT NULL GROUP BY run_id) o USING (run_id)
    GROUP BY c.run_id HAVING sum(c.request_steps) > 0
), cut AS (  -- E: the accepted length less what stops cut, in proportion to the drafts a step accepts
    SELECT c.run_id, c.context_range, c.batch_band, c.k_new, c.expected_length, r.lk, d.out_n, d.run_id IS NOT NULL AS known,
           CASE WHEN d.run_id IS NOT NULL AND r.lk > 1
                THEN c.expected_length * (1 - d.waste * (c.expected_length - 1) / (r.lk - 1)) ELSE c.expected_length END AS e,
           CASE WHEN d.run_id IS NOT NULL AND r.lk > 1 THEN r.lk * (1 - d.waste * (r.lk - 1) / (r.lk - 1)) ELSE r.lk END AS e_k
    FROM curve c JOIN reference r USING (run_id, context_range, batch_band) LEFT JOIN emitted d USING (run_id)
), gives AS (  -- tokens a request-step gives at k' and at k (spectrace.audit.rules.speedup.Emitted): its prefill step counted
    SELECT run_id, context_range, batch_band, k_new,
           CASE WHEN known AND out_n > 1 THEN out_n * e / (e + out_n - 1) ELSE e END AS tokens,
           CASE WHEN known AND out_n > 1 THEN out_n * e_k / (e_k + out_n - 1) ELSE e_k END AS tokens_k
    FROM cut
), host_at AS (  -- a step at k' emits tokens(k') / tokens(k) of the run's mean tokens per step
    SELECT g.run_id, g.context_range, g.batch_band, g.k_new,
           sum(greatest(h.a + h.b * (h.t / h.n) * (g.tokens / g.tokens_k), 0)) AS host_ns
    FROM gives g JOIN host_fit h USING (run_id)
    GROUP BY ALL
), fitted AS (
    SELECT c.run_id, c.context_range, c.batch_band, c.k_new, k.k, c.expected_length,
           greatest(f.a + f.b * (f.t / f.n - f.r / f.n * (k.k - c.k_new)), 0)
             + CASE WHEN c.k_new = 0 THEN 0
                    WHEN m.method = 'dflash' THEN f.draft_ns / f.n
                    ELSE f.draft_ns / f.n * c.k_new / k.k END AS step_ns,
           greatest(f.a + f.b * (f.t / f.n - f.r / f.n * k.k), 0) AS plain_ns,
           CASE WHEN c.k_new = 0 THEN b.plain_ns / b.n
                ELSE greatest(b.plain_ns / b.n + (b.v / b.n - b.plain_ns / b.n) * c.k_new / k.k, 0)
                     + CASE WHEN m.method = 'dflash' THEN b.dr / b.n ELSE b.dr / b.n * c.k_new / k.k END
           END AS base_step_ns,
           b.plain_ns / b.n AS base_plain_ns, b.rho
    FROM curve c
    JOIN k_run k USING (run_id)
    JOIN fit f USING (run_id)
    LEFT JOIN baseline b USING (run_id, batch_band)
    LEFT JOIN (SELECT run_id, any_value(method) AS method FROM runs GROUP BY run_id) m USING (run_id)
    WHERE c.k_new <= k.k
), priced AS (
    SELECT run_id, context_range, batch_band, k_new, k, expected_length, g.tokens,
           coalesce(base_step_ns, step_ns) AS step_ns, coalesce(base_plain_ns, plain_ns) AS plain_ns,
           coalesce(h.host_ns, 0) AS host_ns,
           CASE WHEN base_step_ns IS NOT NULL THEN 'baseline' ELSE 'fit' END AS step_source,
           CASE WHEN base_step_ns IS NOT NULL THEN coalesce(rho, 0) ELSE 0 END AS rho
    FROM fitted LEFT JOIN host_at h USING (run_id, context_range, batch_band, k_new)
    JOIN gives g USING (run_id, context_range, batch_band, k_new)
), whole AS (  -- the run's worker time per token at k (its decode steps'): prefill chunks priced beside it (rho)
    SELECT *, max(CASE WHEN k_new = k THEN step_ns / tokens END)
                OVER (PARTITION BY run_id, context_range, batch_band) AS per_token_k,
              max(CASE WHEN k_new = 0 THEN host_ns END) OVER (PARTITION BY run_id, context_range, batch_band) AS plain_host_ns
    FROM priced
), chunked AS (
    SELECT *, CASE WHEN rho > 0 AND per_token_k > 0 THEN rho * per_token_k ELSE 0 END AS chunk_ns
    FROM whole
)
SELECT run_id, context_range, batch_band, k_new AS k, k_new = k AS in_force,
       round(expected_length, 4) AS expected_length,
       round(tokens, 4) AS emitted_length,
       round(step_ns / 1e6, 4) AS step_ms,
       round(host_ns / 1e6, 4) AS host_ms,
       CASE WHEN step_ns <= 0 THEN NULL
            ELSE round((plain_ns + coalesce(plain_host_ns, 0) + chunk_ns)
                       / ((step_ns + host_ns) / tokens + chunk_ns), 4) END AS speedup,
       step_source,
       round(CASE WHEN per_token_k > 0 THEN rho / (1 + rho) ELSE 0 END, 4) AS chunk_share
FROM chunked
ORDER BY run_id, context_range = 'all' DESC, context_range,
         list_position({{batch_bands}}, batch_band), k;
