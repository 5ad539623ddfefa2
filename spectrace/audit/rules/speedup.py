"""What ``k`` pays: the speed-up at every number of speculative tokens, from one run.

Pure arithmetic over the sums one run records (docs/speedup.md, "What k pays"); the live drain,
``spectrace report`` and the tests use it alike, and the ``speedup_by_k`` view
(``store/views.sql``) is its SQL twin.

Acceptance at ``k' <= k`` is exact from the per-position counts: greedy verification accepts a
prefix, so ``accepted[i]`` counts the request-steps that accepted more than ``i`` drafts, and a
request-step that accepted ``j`` of ``k`` drafts would have accepted ``min(j, k')`` of ``k'``:

    L(k') = 1 + sum(accepted[i] for i < k') / request_steps

(``request_steps``: those that drafted at least one token). Past ``k`` the curve is extended
with its last conditional rate ``accepted[k-1] / accepted[k-2]`` (flagged ``extrapolated``).

The step time at ``k'`` comes from one of two sources (``step_source``):

- ``baseline``: the worker's decode-only steps by shape (``decode_steps``, view ``speedup_baseline``). Steps without drafts of the
  same target on the same host (a run without speculation, or this run's own) measure ``step(0)`` at each
  batch size; this run's steps at ``k`` measure verification at ``1 + k`` tokens per request and drafting.
  Verification at ``k'`` is interpolated linearly between the two, per batch size, weighted by this run's
  steps. Needs :data:`MIN_BASELINE_STEPS` such steps at the batch sizes this run ran.
- ``fit``: the run alone. Verification fitted as ``a + b * scheduled tokens`` over the run's drafted steps
  (prefill chunks are its only spread) and priced at ``requests * (1 + k')``. On hardware whose cost is not
  affine in the tokens per request (the CPU build: BENCHMARKS.md, "What k pays") it prices ``step(0)`` high.

The speed-up is the run's time per token given at ``k'`` over its time without drafts. Decode steps take
``u(k') = (step(k') + host(k')) / G(k')`` a token, where ``G(k')`` is what a request-step gives the user
(:class:`Emitted`: ``L(k')`` less what stops cut, a request's prefill step counted; ``L(k')`` where not recorded)
and ``host(k')`` the step's host time outside the worker (``host_steps``: the engine core's scheduling and output
handling, the frontend's output processing; :class:`HostCost`), fitted per process role as affine in the tokens a
step emits, ``G(k') / G(k)`` of the run's mean at ``k'``. With ``baseline`` the run's steps that carried a prefill
chunk are held fixed beside them: what they cost beyond a decode step of their batch size at ``k``
(``chunk_steps``; prefills do not change with k), as a ratio ``rho`` of the run's decode time, so ``speedup =
(u(0) + c) / (u(k') + c)`` with ``c = rho step(k) / G(k)`` (``chunk_share`` = ``rho / (1 + rho)``). docs/speedup.md
has the whole model and its measured accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from spectrace.audit.rules import acceptance
from spectrace.audit.curve import best_k

EXTRAPOLATE = 2  # k' past the k in force, from the curve's last conditional rate


def expected_lengths(accepted_at: Sequence[int], request_steps: int, *, extra: int = EXTRAPOLATE) -> list[tuple[int, float, bool]]:
    """``(k', L(k'), extrapolated)`` for ``k' = 0 .. k + extra`` (``L(0) = 1``)."""
    k = len(accepted_at)
    if request_steps <= 0:
        return []
    out = [(0, 1.0, False)]
    total = 0.0
    for i, accepted in enumerate(accepted_at):
        total += accepted
        out.append((i + 1, 1.0 + total / request_steps, False))
    if k and extra > 0:
        last = float(accepted_at[-1])
        before = float(accepted_at[-2]) if k >= 2 else float(request_steps)
        rate = min(last / before, 1.0) if before > 0 else 0.0
        for m in range(extra):
            last *= rate
            total += last
            out.append((k + m + 1, 1.0 + total / request_steps, True))
    return out


