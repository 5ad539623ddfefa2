"""Columnar counting (spectrace.collector.columns) against the counting rules written as a loop per
request-step (vLLM's ``update_from_output`` / ``make_spec_decoding_stats``), on random steps (no vLLM)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

from spectrace.audit.rules import acceptance
from spectrace.collector import columns


def reference_engine(steps):
    """The rules as the drain wrote them before #34, one request-step at a time."""
    out = []
    for drafts, sampled_lens, req_ids, cached, invalid, num_sampled, emitted_lens in steps:
        row_of = {rid: i for i, rid in enumerate(req_ids) if rid is not None}
        context = dict(zip(cached.req_ids, cached.num_computed_tokens)) if cached is not None else {}
        rows = len(sampled_lens) if sampled_lens is not None else 0
        for req_id, draft_ids in drafts.items():
            index = row_of.get(req_id)
            if index is None or not draft_ids:
                continue
            generated = sampled_lens[index] if index < rows else 0
            if not generated and num_sampled != 0:
                continue
            drafted = len(draft_ids) - invalid.get(req_id, 0) if invalid else len(draft_ids)
            accepted = generated - num_sampled if generated > num_sampled else 0
            emitted = emitted_lens[index] if emitted_lens is not None and index < rows else generated
            out.append((req_id, drafted, accepted, int(context.get(req_id, -1)), emitted))
    return out


def random_steps(rng: random.Random, n_steps: int):
    steps = []
    for _ in range(n_steps):
        n = rng.randrange(0, 12)
        ids = [f"r{rng.randrange(30)}" for _ in range(n)]
        drafts = {rid: [rng.randrange(-1, 5) for _ in range(rng.choice([0, 1, 2, 3, 5]))] for rid in ids}
        order = list(drafts)
        rng.shuffle(order)
        req_ids = [rid if rng.random() < 0.9 else None for rid in order]  # the output's rows; None: a row of no draft
        width = rng.randrange(0, len(order) + 2)
        sampled = [rng.randrange(0, 6) for _ in range(width)] if rng.random() < 0.95 else None
        listed = [rid for rid in drafts if rng.random() < 0.8]
        cached = SimpleNamespace(req_ids=listed, num_computed_tokens=[rng.randrange(1, 9000) for _ in listed]) \
            if rng.random() < 0.9 else None
        invalid = {rid: rng.randrange(0, 2) for rid in drafts if rng.random() < 0.3} if rng.random() < 0.3 else None
        # a step where requests stopped: vLLM trimmed their sampled tokens to what they emitted
        emitted = [rng.randrange(0, n + 1) for n in sampled] if sampled and rng.random() < 0.3 else None
        steps.append((drafts, sampled, req_ids, cached, invalid, rng.choice([1, 1, 1, 0]), emitted))
    return steps


@pytest.mark.parametrize("seed", range(12))
def test_engine_columns_count_as_the_loop_does(seed):
    rng = random.Random(seed)
    steps = random_steps(rng, rng.randrange(1, 40))
    run = columns.RunColumns()
    for i, step in enumerate(steps):
        run.add(1000 + i, i, *step)
    counted = run.count()
    expected = reference_engine(steps)
    if not expected:
        assert counted is None
        return
    got = list(zip(counted.ids, counted.drafted.tolist(), counted.accepted.tolist(), counted.context.tolist(),
                   counted.emitted.tolist()))
    assert got == expected
    # per step: request-steps, drafted, accepted, position-0 accepted, the longest context, k
    per_step = {}
    for i, step in enumerate(steps):
        rows = reference_engine([step])
        if rows:
            per_step[i] = (len(rows), sum(r[1] for r in rows), sum(r[2] for r in rows), sum(r[2] > 0 for r in rows),
                           max(r[3] for r in rows), max(max(r[1] for r in rows), 0))
    n, d, a, p0 = (x.tolist() for x in counted.per_step)
    step_no = counted.step_no.tolist()  # the steps recorded (a step without drafts is none)
    assert {step_no[j]: (n[j], d[j], a[j], p0[j], int(counted.ctx_max[j]), int(counted.k[j]))
            for j in range(len(step_no)) if n[j]} == per_step
    # per request, in first-appearance order
    flush = counted.per_request()
    totals, histograms = {}, {}
    for rid, drafted, accepted, _, emitted in expected:
        t = totals.setdefault(rid, [0, 0, 0, 0])
        t[0] += 1
        t[1] += drafted
        t[2] += accepted
        t[3] += emitted
        histograms.setdefault(rid, {}).setdefault(accepted, 0)
        histograms[rid][accepted] += 1
    got = zip(flush.steps.tolist(), flush.drafted.tolist(), flush.accepted.tolist(), flush.emitted.tolist())
    assert dict(zip(flush.ids, got)) == {k: tuple(v) for k, v in totals.items()}
    assert flush.ids == list(totals)
    # vLLM's acceptance_histogram per request: dense from 0, summing to its steps, sum(j * h[j]) its accepted
    for rid, row in zip(flush.ids, flush.histogram.tolist()):
        assert {j: n for j, n in enumerate(row) if n} == histograms[rid]
        assert sum(row) == totals[rid][0] and sum(j * n for j, n in enumerate(row)) == totals[rid][2]


