"""A simulated week of serving: today's layout (raw segments) against the compacted store.

One engine at batch 64, k 5, 30 steps/s, one flush a second, plus its worker: two real
store pipelines (`spectrace.testing.store_pipeline`) with a clock the benchmark controls. Per flush the engine core writes the
rows its drain writes (verify_counts per position and context bucket, acceptance_lengths,
verify_steps at `SPECTRACE_STEP_SAMPLE` 0.01, a span every 100 steps), the worker its
verify_counts. The first `--hours` simulated hours go through the real writers and the real
compaction cycle (every 60 simulated seconds, as `SPECTRACE_COMPACT_INTERVAL` defaults): that
measures the raw files per hour and the compaction CPU per hour. The rest of the week is
those compacted hours again, shifted in time (rows and names), so the week's compacted store
is what compaction writes; today's layout for the week is the measured raw hour times 168
(files and bytes), its query time measured over the raw hours it has. The last-hour queries
run as `spectrace query --since 1h` does (``open(since=...)``: the files older than the hour
are not handed to DuckDB; `EXPLAIN ANALYZE` counts the files read), and, for comparison,
with the `ts` predicate alone over every file.

    .venv/bin/python -m bench.week [--quick]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench.common import SCRATCH, loadavg, write_result
from spectrace import pipeline as pipelines
from spectrace.pipeline import Pipeline
from spectrace.store import compaction
from spectrace.testing import store_pipeline
from spectrace.store.read import files as store_files
from spectrace.store.read import open as open_store

HOUR = compaction.HOUR_NS
SEC = 10**9
BATCH, K, STEPS_PER_S = 64, 5, 30
BUCKETS = ["0-512", "512-1k"]
SAMPLE = 0.01
WEEK_H = 168

BY_POSITION = """select run_id, position, sum(drafted) d, sum(accepted) a from verify_counts
where source = 'engine_core' {where} group by all order by all"""
BY_CONTEXT = """select run_id, context_bucket, position, sum(drafted) d, sum(accepted) a from verify_counts
where source = 'engine_core' {where} group by all order by all"""


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _flush_rows(core: Pipeline, worker: Pipeline, clock: Clock, rng, run_id: str) -> None:
    ts = clock.now
    steps = STEPS_PER_S * BATCH
    accepted = rng.binomial(steps // len(BUCKETS), [0.8 ** (p + 1) for p in range(K)], size=(len(BUCKETS), K))
    for source, writer in (("engine_core", core), ("worker", worker)):
        n = len(BUCKETS) * K
        writer.extend_columns("verify_counts", {
            "ts": ts, "run_id": run_id, "source": source, "process_role": source, "pid": 1 if source == "engine_core" else 2,
            "position": [p for _ in BUCKETS for p in range(K)],
            "context_bucket": [b for b in BUCKETS for _ in range(K)],
            "drafted": [steps // len(BUCKETS)] * n, "accepted": accepted.reshape(-1).tolist(),
        }, n)
    core.extend_columns("acceptance_lengths", {
        "ts": ts, "run_id": run_id, "length": list(range(1, K + 2)),
        "count": rng.integers(0, steps, K + 1).tolist()}, K + 1)
    n = int(steps * SAMPLE)
    core.extend_columns("verify_steps", {
        "ts": ts, "run_id": run_id, "step": rng.integers(0, 1 << 30, n).tolist(), "context_len": rng.integers(1, 1000, n).tolist(),
        "num_drafted": [K] * n, "num_accepted": rng.integers(0, K + 1, n).tolist()}, n)
    if rng.random() < STEPS_PER_S / 100:
        core.append("spans", {"run_id": run_id, "name": "spectrace.verify.step", "start_time": ts, "end_time": ts})


def _files(root: Path) -> tuple[int, int]:
    n = size = 0
    for path in root.rglob("*.parquet"):
        n += 1
        size += path.stat().st_size
    return n, size


def _time(con, sql: str, reps: int = 5) -> tuple[float, float, list]:
    times, rows = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        rows = con.execute(sql).fetchall()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times[0], rows


def _files_read(plan: str) -> int:
    """Files the scans of an ``EXPLAIN ANALYZE`` opened."""
    return sum(int(n.replace(",", "")) for n in re.findall(r"Total Files Read: ([\d,]+)", plan))


def simulate(root: Path, hours: float, start_ns: int, seed: int = 0) -> dict:
    """Real writers, real compaction cycles, a simulated clock; returns CPU and counts."""
    clock = Clock(start_ns)
    writers = []
    for host in ("engine", "worker"):
        # compaction is driven below, once a simulated minute; retention is off (the week is kept)
        writers.append(store_pipeline(root, host=host, clock=clock, retention_s=0, compact_interval_s=60))
    core, worker = writers
    rng = np.random.default_rng(seed)
    flush_cpu = compact_cpu = 0.0
    raw_files_written = 0
    for second in range(int(hours * 3600)):
        _flush_rows(core, worker, clock, rng, "week")
        t0 = time.thread_time()
        for writer in writers:
            writer.flush()
        flush_cpu += time.thread_time() - t0
        clock.now += SEC
        if (second + 1) % 60 == 0:  # SPECTRACE_COMPACT_INTERVAL=60
            for writer in writers:
                writer.maintain()
    stores = [w.sink("duckdb") for w in writers]
    compact_cpu = sum(s.compaction_cpu_s for s in stores)
    raw_files_written = sum(s.segments_written for s in stores)
    return {"flush_cpu_s": flush_cpu, "compaction_cpu_s": compact_cpu, "raw_files_written": raw_files_written,
            "end_ns": clock.now, "errors": sum(s.compaction_errors for s in stores)}


_SHIFT = re.compile(r"^(?P<w>.+-\d+)-(?P<lo>\d+)-(?P<hi>\d+)-(?P<made>\d+)\.hour\.parquet$")


def replicate_week(root: Path, hour_start_ns: int) -> None:
    """Copies of the simulated hour's hour files, shifted back by whole hours: the week."""
    hour_files = [p for p in root.rglob("*.hour.parquet") if int(_SHIFT.match(p.name)["lo"]) // HOUR == hour_start_ns // HOUR]
    for path in hour_files:
        table = pq.read_table(path)
        m = _SHIFT.match(path.name)
        for back in range(1, WEEK_H):
            shift = back * HOUR
            shifted = table
            for name in ("ts", "start_time", "end_time"):
                if name in table.column_names:
                    col = table.column(name)
                    shifted = shifted.set_column(
                        shifted.schema.get_field_index(name), name,
                        pc.subtract(col.cast(pa.int64()), pa.scalar(shift, pa.int64())).cast(col.type),
                    )
            name = f"{m['w']}-{int(m['lo']) - shift}-{int(m['hi']) - shift}-{int(m['made']) - shift}.hour.parquet"
            pq.write_table(shifted, path.with_name(name), row_group_size=compaction.ROW_GROUP)  # as compaction writes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--arrow-pool", choices=["spectrace", "default"], default="spectrace",
                        help="the Arrow pool the writers build their tables in: spectrace's (spectrace.pipeline.POOL, the "
                             "system allocator) or Arrow's default (mimalloc), to compare the two")
    parser.add_argument("--name", default="week", help="results file: bench/results/<name>.json")
    args = parser.parse_args(argv)
    if args.arrow_pool == "default":
        pipelines.POOL = pa.default_memory_pool()
    hours = 0.25 if args.quick else 1.0
    load0 = loadavg()
    base = SCRATCH / "week"
    shutil.rmtree(base, ignore_errors=True)
    compacted_root, raw_root = base / "compacted", base / "raw"
    base.mkdir(parents=True)  # a store's writer makes its own folder, not the folders above it
    # the simulated week ends 5 minutes before now, its last simulated hour starting on the hour
    end = (time.time_ns() - 5 * 60 * SEC) // HOUR * HOUR
    first = end - HOUR
    t0 = time.time()
    sim = simulate(compacted_root, hours, first)
    # one more cycle after the hour's end closes it (an hour file), then the inputs go
    for host in ("engine", "worker"):
        pid = os.getpid()
        compaction.Compactor(compacted_root, lambda s, h=host: s.writer == f"{h}-{pid}", closed=lambda h, n: True,
                             clock=lambda: first + HOUR + 60 * SEC).cycle()
    time.sleep(2 * compaction.READY_S + 1)
    compaction.Compactor(compacted_root, lambda s: True, closed=lambda h, n: True).cycle()
    hour_files, hour_bytes = _files(compacted_root)
    replicate_week(compacted_root, first)
    week_files, week_bytes = _files(compacted_root)
    simulated_s = time.time() - t0
    # today's layout: the same hour through a writer that never compacts
    raw_sim_t0 = time.time()
    clock = Clock(first)
    writers = []
    for host in ("engine", "worker"):
        writers.append(store_pipeline(raw_root, host=host, clock=clock, retention_s=0, compact_interval_s=0))
    rng = np.random.default_rng(0)
    for _ in range(int(hours * 3600)):
        _flush_rows(writers[0], writers[1], clock, rng, "week")
        for w in writers:
            w.flush()
        clock.now += SEC
    raw_files, raw_bytes = _files(raw_root)
    raw_sim_s = time.time() - raw_sim_t0

    since = end - HOUR
    last_hour = f"and ts >= make_timestamp_ns({since})"
    con_c, con_r = open_store(compacted_root), open_store(raw_root)
    result = {"hours_simulated": hours, "batch": BATCH, "k": K, "steps_per_s": STEPS_PER_S, "step_sample": SAMPLE,
              "load_before": load0, "simulate_s": round(simulated_s, 1), "raw_simulate_s": round(raw_sim_s, 1),
              "compaction_errors": sim["errors"]}
    per_hour = 1 / hours
    result["compaction_cpu_s_per_hour"] = sim["compaction_cpu_s"] * per_hour
    result["flush_cpu_s_per_hour"] = sim["flush_cpu_s"] * per_hour
    result["compaction_core_share"] = result["compaction_cpu_s_per_hour"] / 3600
    result["compacted"] = {"files_week": week_files, "bytes_week": week_bytes, "files_per_hour": hour_files}
    result["raw"] = {"files_hour": raw_files * per_hour, "bytes_hour": raw_bytes * per_hour,
                     "files_week": raw_files * per_hour * WEEK_H, "bytes_week": raw_bytes * per_hour * WEEK_H}
    # the reader lists the store's files (names only) before every query: its cost on the week
    listings = []
    for _ in range(20):
        t0 = time.perf_counter()
        store_files(compacted_root)
        listings.append(time.perf_counter() - t0)
    result["listing_week_s"] = statistics.median(listings)
    queries = {}
    for name, sql in (("by_position", BY_POSITION), ("by_context", BY_CONTEXT)):
        week_t, week_cold, week_rows = _time(con_c, sql.format(where=""))
        # the last hour as `spectrace query --since 1h` runs it: files older than the hour are not listed
        # (a fresh connection, so its first run is cold); the ts predicate stays
        with open_store(compacted_root, since=since) as con_h:
            hour_t, hour_cold, hour_rows = _time(con_h, sql.format(where=last_hour))
        all_t, all_cold, all_rows = _time(con_c, sql.format(where=last_hour))
        raw_t, raw_cold, raw_rows = _time(con_r, sql.format(where=""), reps=3)
        queries[name] = {"compacted_week_s": week_t, "compacted_week_cold_s": week_cold,
                         "compacted_last_hour_s": hour_t, "compacted_last_hour_cold_s": hour_cold,
                         "compacted_last_hour_without_since_s": all_t, "compacted_last_hour_without_since_cold_s": all_cold,
                         "raw_simulated_hours_s": raw_t, "raw_simulated_hours_cold_s": raw_cold,
                         "last_hour_equals_raw": hour_rows == raw_rows,
                         "last_hour_same_without_since": all_rows == hour_rows,
                         "week_is_168_hours": [r[-2] for r in week_rows] == [r[-2] * WEEK_H / hours for r in raw_rows]
                         if hours == 1.0 else None}
    result["queries"] = queries
    with open_store(compacted_root, since=since) as con_h:
        plan = con_h.execute("explain analyze " + BY_POSITION.format(where=last_hour)).fetchall()[0][1]
    plan_without = con_c.execute("explain analyze " + BY_POSITION.format(where=last_hour)).fetchall()[0][1]
    last_hour_files = sorted(Path(p).name for p in store_files(compacted_root, since=since)["verify_counts"])
    result["last_hour_files"] = {
        "verify_counts_files": sum(1 for _ in (compacted_root / "verify_counts").glob("*/*.parquet")),
        "listed_with_since": last_hour_files,
        "read_with_since": _files_read(plan),  # EXPLAIN ANALYZE: Total Files Read
        "read_without_since": _files_read(plan_without),
        "all_of_the_last_hour": all(compaction.parse(Path(n)).lo >= since for n in last_hour_files),
    }
    result["last_hour_plan_excerpt"] = [line.strip("│ ").strip() for line in plan.splitlines()
                                        if re.search(r"Scanning Files|Total Files Read|rows|File Filters|Filters", line)][:40]
    result["load_after"] = loadavg()
    result["arrow_pool"] = pipelines.POOL.backend_name
    write_result(args.name, result)
    print({k: v for k, v in result.items() if k != "last_hour_plan_excerpt"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
