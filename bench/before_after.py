"""Store ingest before / after the fix, in one process, interleaved (robust to a noisy neighbour).

    .venv/bin/python -m bench.before_after [--quick]

"before" is bench/baseline/{verify,segments}_before.py (the code before the fix, frozen),
"after" is the installed spectrace. For each: (1) SegmentWriter.extend + flush of 1 M
verify_steps rows (dicts), (2) the background path for batch 64 and 256, k 5: hot-path step
tuples -> VerifyCapture.drain -> flush -> Parquet, per request-step and per engine step.
Both write byte-for-byte the same rows (checked here on the written segments).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from bench.common import BENCH, SCRATCH, freeze_heap, loadavg, spread, write_result


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def versions():
    from spectrace.exporters import segments
    from spectrace.tracer import verify

    before_seg = _load("spectrace_bench_segments_before", BENCH / "baseline" / "segments_before.py")
    before_ver = _load("spectrace_bench_verify_before", BENCH / "baseline" / "verify_before.py")
    return {"before": (before_ver, before_seg), "after": (verify, segments)}


def writer_ingest(seg, rows, root, chunk=100_000) -> float:
    shutil.rmtree(root, ignore_errors=True)
    writer = seg.SegmentWriter(root, host="bench-host", max_buffer_rows=200_000)
    t0 = time.perf_counter()
    written = 0
    for start in range(0, len(rows), chunk):
        writer.extend("verify_steps", rows[start:start + chunk])
        written += writer.flush()
    elapsed = time.perf_counter() - t0
    assert written == len(rows)
    return elapsed


def capture_ingest(ver, seg, batch, k, steps, root, steps_per_flush) -> tuple[float, float, int]:
    """(drain seconds, write seconds, verify_steps rows) for ``steps`` engine steps."""
    from bench.hotpath import build_inputs
    from spectrace.settings import Settings
    from spectrace.tracer import runtime

    shutil.rmtree(root, ignore_errors=True)
    settings = Settings(enabled=True, dir=root, max_buffer_rows=10**7)
    rt = runtime.Runtime(settings)
    rt.writer = seg.SegmentWriter(root, host="bench-host", max_buffer_rows=10**7)
    rt.set_run(runtime.Run(run_id="bench-run", traceparent=""))
    rt.ranks["engine_core"] = 0
    rt._build_telemetry("engine_core")
    capture = ver.VerifyCapture()
    ver.CAPTURE = capture
    hook = ver.wrap_update_from_output(lambda *a, **kw: None)
    runtime._runtime = rt
    so, mro, _, _ = build_inputs(batch, k)
    sched = SimpleNamespace(num_sampled_tokens_per_step=1)
    drain = write = 0.0
    for start in range(0, steps, steps_per_flush):
        for _ in range(min(steps_per_flush, steps - start)):
            hook(sched, so, mro)
        t0 = time.perf_counter()
        capture.drain(rt)
        t1 = time.perf_counter()
        rt.writer.flush()
        drain += t1 - t0
        write += time.perf_counter() - t1
    runtime._runtime = None
    assert rt.writer.dropped == 0
    return drain, write, steps * batch


def same_rows(root_a: Path, root_b: Path) -> bool:
    import duckdb

    con = duckdb.connect()
    for table in ("verify_steps", "verify_counts", "acceptance_lengths"):
        # ts is the wall clock at the hook call: different runs, different ts
        q = "SELECT * EXCLUDE (ts) FROM read_parquet('{}/{}/*/*.parquet') ORDER BY ALL"
        a = con.execute(q.format(root_a, table)).fetchall()
        b = con.execute(q.format(root_b, table)).fetchall()
        if a != b:
            return False
    return True


def main(argv=None) -> dict:
    from bench.store import verify_step_rows

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    reps = 3 if args.quick else 5
    n_rows = 200_000 if args.quick else 1_000_000
    impl = versions()
    from bench.hotpath import build_inputs

    build_inputs(1, 1)  # imports (vLLM's dataclasses)
    freeze_heap()  # as vLLM does once the engine is up
    base = SCRATCH / "before-after"
    load_before = loadavg()
    started = time.time()

    rows = verify_step_rows(n_rows)
    writer = {name: [] for name in impl}
    for rep in range(reps):
        for name in (list(impl) if rep % 2 == 0 else list(impl)[::-1]):
            writer[name].append(n_rows / writer_ingest(impl[name][1], rows, base / f"writer-{name}"))
    del rows
    out = {"segment_writer_rows_per_s": {name: spread(v) for name, v in writer.items()}}
    print("segment writer  " + "  ".join(f"{n} {spread(v)['median'] / 1e6:.2f} M rows/s" for n, v in writer.items()),
          flush=True)

    capture = {}
    for batch in (64, 256):
        steps = (50_000 if args.quick else 200_000) // batch
        per = {name: {"drain": [], "write": [], "rows": 0} for name in impl}
        for rep in range(reps):
            for name in (list(impl) if rep % 2 == 0 else list(impl)[::-1]):
                ver, seg = impl[name]
                d, w, n = capture_ingest(ver, seg, batch, 5, steps, base / f"capture-{name}", 100)
                per[name]["drain"].append(d / n)
                per[name]["write"].append(w / n)
                per[name]["rows"] = n
        assert same_rows(base / "capture-before", base / "capture-after"), "before and after wrote different rows"
        cell = {}
        for name, v in per.items():
            total = [d + w for d, w in zip(v["drain"], v["write"])]
            cell[name] = {
                "drain_us_per_request_step": spread([x * 1e6 for x in v["drain"]]),
                "write_us_per_request_step": spread([x * 1e6 for x in v["write"]]),
                "total_us_per_engine_step": spread([x * 1e6 * batch for x in total]),
                "rows_per_s": spread([1 / x for x in total]),
            }
        capture[f"batch_{batch}"] = cell
        print(f"capture->segments B={batch}  " + "  ".join(
            f"{n}: {c['rows_per_s']['median'] / 1e6:.2f} M rows/s, "
            f"{c['total_us_per_engine_step']['median']:.0f} µs/engine step "
            f"(drain {c['drain_us_per_request_step']['median']:.2f} + write {c['write_us_per_request_step']['median']:.2f} "
            f"µs/request-step)" for n, c in cell.items()), flush=True)
    out["capture_to_segments"] = capture
    out["identical_rows"] = True
    shutil.rmtree(base, ignore_errors=True)
    result = {"seconds": round(time.time() - started, 1), "reps": reps, "load_before": load_before,
              "load_after": loadavg(), **out}
    write_result("before_after", result)
    return result


if __name__ == "__main__":
    main()
