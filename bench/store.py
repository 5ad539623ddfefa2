"""Store: how fast verify rows become Parquet segments, and how fast the store answers,
each next to plain DuckDB doing the same work over the same data.

    .venv/bin/python -m bench.store [--quick]

Ingest (one process, one thread, like the background flush), 1 M verify_steps rows, 100 k per flush
  * ``segment writer (columns)``  the rows as the drain hands them since the ingest fix (one
    list per column) -> ``Pipeline.extend_columns`` -> ``flush`` -> Parquet segments.
  * ``segment writer (dicts)``  the same rows as dicts (every other table's path, and the
    verify path before the fix) -> ``Pipeline.extend`` -> ``flush`` -> Parquet.
  * ``capture -> segments``  the whole background path: hot-path step tuples (batch 64,
    k 5) -> ``VerifyCapture.drain`` (verify_steps, verify_counts, acceptance_lengths,
    sampled step spans) -> ``flush`` -> Parquet. Rows counted: verify_steps rows.
  * ``plain DuckDB``  the same verify_steps rows, already columnar (an Arrow table),
    written to Parquet by DuckDB (``COPY ... TO``): the floor for "rows to Parquet".

Query
  10 M verify_counts rows in store layout (``verify_counts/run=<id>/*.parquet``):
  ``SELECT * FROM acceptance_by_position`` through ``spectrace.store.open`` next to the
  same aggregate written by hand over ``read_parquet(glob)``, interleaved, warm medians.
"""

from __future__ import annotations

import argparse
import random
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import SCRATCH, freeze_heap, loadavg, spread, write_result

COMMON = {"run_id": "bench-run", "process_role": "engine_core", "pid": 4242, "host": "bench-host", "rank": None}


def verify_step_rows(n: int, batch: int = 64, seed: int = 0) -> list[dict]:
    """verify_steps rows exactly as VerifyCapture._drain_engine hands them to the writer."""
    rng = random.Random(seed)
    req_ids = [f"cmpl-{rng.getrandbits(64):016x}-{i}" for i in range(batch)]
    ts0 = time.time_ns()
    rows = []
    for i in range(n):
        step, j = divmod(i, batch)
        ctx = 100 + step + j * 37
        rows.append({**COMMON, **{
            "run_id": "bench-run", "ts": ts0 + step * 5_000_000, "step": step, "request_id": req_ids[j],
            "context_len": ctx, "num_drafted": 5, "num_accepted": rng.randrange(6), "greedy": True,
            "structured_output": False, "draft_token_ids": None,
        }})
    return rows


def ingest_writer(rows: list[dict], root, chunk: int) -> float:
    from spectrace.testing import store_pipeline

    shutil.rmtree(root, ignore_errors=True)
    Path(root).parent.mkdir(parents=True, exist_ok=True)  # the writer makes its folder, not the ones above it
    writer = store_pipeline(root, host="bench-host", max_buffer_rows=max(chunk, 200_000), retention_s=0, compact_interval_s=0)
    t0 = time.perf_counter()
    written = 0
    for start in range(0, len(rows), chunk):
        writer.extend("verify_steps", rows[start:start + chunk])
        written += writer.flush()
    elapsed = time.perf_counter() - t0
    assert written == len(rows) and writer.dropped == 0, (written, writer.dropped)
    return elapsed


def verify_step_columns(rows: list[dict], chunk: int) -> list[tuple[dict, int]]:
    """The same rows as the column sets VerifyCapture._drain_engine hands to ``extend_columns``
    (lists per column, the common columns one value each)."""
    sets = []
    names = [n for n in rows[0] if n not in COMMON or n == "run_id"]
    for start in range(0, len(rows), chunk):
        part = rows[start:start + chunk]
        columns = {**COMMON, **{n: [r[n] for r in part] for n in names}}
        columns["run_id"] = ["bench-run"] * len(part)  # one per row, as the drain passes it
        sets.append((columns, len(part)))
    return sets


def ingest_columns(sets: list[tuple[dict, int]], root) -> float:
    from spectrace.testing import store_pipeline

    shutil.rmtree(root, ignore_errors=True)
    Path(root).parent.mkdir(parents=True, exist_ok=True)  # the writer makes its folder, not the ones above it
    writer = store_pipeline(root, host="bench-host", max_buffer_rows=max(n for _, n in sets), retention_s=0, compact_interval_s=0)
    t0 = time.perf_counter()
    written = 0
    for columns, n in sets:
        writer.extend_columns("verify_steps", columns, n)
        written += writer.flush()
    elapsed = time.perf_counter() - t0
    assert written == sum(n for _, n in sets) and writer.dropped == 0
    return elapsed