PARALLEL_METHODS = ("dflash",)  # one drafter pass drafts every position (vLLM's parallel drafting)


@dataclass(frozen=True)
class StepCost:
    """One run's worker step sums over the steps that verified drafts (``speculation_steps``)."""

    steps: float
    step_ns: float
    draft_ns: float
    scheduled_tokens: float
    scheduled_tokens_sq: float
    tokens_x_verify_ns: float
    requests: float

    def verify_fit(self) -> tuple[float, float]:
        """``(a, b)``: a step's verification time (its time less drafting) as ``a + b * scheduled tokens``
        (:func:`spectrace.audit.rules.acceptance.verify_fit`, the fit of the run's own speed-up estimate)."""
        return acceptance.verify_fit(self.steps, self.scheduled_tokens, self.scheduled_tokens_sq, self.tokens_x_verify_ns,
                                     self.step_ns - self.draft_ns)

    def step_ns_at(self, k: int, k_new: int, *, parallel: bool = False) -> float:
        """Host time of one step at ``k_new`` drafts per request (0: no speculation), priced from the
        steps run at ``k``: verification at ``requests * (1 + k_new)`` scheduled tokens, drafting at its
        cost per draft position (autoregressive drafters) or per pass (``parallel``: one pass drafts all)."""
        n = self.steps
        a, b = self.verify_fit()
        requests = self.requests / n
        tokens = self.scheduled_tokens / n - requests * (k - k_new)  # each request schedules 1 + k_new
        verify = max(a + b * tokens, 0.0)
        if k_new == 0:
            return verify
        draft = self.draft_ns / n
        return verify + (draft if parallel or k <= 0 else draft * k_new / k)


@dataclass(frozen=True)
class HostCost:
    """One process role's host time per step over a run (``host_steps``): the engine core's scheduling and output
    handling, or the frontend's output processing — the part of a step the worker's clock does not see. Fitted as
    affine in the tokens a step emitted (``a + b * tokens``, :func:`spectrace.audit.rules.acceptance.verify_fit`); a step at
    ``k'`` emits ``L(k') / L(k)`` of the run's mean."""

    steps: float
    ns: float
    tokens: float
    tokens_sq: float
    tokens_x_ns: float

    def step_ns(self, scale: float) -> float:
        """Host time of one step that emits ``scale`` times the run's mean tokens per step."""
        if self.steps <= 0:
            return 0.0
        a, b = acceptance.verify_fit(self.steps, self.tokens, self.tokens_sq, self.tokens_x_ns, self.ns)
        return max(a + b * (self.tokens / self.steps) * scale, 0.0)


def host_ns_at(host: Sequence[HostCost], scale: float) -> float:
    """Every role's host time of one step at ``scale`` times the run's mean tokens per step."""
    return sum(h.step_ns(scale) for h in host)


@dataclass(frozen=True)
class Emitted:
    """What a run's requests got against what their drafts gave (issue #36). Over its verify request-steps: the
    drafts accepted and the tokens emitted (a stop inside an accepted draft cuts it: EOS, a stop string,
    ``max_tokens``); over its finished requests: their output tokens. A user gets fewer tokens a request-step than
    ``L``: a request's last step emits less than it accepted, and its first (the prefill) emits one whatever k is."""

    request_steps: float
    accepted: float
    emitted: float
    requests: float = 0.0
    output_tokens: float = 0.0

    def per_request_step(self, length: float, at_k: float) -> float:
        """Tokens a request gets per step at ``L(k') = length``: the accepted length less what stops cut (the run's
        share at ``L(k) = at_k``, in proportion to the drafts a step accepts), over a request's steps with its
        prefill step (``N`` output tokens: ``N`` over ``1 + (N - 1) / E``)."""
        given = self.accepted + self.request_steps
        waste = min(max(1 - self.emitted / given, 0.0), 1.0) if given > 0 else 0.0
        e = length * (1 - waste * (length - 1) / (at_k - 1)) if at_k > 1 else length
        n = self.output_tokens / self.requests if self.requests > 0 else 0.0
        return n * e / (e + n - 1) if n > 1 else e


