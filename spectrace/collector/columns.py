"""A flush's verification steps as columns: NumPy arrays over request-steps, no Python loop per request-step.

Per step, a few C-level passes (``list``, ``map``) append the values vLLM handed the hook (request id ->
draft ids, request id -> row, the sampled lengths, the cached requests' computed tokens) to one run's lists;
a pipeline process gets each draft dict packed (``wire.PackedDrafts``: ids, lengths, the tokens joined) and
appends those as they are. Per run, the lists become arrays once and everything is counted over them
(comparisons, ``bincount``, sums); the draft tokens stay one joined array (``Counted.tokens``, ``starts``).
Python runs once per step and once per run, never once per request-step, and NumPy once per run, not per step
(issue #34: the drain was ~75 % of the pipeline's CPU at GPU rates; per-step arrays cost more than the loop
they replaced at batch 16).

Counting rules (vLLM's ``Scheduler.update_from_output`` / ``make_spec_decoding_stats``): a request-step
counts when the request has a row in the step's output and drafts; with ``num_sampled_tokens_per_step`` set,
only when it sampled something; drafted = its drafts minus grammar-invalidated ones; accepted =
max(sampled - num_sampled, 0). The engine core's context is the request's computed tokens before the step
(-1 where the step's cached requests do not list it).
"""

from __future__ import annotations

from itertools import chain, compress, repeat

import numpy as np

from spectrace.recorder.wire import PackedDrafts

_INT = np.int64


