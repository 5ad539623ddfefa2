"""A flush's verification steps as columns: NumPy arrays over request-steps, no Python loop per request-step.

The drain counts over these (``bincount``, comparisons, sums): per step, a few C-level passes turn the dicts
vLLM handed the hook (request id -> draft ids, request id -> row, the sampled lengths, the cached requests'
computed tokens) into arrays; per run, the steps' arrays are joined once. Python runs once per step and once
per run, never once per request-step (issue #34: the drain was ~75 % of the pipeline's CPU at GPU rates).

Counting rules (vLLM's ``Scheduler.update_from_output`` / ``make_spec_decoding_stats``): a request-step
counts when the request has a row in the step's output and drafts; with ``num_sampled_tokens_per_step`` set,
only when it sampled something; drafted = its drafts minus grammar-invalidated ones; accepted =
max(sampled - num_sampled, 0). The engine core's context is the request's computed tokens before the step
(-1 where the step's cached requests do not list it).
"""

from __future__ import annotations

from itertools import compress, repeat

import numpy as np

_INT = np.int64


class StepColumns:
    """One engine step's counted request-steps."""

    __slots__ = ("ids", "draft_lists", "drafted", "accepted", "context", "lengths")

    def __init__(self, ids, draft_lists, drafted, accepted, context, lengths) -> None:
        self.ids = ids  # request ids, in the step's draft dict order
        self.draft_lists = draft_lists  # their draft token id lists (vLLM's objects)
        self.drafted = drafted
        self.accepted = accepted
        self.context = context
        self.lengths = lengths  # drafts per row before invalidated ones are taken off


def engine_step(drafts: dict, sampled_lens, row_of: dict, cached, invalid: dict | None, num_sampled: int) -> StepColumns | None:
    """The request-steps of one engine step that count, or None where none does."""
    n = len(drafts)
    if not n:
        return None
    ids = list(drafts)
    draft_lists = list(drafts.values())
    lengths = np.fromiter(map(len, draft_lists), _INT, n)
    rows = np.fromiter(map(row_of.get, ids, repeat(-1)), _INT, n)
    width = len(sampled_lens) if sampled_lens is not None else 0
    in_output = (rows >= 0) & (rows < width)
    if width:
        sampled = np.asarray(sampled_lens, dtype=_INT)
        generated = np.where(in_output, sampled[np.where(in_output, rows, 0)], 0)
    else:
        generated = np.zeros(n, _INT)
    keep = (rows >= 0) & (lengths > 0)
    if num_sampled != 0:
        keep &= generated > 0
    if invalid:
        drafted = lengths - np.fromiter(map(invalid.get, ids, repeat(0)), _INT, n)
    else:
        drafted = lengths
    accepted = np.maximum(generated - num_sampled, 0)
    if cached is not None:
        computed = dict(zip(cached.req_ids, cached.num_computed_tokens))
        context = np.fromiter(map(computed.get, ids, repeat(-1)), _INT, n)
    else:
        context = np.full(n, -1, _INT)
    if not keep.all():
        if not keep.any():
            return None
        ids, draft_lists = list(compress(ids, keep)), list(compress(draft_lists, keep))
        drafted, accepted, context, lengths = drafted[keep], accepted[keep], context[keep], lengths[keep]
    return StepColumns(ids, draft_lists, drafted, accepted, context, lengths)


class RunColumns:
    """One run's counted request-steps of a flush, in step order, and each step's facts."""

    __slots__ = ("ids", "draft_lists", "_drafted", "_accepted", "_context", "_lengths", "step_ts", "step_no",
                 "step_rows", "_arrays")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.draft_lists: list = []
        self._drafted: list[np.ndarray] = []
        self._accepted: list[np.ndarray] = []
        self._context: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []
        self.step_ts: list[int] = []
        self.step_no: list[int] = []
        self.step_rows: list[int] = []  # request-steps per step
        self._arrays = None

    def add(self, ts: int, step_no: int, step: StepColumns) -> None:
        self.ids += step.ids
        self.draft_lists += step.draft_lists
        self._drafted.append(step.drafted)
        self._accepted.append(step.accepted)
        self._context.append(step.context)
        self._lengths.append(step.lengths)
        self.step_ts.append(ts)
        self.step_no.append(step_no)
        self.step_rows.append(len(step.ids))
        self._arrays = None

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(drafted, accepted, context, lengths) over every request-step of the run, joined once."""
        if self._arrays is None:
            self._arrays = tuple(np.concatenate(parts) for parts in (self._drafted, self._accepted, self._context,
                                                                     self._lengths))
        return self._arrays

    def table(self) -> np.ndarray:
        """(request-steps, 3): drafted, accepted, context -- the shape the counting functions take."""
        drafted, accepted, context, _ = self.arrays()
        return np.column_stack((drafted, accepted, context))

    def per_request(self) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """Each request of the flush once (first appearance order): its request-steps, drafted and accepted."""
        drafted, accepted, _, _ = self.arrays()
        order = dict.fromkeys(self.ids)
        index = dict(zip(order, range(len(order))))
        codes = np.fromiter(map(index.__getitem__, self.ids), _INT, len(self.ids))
        size = len(order)
        return (list(order), np.bincount(codes, minlength=size), np.bincount(codes, drafted, size).astype(_INT),
                np.bincount(codes, accepted, size).astype(_INT))


def step_mark_values(step: StepColumns) -> tuple[int, int, int, int, int, int]:
    """(context, drafted, accepted, request-steps, position-0 accepted, k) of one step: ``acceptance.StepMark``."""
    drafted, accepted = step.drafted, step.accepted
    return (int(step.context.max()), int(drafted.sum()), int(accepted.sum()), len(step.ids),
            int(np.count_nonzero(accepted)), max(int(drafted.max()), 0))


def worker_step(drafts, valid_lens: list, row_of: dict | None) -> tuple[np.ndarray, np.ndarray] | None:
    """(drafted, accepted) of one worker step's request-steps that count: V1 (request id -> draft ids, request
    id -> row) or V2 (drafts per row, aligned with the rows); accepted = tokens yielded - 1."""
    width = len(valid_lens)
    if not width:
        return None
    valid = np.asarray(valid_lens, dtype=_INT)
    if row_of is None:  # V2: per row
        drafted = np.asarray(drafts, dtype=_INT)[:width]
        generated = valid[: len(drafted)]
    else:
        n = len(drafts)
        if not n:
            return None
        rows = np.fromiter(map(row_of.get, drafts, repeat(-1)), _INT, n)
        drafted = np.fromiter(map(len, drafts.values()), _INT, n)
        inside = (rows >= 0) & (rows < width)
        drafted, generated = drafted[inside], valid[rows[inside]]
    keep = (drafted > 0) & (generated > 0)
    if not keep.any():
        return None
    return drafted[keep], np.maximum(generated[keep] - 1, 0)