MIN_BASELINE_STEPS = 20  # steps without drafts, at the run's batch sizes, before they price step(0)


@dataclass(frozen=True)
class Baseline:
    """Measured decode-only step costs for one run at ``k`` (``decode_steps``), over the run's steps at a batch
    size that steps without drafts of the same target and host also measured: sums over those steps of the
    no-draft step time at their batch size (``plain_ns``), of their own verification (``verify_ns``: step less
    drafting) and drafting (``draft_ns``) times. ``chunk_ns`` and ``decode_ns``: the run's whole worker time split
    (``chunk_steps``): what its steps with a prefill chunk cost beyond a decode step of their batch size at ``k``
    (the part that does not change with k: prefills), and every step priced as that decode step."""

    steps: float
    plain_ns: float
    verify_ns: float
    draft_ns: float
    baseline_steps: int = 0  # steps without drafts at those batch sizes
    chunk_ns: float = 0.0
    decode_ns: float = 0.0

    def step_ns_at(self, k: int, k_new: int, *, parallel: bool = False) -> float:
        plain = self.plain_ns / self.steps
        if k_new == 0:
            return plain
        verify = max(plain + (self.verify_ns / self.steps - plain) * k_new / k, 0.0)
        draft = self.draft_ns / self.steps
        return verify + (draft if parallel else draft * k_new / k)

    def chunk_ratio(self) -> float:
        """The run's time in prefill chunks over its time in decoding (0 when not measured)."""
        return self.chunk_ns / self.decode_ns if self.decode_ns > 0 and self.chunk_ns > 0 else 0.0


def speedup_by_k(accepted_at: Sequence[int], request_steps: int, cost: StepCost, *, method: str | None = None,
                 extra: int = EXTRAPOLATE, baseline: Baseline | None = None, k: int | None = None,
                 host: Sequence[HostCost] = (), emitted: Emitted | None = None) -> list[dict]:
    """Per ``k'``: expected accepted length, step time and speed-up over decoding without drafts
    (``L(k') * step(0) / step(k')``). At ``k' = k`` this is the run's own estimate (``speculation_cost``) when no
    prefill chunk shared the drafted steps; a chunk's tokens stay in ``step(0)`` here, where that estimate
    prices the step without drafts at one token per request. With a ``baseline`` (measured decode-only steps,
    module docstring) the step times are priced from it instead. ``k``: the k in force, which the step costs were
    measured at, where the counts stop short of it (a batch-size band that drafted fewer under dynamic speculation).
    ``host``: the run's host time per step outside the worker, per process role (:class:`HostCost`), priced into
    every k' beside the worker's step (``host_ms``); empty: the worker's step alone, as before issue #36.
    ``emitted`` (:class:`Emitted`): the tokens a request-step really gives at ``k'`` (``emitted_length``) price the
    speed-up instead of ``L(k')``; None: ``L(k')``."""
    k = k or len(accepted_at)
    if not accepted_at or cost.steps <= 0 or cost.step_ns <= 0:
        return []
    parallel = method in PARALLEL_METHODS
    use = baseline if baseline is not None and baseline.steps > 0 and baseline.plain_ns > 0 else None
    price = use.step_ns_at if use is not None else cost.step_ns_at
    plain = price(k, 0)
    lengths = expected_lengths(accepted_at, request_steps, extra=extra)
    at_k = next((length for k_new, length, _ in lengths if k_new == k), None)
    # The run's time per token at k' is its decode steps' (step(k') / L(k')) plus the prefill chunks' part, which
    # does not change with k: measured as a ratio ``rho`` of the decode time at k (0: decode steps alone).
    rho = use.chunk_ratio() if use is not None and at_k else 0.0
    reference = at_k or max(length for _, length, extrapolated in lengths if not extrapolated)
    # the tokens a request-step gives at k' (what stops cut and prefill steps taken out, where measured)
    gives = (lambda length: emitted.per_request_step(length, reference)) if emitted is not None else (lambda length: length)
    given = gives(reference)
    # host time per step outside the worker: a step at k' emits gives(k') / gives(k) of the run's mean tokens per step
    plain_host = host_ns_at(host, gives(1.0) / given)
    # the prefill chunks' time per token (worker time, the same at every k'), from the decode time at k
    chunk = rho * price(k, k, parallel=parallel) / gives(at_k) if rho else 0.0
    rows = []
    for k_new, length, extrapolated in lengths:
        step = price(k, k_new, parallel=parallel)
        tokens = gives(length)
        step_host = host_ns_at(host, tokens / given)
        if step <= 0:
            speedup = None
        else:
            speedup = (plain + plain_host + chunk) / ((step + step_host) / tokens + chunk)
        rows.append({
            "k": k_new,
            "expected_length": round(length, 4),
            "emitted_length": round(tokens, 4),
            "step_ms": round(step / 1e6, 4),
            "host_ms": round(step_host / 1e6, 4),
            "speedup": round(speedup, 4) if speedup is not None else None,
            "extrapolated": extrapolated,
            "in_force": k_new == k,
            "step_source": "baseline" if use is not None else "fit",
            "chunk_share": round(rho / (1 + rho), 4),
        })
    return rows