def _look_up(rows: np.ndarray, sizes: list[int], widths: list[int], values: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Several steps' rows at once: ``rows`` (each step's ``sizes`` entries, one row index each, -1: none) into the
    steps' ``values`` joined in step order (each step's ``widths`` long). Returns the step of each entry, whether
    its row exists in its step, and the value there (0 where not)."""
    sizes_a, widths_a = np.asarray(sizes, dtype=_INT), np.asarray(widths, dtype=_INT)
    step_of = np.repeat(np.arange(len(sizes_a)), sizes_a)
    offsets = np.concatenate(([0], np.cumsum(widths_a)[:-1]))
    inside = (rows >= 0) & (rows < widths_a[step_of])
    joined = np.asarray(values, dtype=_INT) if values else np.zeros(1, _INT)
    return step_of, inside, np.where(inside, joined[np.where(inside, rows + offsets[step_of], 0)], 0)


class RunColumns:
    """One run's engine steps of a flush: filled step by step (``add``), counted once (``count``)."""

    __slots__ = ("ids", "_tokens", "_lengths", "_rows", "_context", "_invalid", "_sampled", "_emitted", "_sizes",
                 "_widths", "_num_sampled", "_ts", "_step_no", "has_invalid", "counted")

    def __init__(self) -> None:
        self.ids: list[str] = []
        # each step's draft tokens: packed (bytes, as shipped: wire.PackedDrafts) or (its rows, their total)
        self._tokens: list = []
        self._lengths: list[int] = []
        self._rows: list[int] = []
        self._context: list[int] = []
        self._invalid: list[int] = []
        self._sampled: list[int] = []
        self._emitted: list[int] = []  # tokens each row emitted (its sampled ones, but where its request stopped)
        self._sizes: list[int] = []  # request ids per step
        self._widths: list[int] = []  # sampled rows per step
        self._num_sampled: list[int] = []
        self._ts: list[int] = []
        self._step_no: list[int] = []
        self.has_invalid = False
        self.counted: Counted | None = None

    def add(self, ts: int, step_no: int, drafts: "dict | PackedDrafts", sampled_lens, req_ids: list, cached,
            invalid: dict | None, num_sampled: int, emitted_lens=None) -> None:
        """One engine step; ``req_ids``: the output's request id of each sampled row (``ModelRunnerOutput.req_ids``;
        an id the step drafted for but the output lacks counts nothing, as in vLLM)."""
        if type(drafts) is PackedDrafts:
            ids = drafts.ids
            n = len(ids)
            if not n:
                return
            self._lengths += drafts.lengths  # a byte a row: the lengths as ints
            self._tokens.append(drafts.tokens)
        else:
            n = len(drafts)
            if not n:
                return
            ids = list(drafts)
            values = list(drafts.values())
            lengths = list(map(len, values))
            self._lengths += lengths
            self._tokens.append((values, sum(lengths)))
        self.ids += ids
        row_of = dict(zip(req_ids, range(len(req_ids))))
        self._rows += map(row_of.get, ids, repeat(-1))
        if cached is not None:
            computed = dict(zip(cached.req_ids, cached.num_computed_tokens))
            self._context += map(computed.get, ids, repeat(-1))
        else:
            self._context += repeat(-1, n)
        if invalid:
            self.has_invalid = True
            self._invalid += map(invalid.get, ids, repeat(0))
        else:
            self._invalid += repeat(0, n)
        if sampled_lens:
            self._sampled += sampled_lens
            self._emitted += emitted_lens if emitted_lens is not None and len(emitted_lens) == len(sampled_lens) else sampled_lens
        self._widths.append(len(sampled_lens) if sampled_lens else 0)
        self._sizes.append(n)
        self._num_sampled.append(num_sampled)
        self._ts.append(ts)
        self._step_no.append(step_no)

    def count(self) -> "Counted | None":
        """The run's counted request-steps and each step's totals (None: nothing counted)."""
        if self.counted is not None or not self._sizes:
            return self.counted
        steps = len(self._sizes)
        rows = np.asarray(self._rows, dtype=_INT)
        lengths = np.asarray(self._lengths, dtype=_INT)
        step_of, _, generated = _look_up(rows, self._sizes, self._widths, self._sampled)
        emitted = _look_up(rows, self._sizes, self._widths, self._emitted)[2]
        num_sampled = np.asarray(self._num_sampled, dtype=_INT)[step_of]
        keep = (rows >= 0) & (lengths > 0) & ((generated > 0) | (num_sampled == 0))
        drafted = lengths - np.asarray(self._invalid, dtype=_INT) if self.has_invalid else lengths
        accepted = np.maximum(generated - num_sampled, 0)
        context = np.asarray(self._context, dtype=_INT)
        starts = np.cumsum(lengths) - lengths  # each request-step's row in the joined tokens
        ids = self.ids
        if not keep.all():
            if not keep.any():
                return None
            ids = list(compress(ids, keep))
            drafted, accepted, context, lengths, step_of, emitted, starts = (
                a[keep] for a in (drafted, accepted, context, lengths, step_of, emitted, starts))
        self.counted = Counted(self, ids, self.tokens(), starts, drafted, accepted, emitted, context, lengths, step_of,
                               steps)
        return self.counted

    def tokens(self) -> np.ndarray:
        """Every step's draft tokens joined, rows in order (``Counted.starts`` and ``lengths`` find each)."""
        parts = [np.frombuffer(part, np.int32) if type(part) is bytes
                 else np.fromiter(chain.from_iterable(part[0]), _INT, part[1]) for part in self._tokens]
        return np.concatenate(parts) if parts else np.zeros(0, _INT)