def ingest_capture(steps: int, batch: int, k: int, root, steps_per_flush: int) -> tuple[float, int]:
    from bench.hotpath import build_inputs
    from spectrace.settings import Settings
    from spectrace.recorder import runtime, verify

    shutil.rmtree(root, ignore_errors=True)
    rt = runtime.Runtime(Settings(enabled=True, dir=root, max_buffer_rows=10**7), verify.VerifyCapture)
    rt.set_run(runtime.Run(run_id="bench-run", traceparent=""))
    rt.enter_role("engine_core")
    runtime._runtime = rt
    capture = rt.verify
    capture.engine_steps.clear()
    so, mro, _, _ = build_inputs(batch, k)
    hook = verify.wrap_update_from_output(lambda *a, **kw: None, "engine_core.verify")
    sched = SimpleNamespace(num_sampled_tokens_per_step=1)
    elapsed = 0.0
    for start in range(0, steps, steps_per_flush):
        for _ in range(min(steps_per_flush, steps - start)):
            hook(sched, so, mro)
        t0 = time.perf_counter()
        rt.pipeline.flush()  # runs the drain first (the pipeline's first source), then writes
        elapsed += time.perf_counter() - t0
    assert rt.pipeline.dropped == 0
    runtime._runtime = None
    return elapsed, steps * batch


def ingest_duckdb(rows: list[dict], root, chunk: int) -> float:
    import duckdb

    from spectrace.pipeline import to_arrow

    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    tables = [to_arrow("verify_steps", rows[s:s + chunk]) for s in range(0, len(rows), chunk)]  # untimed
    con = duckdb.connect()
    t0 = time.perf_counter()
    for i, tbl in enumerate(tables):
        con.register("chunk", tbl)
        con.execute(f"COPY chunk TO '{root}/part-{i:05d}.parquet' (FORMAT parquet)")
        con.unregister("chunk")
    return time.perf_counter() - t0


def make_counts_store(root, rows: int, files: int, runs: int = 20, seed: int = 0) -> None:
    """``rows`` verify_counts rows in store layout, ``files`` segments spread over ``runs`` runs."""
    from spectrace.pipeline import arrow_schema

    shutil.rmtree(root, ignore_errors=True)
    schema = arrow_schema("verify_counts")
    rng = np.random.default_rng(seed)
    per = rows // files
    buckets = np.array(["0-512", "512-1k", "1k-2k", "2k-4k", "4k-8k", "8k-16k", "16k+"])
    for f in range(files):
        run = f"run-{f % runs:03d}"
        folder = root / "verify_counts" / f"run={run}"
        folder.mkdir(parents=True, exist_ok=True)
        position = rng.integers(0, 5, per, dtype=np.int32)
        drafted = rng.integers(1, 2000, per)
        source_engine = rng.random(per) < 0.8
        cols = {
            "run_id": pa.array(np.full(per, run)),
            "process_role": pa.array(np.where(source_engine, "engine_core", "worker")),
            "pid": pa.array(np.full(per, 1000 + f % 4, dtype=np.int64)),
            "host": pa.array(np.full(per, "bench-host")),
            "rank": pa.array(np.where(source_engine, 0, 0).astype(np.int32), mask=source_engine),
            "schema_version": pa.array(np.ones(per, dtype=np.int32)),
            "ts": pa.array(np.sort(rng.integers(1.7e18, 1.7e18 + 3.6e12, per)), type=pa.timestamp("ns")),
            "source": pa.array(np.where(source_engine, "engine_core", "worker")),
            "position": pa.array(position),
            "context_bucket": pa.array(buckets[rng.integers(0, 7, per)], mask=~source_engine),
            "context_range": pa.array(np.full(per, None)),  # the run's own split; none in this benchmark
            "drafted": pa.array(drafted),
            "accepted": pa.array((drafted * rng.random(per) * (0.9 ** position)).astype(np.int64)),
        }
        table = pa.Table.from_arrays([cols[f_.name] for f_ in schema], schema=schema)
        pq.write_table(table, folder / f"bench-host-{1000 + f}-{f:06d}.parquet")


PLAIN_SQL = """
SELECT run_id, position,
       sum(drafted) AS drafted,
       sum(accepted) AS accepted,
       CASE WHEN sum(drafted) > 0 THEN sum(accepted) / sum(drafted) END AS rate
FROM read_parquet('{glob}')
WHERE source = 'engine_core'
GROUP BY run_id, position
ORDER BY run_id, position
"""