@pytest.mark.parametrize("seed", range(8))
def test_worker_columns_count_as_the_loop_does(seed):
    rng = random.Random(seed)
    worker = columns.WorkerColumns()
    expected = []
    for _ in range(rng.randrange(1, 30)):
        if rng.random() < 0.5:  # V1
            ids = [f"r{i}" for i in range(rng.randrange(0, 8))]
            drafts = {rid: [7] * rng.randrange(0, 4) for rid in ids}
            valid = [rng.randrange(0, 5) for _ in range(rng.randrange(0, len(ids) + 2))]
            row_of = {rid: i for i, rid in enumerate(ids) if rng.random() < 0.9}
            pairs = [(len(d), valid[row_of[rid]]) for rid, d in drafts.items() if rid in row_of and row_of[rid] < len(valid)]
        else:  # V2: drafts per row
            drafts = np.array([rng.randrange(0, 4) for _ in range(rng.randrange(0, 8))])
            valid = [rng.randrange(0, 5) for _ in range(rng.randrange(0, 9))]
            row_of = None
            pairs = list(zip(drafts.tolist(), valid))
        worker.add(drafts, valid, row_of)
        if valid:
            expected += [(d, max(g - 1, 0)) for d, g in pairs if d and g]
    counted = worker.count()
    if not expected:
        assert counted is None
        return
    assert list(zip(counted[0].tolist(), counted[1].tolist())) == expected


def reference_one_token_rows(draft_rows, accepted):
    out = {"rows": 0, "repeated": 0, "repeated_drafted": 0, "repeated_accepted": 0, "by_token": {}}
    for draft, a in zip(draft_rows, accepted):
        if len(draft) < 2 or draft[0] < 0:
            continue
        out["rows"] += 1
        if draft.count(draft[0]) == len(draft):
            out["repeated"] += 1
            out["repeated_drafted"] += len(draft)
            out["repeated_accepted"] += a
            out["by_token"][draft[0]] = out["by_token"].get(draft[0], 0) + 1
    return out


@pytest.mark.parametrize("seed", range(8))
def test_one_token_rows_as_the_loop_counts(seed):
    rng = random.Random(seed)
    rows = [[rng.choice([-1, 0, 0, 3, 9]) for _ in range(rng.choice([0, 1, 2, 3, 3, 7]))] for _ in range(300)]
    accepted = [rng.randrange(0, 4) for _ in rows]
    assert acceptance.one_token_rows(rows, accepted) == reference_one_token_rows(rows, accepted)
    # as the drain calls it: a flush's rows joined, and a run's kept rows (some skipped) found by their starts
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    tokens = np.array([t for r in rows for t in r], dtype=np.int32)
    keep = np.array([rng.random() < 0.7 for _ in rows])
    starts = (np.cumsum(lengths) - lengths)[keep]
    kept = [r for r, k in zip(rows, keep) if k]
    kept_accepted = [a for a, k in zip(accepted, keep) if k]
    assert acceptance.repeated_rows(tokens, starts, lengths[keep], kept_accepted) == \
        reference_one_token_rows(kept, kept_accepted)


def packed(step):
    """A random step as the shipper sends it: its draft dict packed (``wire.pack_drafts``)."""
    from spectrace.recorder.wire import PackedDrafts, pack_drafts

    drafts = pack_drafts(step[0])
    assert type(drafts) is PackedDrafts
    return (drafts, *step[1:])