class Counted:
    """One run's counted request-steps (in step order) and per-step totals, as arrays."""

    __slots__ = ("ids", "tokens", "starts", "drafted", "accepted", "emitted", "context", "lengths", "step_of", "ts",
                 "step_no", "per_step", "ctx_max", "k", "_starts")

    def __init__(self, run: RunColumns, ids, tokens, starts, drafted, accepted, emitted, context, lengths, step_of,
                 steps: int) -> None:
        self.ids = ids
        # the draft token ids: request-step i drafted tokens[starts[i]:starts[i] + lengths[i]]
        self.tokens, self.starts = tokens, starts
        self.drafted, self.accepted, self.context, self.lengths = drafted, accepted, context, lengths
        self.emitted = emitted  # tokens each request-step emitted: accepted + 1, less where its request stopped
        self.step_of = step_of
        self.ts = np.asarray(run._ts, dtype=_INT)
        self.step_no = np.asarray(run._step_no, dtype=_INT)
        # per step: request-steps, drafted, accepted, position-0 accepted (steps with none counted have 0)
        self.per_step = (np.bincount(step_of, minlength=steps), np.bincount(step_of, drafted, steps).astype(_INT),
                         np.bincount(step_of, accepted, steps).astype(_INT),
                         np.bincount(step_of, accepted > 0, steps).astype(_INT))
        self.ctx_max = np.full(steps, -1, _INT)
        np.maximum.at(self.ctx_max, step_of, context)
        self.k = np.zeros(steps, _INT)
        np.maximum.at(self.k, step_of, drafted)
        self._starts = np.concatenate(([0], np.cumsum(self.per_step[0])))

    def step_slice(self, step: int) -> slice:
        """The request-steps of step ``step`` (its index in the flush's steps of this run)."""
        return slice(int(self._starts[step]), int(self._starts[step + 1]))

    def table(self) -> np.ndarray:
        """(request-steps, 3): drafted, accepted, context -- the shape the counting functions take."""
        return np.column_stack((self.drafted, self.accepted, self.context))

    def per_request(self) -> "PerRequest":
        """Each request of the flush once (first appearance order): its request-steps, drafted, accepted, emitted,
        and its histogram of accepted drafts per step (vLLM's ``acceptance_histogram``, dense from 0)."""
        order = dict.fromkeys(self.ids)
        index = dict(zip(order, range(len(order))))
        codes = np.fromiter(map(index.__getitem__, self.ids), _INT, len(self.ids))
        size = len(order)
        width = int(self.accepted.max()) + 1 if len(self.accepted) else 1
        histogram = np.bincount(codes * width + self.accepted, minlength=size * width).reshape(size, width)
        return PerRequest(list(order), np.bincount(codes, minlength=size),
                          np.bincount(codes, self.drafted, size).astype(_INT),
                          np.bincount(codes, self.accepted, size).astype(_INT),
                          np.bincount(codes, self.emitted, size).astype(_INT), histogram)


class PerRequest:
    """A flush's counts per request (``Counted.per_request``), one entry per request in ``ids`` order."""

    __slots__ = ("ids", "steps", "drafted", "accepted", "emitted", "histogram")

    def __init__(self, ids: list[str], steps, drafted, accepted, emitted, histogram) -> None:
        self.ids, self.steps, self.drafted, self.accepted, self.emitted = ids, steps, drafted, accepted, emitted
        self.histogram = histogram  # (requests, the flush's most accepted + 1): request-steps by accepted drafts


class WorkerColumns:
    """One (run, rank)'s worker steps of a flush: V1 (request id -> draft ids, request id -> row) or V2 (drafts
    per row, aligned with the rows); accepted = tokens yielded - 1."""

    __slots__ = ("_drafted", "_rows", "_valid", "_widths", "_sizes")

    def __init__(self) -> None:
        self._drafted: list[int] = []
        self._rows: list[int] = []
        self._valid: list[int] = []
        self._widths: list[int] = []
        self._sizes: list[int] = []

    def add(self, drafts, valid_lens: list, row_of: dict | None) -> None:
        width = len(valid_lens)
        if not width:
            return
        if row_of is None:  # V2: row i drafted drafts[i]
            drafted = drafts[:width] if isinstance(drafts, list) else np.asarray(drafts)[:width].tolist()
            n = len(drafted)
            self._drafted += drafted
            self._rows += range(n)
        elif type(drafts) is PackedDrafts:  # V1 as shipped
            n = len(drafts.ids)
            self._drafted += drafts.lengths
            self._rows += map(row_of.get, drafts.ids, repeat(-1))
        else:
            n = len(drafts)
            self._drafted += map(len, drafts.values())
            self._rows += map(row_of.get, drafts, repeat(-1))
        self._valid += valid_lens
        self._widths.append(width)
        self._sizes.append(n)

    def count(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(drafted, accepted) of the request-steps that count."""
        if not self._sizes:
            return None
        _, inside, generated = _look_up(np.asarray(self._rows, dtype=_INT), self._sizes, self._widths, self._valid)
        drafted = np.asarray(self._drafted, dtype=_INT)
        keep = inside & (drafted > 0) & (generated > 0)
        if not keep.any():
            return None
        return drafted[keep], np.maximum(generated[keep] - 1, 0)