def query(root, reps: int) -> dict:
    import duckdb

    import spectrace.store

    t0 = time.perf_counter()
    con = spectrace.store.open(root)
    open_s = time.perf_counter() - t0
    plain = duckdb.connect(":memory:")
    plain_sql = PLAIN_SQL.format(glob=root / "verify_counts" / "*" / "*.parquet")
    t0 = time.perf_counter()
    first = con.execute("SELECT * FROM acceptance_by_position").fetchall()
    cold_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    first_plain = plain.execute(plain_sql).fetchall()
    cold_plain_s = time.perf_counter() - t0
    assert first == first_plain and len(first) > 0, "spectrace view and plain DuckDB disagree"
    ours, theirs = [], []
    for rep in range(reps):
        order = [("s", con, "SELECT * FROM acceptance_by_position"), ("p", plain, plain_sql)]
        if rep % 2:
            order.reverse()
        for tag, c, sql in order:
            t0 = time.perf_counter()
            c.execute(sql).fetchall()
            (ours if tag == "s" else theirs).append(time.perf_counter() - t0)
    return {
        "open_s": open_s,
        "result_rows": len(first),
        "cold_spectrace_s": cold_s,
        "cold_plain_s": cold_plain_s,
        "spectrace_s": spread(ours),
        "plain_duckdb_s": spread(theirs),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    reps = 3 if args.quick else 5
    n_rows = 200_000 if args.quick else 1_000_000
    count_rows = 1_000_000 if args.quick else 10_000_000
    chunk = 100_000
    base = SCRATCH / "store"
    load_before = loadavg()
    started = time.time()

    from bench.hotpath import build_inputs
    from spectrace.recorder import runtime

    build_inputs(1, 1)  # imports (vLLM's dataclasses)
    runtime.vllm_version()
    rows = verify_step_rows(n_rows)
    column_sets = verify_step_columns(rows, chunk)
    freeze_heap()  # as vLLM does once the engine is up (and the rows are long-lived input here)
    writer_s, columns_s, capture_s, duck_s = [], [], [], []
    capture_rows = 0
    for rep in range(reps):
        # interleaved, order alternating
        jobs = [
            ("writer", lambda: writer_s.append(ingest_writer(rows, base / "ingest-writer", chunk))),
            ("columns", lambda: columns_s.append(ingest_columns(column_sets, base / "ingest-columns"))),
            ("duckdb", lambda: duck_s.append(ingest_duckdb(rows, base / "ingest-duckdb", chunk))),
            ("capture", None),
        ]
        if rep % 2:
            jobs.reverse()
        for name, job in jobs:
            if name == "capture":
                secs, capture_rows = ingest_capture(n_rows // 64, 64, 5, base / "ingest-capture", 100_000 // 64)
                capture_s.append(secs)
            else:
                job()
    ingest = {
        "rows": n_rows,
        "rows_per_flush": chunk,
        "segment_writer_rows_per_s": spread([n_rows / s for s in writer_s]),
        "segment_writer_columns_rows_per_s": spread([n_rows / s for s in columns_s]),
        "capture_to_segments_rows_per_s": spread([capture_rows / s for s in capture_s]),
        "plain_duckdb_rows_per_s": spread([n_rows / s for s in duck_s]),
    }
    print(f"ingest  segment writer (columns) {ingest['segment_writer_columns_rows_per_s']['median'] / 1e6:.2f} M rows/s   "
          f"(dicts) {ingest['segment_writer_rows_per_s']['median'] / 1e6:.2f} M rows/s   "
          f"capture->segments {ingest['capture_to_segments_rows_per_s']['median'] / 1e6:.2f} M rows/s   "
          f"plain DuckDB {ingest['plain_duckdb_rows_per_s']['median'] / 1e6:.2f} M rows/s", flush=True)
    del rows, column_sets

    store = base / "counts-store"
    t0 = time.perf_counter()
    make_counts_store(store, count_rows, files=100)
    gen_s = time.perf_counter() - t0
    q = query(store, reps)
    q.update(rows=count_rows, files=100, generate_s=gen_s)
    print(f"query   acceptance_by_position over {count_rows / 1e6:.0f} M rows: spectrace "
          f"{q['spectrace_s']['median']:.3f} s  plain DuckDB {q['plain_duckdb_s']['median']:.3f} s  "
          f"(cold {q['cold_spectrace_s']:.3f} / {q['cold_plain_s']:.3f} s)", flush=True)
    # the same rows in many small segments (a long-running store before any compaction)
    small_files = 200 if args.quick else 2000
    make_counts_store(store, count_rows, files=small_files)
    q_small = query(store, max(3, reps // 2))
    q_small.update(rows=count_rows, files=small_files)
    print(f"query   ... in {small_files} segments: spectrace {q_small['spectrace_s']['median']:.3f} s  "
          f"plain DuckDB {q_small['plain_duckdb_s']['median']:.3f} s", flush=True)
    shutil.rmtree(base, ignore_errors=True)

    result = {
        "seconds": round(time.time() - started, 1),
        "load_before": load_before,
        "load_after": loadavg(),
        "ingest": ingest,
        "query": q,
        "query_small_segments": q_small,
        "goal": {
            # verify rows reach the writer as columns (VerifyCapture._drain_engine -> extend_columns)
            "ingest_rows_per_s": ingest["segment_writer_columns_rows_per_s"]["median"],
            "met_1M_rows_per_s": ingest["segment_writer_columns_rows_per_s"]["median"] >= 1e6,
            "query_s": q["spectrace_s"]["median"],
            "met_query_under_1s": q["spectrace_s"]["median"] < 1.0,
        },
    }
    write_result("store", result)
    return result


if __name__ == "__main__":
    main()