@pytest.mark.parametrize("seed", range(6))
def test_packed_drafts_count_as_the_dicts_do(seed):
    """The engine's and the worker's steps as shipped count exactly as vLLM's dicts do, tokens included, whether a
    flush holds packed steps, dict steps (a pipeline thread, or a dict that did not pack) or both."""
    rng = random.Random(seed)
    steps = random_steps(rng, rng.randrange(5, 40))
    mixed = [packed(step) if rng.random() < 0.5 else step for step in steps]
    counts = []
    for shape in (steps, [packed(step) for step in steps], mixed):
        run = columns.RunColumns()
        for i, step in enumerate(shape):
            run.add(1000 + i, i, *step)
        counted = run.count()
        if counted is None:
            counts.append(None)
            continue
        rows = [counted.tokens[s:s + n].tolist() for s, n in zip(counted.starts.tolist(), counted.lengths.tolist())]
        counts.append((counted.ids, counted.drafted.tolist(), counted.accepted.tolist(), counted.context.tolist(),
                       counted.emitted.tolist(), rows, [x.tolist() for x in counted.per_step]))
        worker = columns.WorkerColumns()
        for drafts, sampled, req_ids, *_ in shape:  # V1's worker: the same rows, as an index
            worker.add(drafts, list(sampled or ()), {rid: i for i, rid in enumerate(req_ids) if rid is not None})
        got = worker.count()
        counts[-1] += tuple(a.tolist() for a in got) if got is not None else (None,)
    assert counts[0] == counts[1] == counts[2]
    if counts[0] is not None:  # the rows are the counted request-steps' draft ids, in order
        assert counts[0][5] == [step[0][row[0]] for step in steps for row in reference_engine([step])]


def test_drafts_that_do_not_pack_travel_as_they_are():
    from spectrace.recorder.wire import PackedDrafts, drafts_total, pack_drafts

    assert pack_drafts({"a": [1] * 256}) == {"a": [1] * 256}  # a row's length is one byte
    assert pack_drafts({"a": [2 ** 31]}) == {"a": [2 ** 31]}
    assert pack_drafts({"a": [1.5]}) == {"a": [1.5]}
    assert pack_drafts({"a": 7}) == {"a": 7}  # not rows at all
    got = pack_drafts({"a": [5, -1, 7], "b": [], "c": [np.int64(9)]})
    assert got == PackedDrafts(["a", "b", "c"], bytes([3, 0, 1]), np.array([5, -1, 7, 9], np.int32).tobytes())
    assert drafts_total(got) == drafts_total({"a": [5, -1, 7], "b": [], "c": [9]}) == 4


def test_auto_pipeline_is_a_process_wherever_vllm_is_loaded(monkeypatch):
    """SPECTRACE_PIPELINE=auto: a pipeline process in a vLLM process, whatever its platform (the CPU engine ran
    faster traced in the process shape too); the flush thread where vLLM is not loaded."""
    import sys
    from types import ModuleType

    from spectrace.recorder.runtime import pipeline_shape

    monkeypatch.delitem(sys.modules, "vllm.platforms", raising=False)
    assert pipeline_shape("auto") == "thread"  # no vLLM in this process
    assert pipeline_shape("process") == "process"
    platforms = ModuleType("vllm.platforms")
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    for is_cpu in (True, False):
        platforms.current_platform = SimpleNamespace(is_cpu=lambda is_cpu=is_cpu: is_cpu)
        assert pipeline_shape("auto") == "process"
        assert pipeline_shape("thread") == "thread" and pipeline_shape("process") == "process"
    platforms.current_platform = SimpleNamespace()  # a platform that cannot be told
    assert pipeline_shape("auto") == "process"


def test_one_value_columns_build_as_repeated_lists_do():
    """``columns_to_arrow`` repeats a column given as one value (run, role, pid, host...) in C: the same table as
    the list of that value repeated, NULLs, timestamps, NumPy scalars and booleans included."""
    import pyarrow as pa

    from spectrace.pipeline import SCHEMA_VERSION, arrow_schema, columns_to_arrow

    n = 5
    one_value = {"run_id": "run-1", "process_role": "engine_core", "pid": np.int64(4321), "host": "h", "rank": None,
                 "ts": 1_700_000_000_000_000_000, "step": np.arange(n), "request_id": [f"r{i}" for i in range(n)],
                 "context_len": pa.array([3, -1, 5, 6, 7], mask=np.array([False, True, False, False, False]),
                                         type=pa.int64()),
                 "num_drafted": 3, "num_accepted": np.array([0, 1, 2, 3, 0]), "num_emitted": 1, "greedy": True,
                 "structured_output": False, "draft_token_ids": None}
    built = columns_to_arrow("verify_steps", one_value, n)
    schema = arrow_schema("verify_steps")
    expected = pa.table({
        name: pa.array(value if isinstance(value, (list, np.ndarray, pa.Array)) else [value] * n,
                       type=schema.field(name).type)
        for name, value in {**one_value, "schema_version": SCHEMA_VERSION}.items()
    }).select(schema.names).cast(schema)
    assert built.schema == schema
    assert built.equals(expected)
    assert built.column("rank").null_count == n and built.column("context_len").null_count == 1
    assert built.column("pid").to_pylist() == [4321] * n and built.column("greedy").to_pylist() == [True] * n