best = best_k  # the measured (not extrapolated) k' with the highest speed-up; 0 is "no speculation" (one rule: the audit's)


ALL = "all"  # the whole run, every batch size


def from_store(con, run_id: str, *, extra: int = EXTRAPOLATE, baseline: bool = True, batch_band: str = ALL,
               chunks: bool = True, host: bool = True, emitted: bool = True) -> list[dict]:
    """:func:`speedup_by_k` for one run of a store connection (``spectrace.store.open``): acceptance from the
    engine core's ``verify_counts``, step costs from the measured decode-only steps (:func:`baseline_from_store`)
    where the store has them and ``baseline``, else from the lowest worker rank's ``speculation_steps``.
    ``batch_band`` (one of ``spectrace.audit.rules.acceptance.BATCH_BANDS``): the run's steps at that batch size only, their
    acceptance (``band_positions``) and measured step costs; the fit, where it prices, is the whole run's.
    ``chunks=False``: the decode steps alone, without the prefill chunks held fixed beside them (the benchmark's
    comparison of the two models). ``host=False``: the worker's step alone, without the engine core's and frontend's
    host time per step (``host_steps``, the whole run's at every band; the benchmark's comparison). ``emitted=False``:
    priced per accepted length ``L(k')`` instead of the tokens a request-step gives (:func:`emitted_from_store`)."""
    if batch_band == ALL:
        counts = con.execute(
            "SELECT position, sum(drafted), sum(accepted) FROM verify_counts WHERE run_id = ? AND source = 'engine_core' "
            "GROUP BY position ORDER BY position", [run_id]).fetchall()
    else:
        counts = con.execute(
            "SELECT position, sum(drafted), sum(accepted) FROM band_positions WHERE run_id = ? AND batch_band = ? "
            "GROUP BY position ORDER BY position", [run_id, batch_band]).fetchall()
    if not counts or counts[0][0] != 0:
        return []
    k = con.execute("SELECT max(position) + 1 FROM verify_counts WHERE run_id = ? AND source = 'engine_core'",
                    [run_id]).fetchone()[0]
    accepted_at = [int(a) for _, _, a in counts]
    request_steps = int(counts[0][1])
    row = con.execute(
        "SELECT sum(steps), sum(step_ns), sum(draft_ns), sum(scheduled_tokens), sum(scheduled_tokens_sq), "
        "sum(tokens_x_verify_ns), sum(requests) FROM speculation_steps WHERE run_id = ? AND steps > 0 "
        "AND coalesce(rank, -1) = (SELECT min(coalesce(rank, -1)) FROM speculation_steps WHERE run_id = ? AND steps > 0)",
        [run_id, run_id]).fetchone()
    if row is None or not row[0]:
        return []
    method = con.execute("SELECT any_value(method) FROM runs WHERE run_id = ?", [run_id]).fetchone()
    cost = StepCost(*[float(x or 0) for x in row])
    measured = baseline_from_store(con, run_id, batch_band) if baseline else None
    if measured is not None and not chunks:
        measured = replace(measured, chunk_ns=0.0)
    rows = speedup_by_k(accepted_at, request_steps, cost, method=method[0] if method else None, extra=extra, k=k,
                        baseline=measured, host=host_from_store(con, run_id) if host else (),
                        emitted=emitted_from_store(con, run_id) if emitted else None)
    return [{**r, "batch_band": batch_band} for r in rows]


def by_band(con, run_id: str, *, extra: int = 0) -> dict[str, list[dict]]:
    """:func:`from_store` for each batch-size band the run verified drafts at, in band order ("by load": the best
    k falls as the batch grows, where verification costs more per token)."""
    bands = [r[0] for r in con.execute("SELECT DISTINCT batch_band FROM band_positions WHERE run_id = ?", [run_id]).fetchall()]
    return {band: rows for band in sorted(bands, key=acceptance.band_order)
            if (rows := from_store(con, run_id, extra=extra, batch_band=band))}


def baseline_from_store(con, run_id: str, batch_band: str = ALL) -> Baseline | None:
    """The measured step costs that price ``run_id``'s other k (:class:`Baseline`, the view ``speedup_baseline``
    that the named query reads too), over its steps in ``batch_band``, or None where steps without drafts of its
    target were not measured at those batch sizes (fewer than :data:`MIN_BASELINE_STEPS`)."""
    row = con.execute("SELECT steps, plain_ns, verify_ns, draft_ns, baseline_steps, chunk_ns, decode_ns FROM speedup_baseline "
                      "WHERE run_id = ? AND batch_band = ?", [run_id, batch_band]).fetchone()
    if row is None or not row[0] or int(row[4] or 0) < MIN_BASELINE_STEPS:
        return None
    return Baseline(float(row[0]), float(row[1]), float(row[2]), float(row[3]), int(row[4]), float(row[5] or 0),
                    float(row[6] or 0))


def host_from_store(con, run_id: str) -> list[HostCost]:
    """The run's host time per step outside the worker, per process role (``host_steps``; none in a store
    written before it was recorded)."""
    rows = con.execute("SELECT sum(steps), sum(host_ns), sum(tokens), sum(tokens_sq), sum(tokens_x_ns) FROM host_steps "
                       "WHERE run_id = ? GROUP BY process_role ORDER BY process_role", [run_id]).fetchall()
    return [HostCost(*[float(x or 0) for x in row]) for row in rows if row[0]]


def emitted_from_store(con, run_id: str) -> Emitted | None:
    """The run's accepted and emitted tokens over its verify request-steps (``request_counts``) and its finished
    requests' output tokens (``request_outputs``; none in a store written before they were recorded)."""
    row = con.execute("SELECT sum(request_steps), sum(accepted), sum(emitted) FROM request_counts WHERE run_id = ?",
                      [run_id]).fetchone()
    if row is None or not row[0]:
        return None
    out = con.execute("SELECT count(*), sum(output_tokens) FROM request_outputs WHERE run_id = ? AND output_tokens IS NOT NULL",
                      [run_id]).fetchone()
    return Emitted(float(row[0]), float(row[1] or 0), float(row[2] or 0), float(out[0] or 0), float(out[1] or 0))
