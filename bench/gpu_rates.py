"""What tracing costs an engine at GPU rates: the real capture and pipeline beside a GIL-bound engine loop.

    .venv/bin/python -m bench.gpu_rates                 # inprocess and production at three points (~17 min on 2 cores)
    .venv/bin/python -m bench.gpu_rates --quick         # a smoke run (~1 min, no compaction cycle)
    .venv/bin/python -m bench.gpu_rates --shapes production --points 256x50 512x100

Method. A CPU engine does ~1 k request-steps/s; a GPU engine at batch 256 does 10-25 k. No GPU
here, so the engine is stood in for: one Python thread (the process's main thread) that, per
step, does a fixed amount of pure-Python work (GIL-bound, ``--busy`` of the step period, calibrated
once untraced) and sleeps until the next step is due (the wait on the device: the GIL is released),
so it holds ``rate`` steps/s as an engine at that rate does. Around that work it calls spectrace's
real hook wrappers as vLLM's engine core calls them in one uniprocess engine (add_request for the
requests that arrive, execute_model, sample_tokens with _bookkeeping_sync and
propose_draft_token_ids inside it, update_from_output), with vLLM's own dataclasses
(SchedulerOutput, CachedRequestData, ModelRunnerOutput; as bench/hotpath.py builds them) for
``batch`` requests drafting ``k`` tokens each (acceptance 0.7 per position), requests arriving and
finishing (lifetime ~``--lifetime`` steps), a ring of distinct steps whose objects each step makes anew, as vLLM
does (``fresh_step``, part of the engine's own work; ``--objects ring`` reuses the ring's, last touched a ring of
steps before: each object the hooks read is then a cache miss that vLLM's just-made objects are not, 77 against
63 µs a step at 256 x 50). The pipeline is the real one:
``runtime.start`` with real ``Settings`` (every default sink: Parquet segments of the duckdb store
and the Prometheus exposition; compaction on its default interval; the default flush interval).

A step's time is from when it is due (the previous step's start plus the period, or the end of
the previous step when that was later) to the end of its work: the GIL wait on waking counts. It splits into the
engine thread's CPU, its waits for a core (schedstat's run delay) and the rest (the GIL); the CPU splits again into
the engine's own work (``fixed_work`` and ``fresh_step``, where no spectrace code runs: traced, it changes only by
what the rest of the machine does to it, caches and cores) and everything else (the hooks and the stand-in's calls
around them). The engine thread gets a CPU of its own (``--pin apart``, the default on two CPUs or more: every other
thread, and the pipeline process, on the others), as a GPU host's spare cores give vLLM's busy engine thread; left
to the OS (``--pin none``, results before 2026-12-04), this 2-core machine moves it between CPUs, and its own work
ran ~20 % slower and drifted with whatever else ran.
Tracing is switched off and on at run time (``runtime.pause()`` / ``resume()``) in windows of
``--window`` seconds (0.5: short windows pair better on this machine, whose speed drifts over seconds; 150 pairs
resolve a slowdown to about ±1.5 %, where 16 pairs of 2 s windows gave ±5), in pairs ordered on/off, off/on, ...
(ABBA, as bench/ab_windows.py); each
pair gives the ratio of mean step times, traced over paused; the slowdown is their geometric mean
with a 95 % t interval. Per window the process's CPU clock minus the engine thread's
(``time.thread_time``) is the background: the flush thread and every other thread spectrace runs,
as % of one core; each pair gives traced minus paused. Memory is the resident size at every window
boundary. Rows, files and bytes per hour are what the store holds at the end (after the final
flush) over the seconds traced. Where the flush time goes: bench/profile_flush.py's phase timers
(thread CPU per phase), installed in the process that runs the pipeline.

Shapes (``--shapes``):

* ``inprocess`` -- ``SPECTRACE_PIPELINE=thread`` (vLLM's CPU platform): the flush thread (drain, Arrow, Parquet,
  exposition, compaction) runs in the engine's process and shares its GIL.
* ``production`` -- as shipped (``SPECTRACE_PIPELINE=process``): the engine's process keeps the hooks and the real
  shipper, a real pipeline process does the rest; ``--ship-phases`` times the shipper's phases with its thread's
  CPU clock, ``--ship-interval`` sets ``SPECTRACE_SHIP_INTERVAL``, ``--ship-pauses off`` drops its pauses for the GIL.
(The ``child`` shape of results before 2026-12-07 was a prototype with a shipper of its own; the production shape
uses the product's shipper, ``spectrace.recorder.shipper``, and its pipeline process, ``spectrace.collector.process``.)

Probes (``--probe``, the production shape only, combinable; ``PROBES`` says what each changes): variants that say
where a slowdown of the engine's own work comes from -- tracing paused in both windows (``null``), the hooks' records
dropped as they are appended (``hooks-only``), hook bodies skipped (``no-hook-bodies``, ``no-worker-hooks``,
``no-engine-hooks``), an engine loop that allocates nothing (``work-without-allocation``), other Python in the paused
windows (``foreign-code``), the pipeline process stopped in the traced windows (``pipeline-stopped``). Results of
2026-12-05: BENCHMARKS.md, "At GPU rates on another VM".

Each job (shape x point) runs in its own process, forked from this one after vLLM's dataclasses
are imported (12 s) and the heap frozen (as vLLM's engine core does): a fresh Runtime per job.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import shutil
import signal
import statistics
import sys
import threading
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from bench.ab_windows import mean_ci, paired, summary  # mean_ci: also bench.gpu_rates.mean_ci for its users
from bench.common import SCRATCH, freeze_heap, loadavg, write_result

# -- spectrace's entry points this benchmark drives: the one place to update when they move -----------
from spectrace.settings import Settings
from spectrace.recorder import runtime
from spectrace.recorder.verify import VerifyCapture
from spectrace.recorder.verify.hooks import _timed as wrap_timed
from spectrace.recorder.verify import wrap_add_request, wrap_bookkeeping_sync, wrap_execute_model, wrap_update_from_output


def settings_for(store: Path) -> Settings:
    """Every default (sinks, flush interval, compaction, retention); only the paths are ours."""
    return Settings(enabled=True, dir=store, metrics_dir=store.parent / "metrics")


def start_runtime(settings: Settings, make_capture, run_id: str):
    rt = runtime.start(settings, make_capture=make_capture)
    rt.set_run(runtime.Run(run_id=run_id, traceparent=""))
    rt.enter_role("engine_core")
    return rt


# ------------------------------------------------------------------------------------------------------

POINTS = ("256x50", "512x50", "512x100")
CALIBRATION_STEPS = 60
# issue #34's goals at 256 x 50, k 7: a slowdown (and one without core waits) of at most 0.5 % whose 95 % upper bound
# is at most 1 %, the GIL wait at most 0.02 ms a step, the engine process's background at most 1 % of a core, the
# pipeline process at most 5 % of a core
GOAL = {"point": "256x50", "k": 7, "slowdown": 0.005, "slowdown_ci_high": 0.01, "gil_wait_ms": 0.02,
        "background_core": 0.01, "pipeline_core": 0.05}


def _take(queue: deque) -> list:
    return [queue.popleft() for _ in range(len(queue))]


def build_ring(batch: int, k: int, n_steps: int, lifetime: int, seed: int = 0) -> list[tuple]:
    """``n_steps`` distinct engine steps of ``batch`` requests: (SchedulerOutput, ModelRunnerOutput,
    what _bookkeeping_sync returns, the requests that arrive before the step)."""
    from vllm import SamplingParams
    from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput
    from vllm.v1.outputs import ModelRunnerOutput

    rng = random.Random(seed * 7919 + batch * 31 + k)
    greedy, sampled_params = SamplingParams(temperature=0.0), SamplingParams(temperature=0.8)

    def arrive():
        rid = f"cmpl-{rng.getrandbits(64):016x}-0"
        request = SimpleNamespace(request_id=rid, sampling_params=greedy if rng.random() < 0.5 else sampled_params,
                                  use_structured_output=False, trace_headers=None, lora_request=None)
        return rid, rng.randrange(64, 4096), rng.randrange(lifetime // 2, lifetime * 3 // 2 + 1), request

    slots = [list(arrive()) for _ in range(batch)]
    for slot in slots:
        slot[2] = rng.randrange(1, lifetime + 1)  # start mid-life, staggered
    steps = []
    for _ in range(n_steps):
        new = []
        for i, slot in enumerate(slots):
            if slot[2] <= 0:
                slots[i] = slot = list(arrive())
                new.append(slot[3])
        req_ids = [slot[0] for slot in slots]
        drafts = {rid: [rng.randrange(32000) for _ in range(k)] for rid in req_ids}
        accepted = []
        for _ in req_ids:
            a = 0
            while a < k and rng.random() < 0.7:
                a += 1
            accepted.append(a)
        sampled = [[rng.randrange(32000) for _ in range(a + 1)] for a in accepted]
        index = {rid: i for i, rid in enumerate(req_ids)}
        cached = CachedRequestData(
            req_ids=list(req_ids), resumed_req_ids=set(), new_token_ids=[], all_token_ids={},
            new_block_ids=[None] * batch, num_computed_tokens=[slot[1] for slot in slots],
            num_output_tokens=[rng.randrange(1, 512) for _ in req_ids],
        )
        so = SchedulerOutput(
            scheduled_new_reqs=[], scheduled_cached_reqs=cached, num_scheduled_tokens={rid: k + 1 for rid in req_ids},
            total_num_scheduled_tokens=batch * (k + 1), scheduled_spec_decode_tokens=drafts,
            scheduled_encoder_inputs={}, finished_req_ids=set(), free_encoder_mm_hashes=[], num_invalid_spec_tokens=None,
        )
        mro = ModelRunnerOutput(req_ids=list(req_ids), req_id_to_index=index, sampled_token_ids=sampled)
        # what _bookkeeping_sync returns: valid_sampled_token_ids at [3], req_id_to_index at [6] -- the very
        # objects the ModelRunnerOutput is built from (gpu_model_runner.py: req_id_to_index_output_copy)
        book = ({}, None, None, mro.sampled_token_ids, {}, mro.req_ids, mro.req_id_to_index, None)
        steps.append((so, mro, book, new))
        for slot, a in zip(slots, accepted):
            slot[1] += a + 1
            slot[2] -= 1
    return steps


def fresh_step(step: tuple) -> tuple:
    """A ring step's objects made anew, as vLLM makes them every step: the scheduler's output (its draft dict, the
    cached requests' lists), the model runner's (the sampled lists, the row index) and what ``_bookkeeping_sync``
    returns (the same lists). The hooks read them as they read vLLM's, just made and in the caches; a ring's own
    objects, last touched a ring ago, cost them a cache miss each (``--objects ring``, as before 2026-12-04)."""
    so, mro, book, new = step
    so, mro = copy.copy(so), copy.copy(mro)
    cached = so.scheduled_cached_reqs = copy.copy(so.scheduled_cached_reqs)
    cached.req_ids, cached.num_computed_tokens = list(cached.req_ids), list(cached.num_computed_tokens)
    drafts = so.scheduled_spec_decode_tokens
    so.scheduled_spec_decode_tokens = dict(zip(drafts, map(list, drafts.values())))
    mro.req_ids, mro.req_id_to_index = list(mro.req_ids), dict(mro.req_id_to_index)
    mro.sampled_token_ids = list(map(list, mro.sampled_token_ids))
    book = book[:3] + (mro.sampled_token_ids, book[4], mro.req_ids, mro.req_id_to_index) + book[7:]
    return so, mro, book, new


class _Request:
    __slots__ = ("n", "last")

    def __init__(self) -> None:
        self.n, self.last = 0, None


# ``--probe``: variants of the production shape that say where a slowdown of the engine's own work comes from
# (BENCHMARKS.md, "At GPU rates on another VM"); combinable, never part of a result of record.
PROBES = {
    "null": "tracing stays paused in both windows of every pair: what the comparison reads where nothing differs",
    "hooks-only": "every capture queue drops what the hooks append (a deque of length 0): the hooks run, nothing "
                  "they record is held past them or shipped",
    "no-hook-bodies": "every hook finds no runtime, traced or not (runtime.active returns None): the wrappers alone",
    "no-worker-hooks": "as no-hook-bodies for the worker's hooks only",
    "no-engine-hooks": "as no-hook-bodies for the engine core's hooks only",
    "work-without-allocation": "the engine's own work allocates nothing (small ints only; calibrated like the other)",
    "foreign-code": "paused windows run ~20 µs a step of Python that is not spectrace's, reading the step's objects "
                    "as the hooks do",
    "pipeline-stopped": "the pipeline process is stopped (SIGSTOP) in traced windows and resumed in paused ones: "
                        "its work moves to the paused windows",
}
CAPTURE_QUEUES = ("engine_steps", "worker_steps", "worker_timings", "host_steps", "new_requests", "proposals", "finished")
_foreign_sink: list = []


def foreign_code(so, mro) -> None:
    """``--probe foreign-code``: about what the hooks do on a step (lists of the rows' lengths, a record), not theirs."""
    for _ in range(6):
        lengths = list(map(len, mro.sampled_token_ids))
        drafts = getattr(so, "scheduled_spec_decode_tokens", None)
        _foreign_sink.append((time.time_ns(), len(drafts or ()), lengths, mro.req_id_to_index, so.scheduled_cached_reqs))
        _foreign_sink.clear()


def skip_hook_bodies(probes: set) -> None:
    """``--probe no-*-hooks``: the named hooks find no runtime whether tracing is on or not."""
    active = runtime.active
    if "no-hook-bodies" in probes:
        runtime.active = lambda hook: None
    elif "no-worker-hooks" in probes:
        runtime.active = lambda hook: None if hook.startswith("worker.") else active(hook)
    elif "no-engine-hooks" in probes:
        runtime.active = lambda hook: None if hook.startswith("engine_core.") else active(hook)


def fixed_work_without_allocation(requests: list, reps: int) -> int:
    """``--probe work-without-allocation``: ``fixed_work``'s loop over the same objects, with small ints only."""
    total = 0
    for _ in range(reps):
        for r in requests:
            r.n = (r.n + 1) & 127
            total = (total + (r.n & 7)) & 127
            r.last = r.n
    return total


def fixed_work(requests: list, reps: int) -> int:
    """The engine thread's own per-step Python (scheduling, output processing): GIL-bound."""
    total = 0
    for _ in range(reps):
        for r in requests:
            r.n += 1
            total += r.n & 7
            r.last = (total, r.n)
    return total


def pin_apart(child_pid: int | None, cpus: list[int], with_engine: tuple = ()) -> None:
    """``--pin apart``: the engine thread on the first of ``cpus`` (the CPUs the job may use, read before the first
    pinning), every other thread of this process and the pipeline process's on the others -- a host where the engine
    thread has a core to itself (a GPU host's spare cores). Applied at every window's start: a thread started since
    then inherits its creator's CPUs. ``with_engine``: names of this process's threads placed on the engine thread's
    CPU instead (``--pin shipper-with-engine``: the shipper's thread)."""
    engine, rest = {cpus[0]}, set(cpus[1:])
    me = threading.get_native_id()
    beside = {t.native_id for t in threading.enumerate() if t.name in with_engine}
    for tasks in ("/proc/self/task", f"/proc/{child_pid}/task" if child_pid else None):
        if tasks is None:
            continue
        for tid in os.listdir(tasks):
            try:
                os.sched_setaffinity(int(tid), engine if int(tid) == me or int(tid) in beside else rest)
            except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
                pass


class Engine:
    """The engine thread: fixed work per step around spectrace's real hooks, paced to ``rate``."""

    def __init__(self, batch: int, k: int, rate: float, busy: float, lifetime: int, fresh: bool = True,
                 probes: frozenset = frozenset()) -> None:
        self.period = 1.0 / rate
        own = fixed_work_without_allocation if "work-without-allocation" in probes else fixed_work
        self.foreign = "foreign-code" in probes
        self.fresh = fresh  # each step's vLLM objects made anew (fresh_step), as the engine's own work
        self.ring = build_ring(batch, k, n_steps=max(64, int(2 * rate)), lifetime=lifetime)
        self.requests = [_Request() for _ in range(batch)]
        self.reps = 1
        self.sched = SimpleNamespace(num_sampled_tokens_per_step=1, log_stats=True, num_spec_tokens=k)
        self.runner = SimpleNamespace()
        self.i = 0
        self.current = self.ring[0]
        self.due = 0.0
        self.last_end = 0.0
        self.work_cpu_ns = 0  # the engine thread CPU in its own work (fixed_work, fresh_step): no spectrace code
        self.work_calls: list[int] = []  # each fixed_work call's CPU, ns (the window's median: is a slowdown uniform?)

        def work() -> None:
            started = time.thread_time_ns()
            own(self.requests, self.reps)
            took = time.thread_time_ns() - started
            self.work_cpu_ns += took
            self.work_calls.append(took)

        def execute_model(runner, scheduler_output, *args, **kwargs):
            work()  # the first half: scheduling, input preparation
            return None

        def bookkeeping_sync(runner, scheduler_output, *args, **kwargs):
            return self.current[2]

        def propose_draft_token_ids(runner, *args, **kwargs):
            return None

        def sample_tokens(runner, grammar_output=None):
            self.bookkeeping(runner, self.current[0])
            self.propose(runner, self.current[0])
            return self.current[1]

        def update_from_output(sched, scheduler_output, model_runner_output, *args, **kwargs):
            work()  # the second half: output processing
            return {}

        def add_request(sched, request, *args, **kwargs):
            return None

        self.execute = wrap_execute_model(execute_model, "worker.execute_model")
        self.bookkeeping = wrap_bookkeeping_sync(bookkeeping_sync, "worker.verify")
        self.propose = wrap_timed("draft_ns", False)(propose_draft_token_ids, "worker.propose_drafts")
        self.sample = wrap_timed("sample_ns", True)(sample_tokens, "worker.sample_tokens")
        self.update = wrap_update_from_output(update_from_output, "engine_core.verify")
        self.add = wrap_add_request(add_request, "engine_core.add_request")

    def step(self) -> None:
        step = self.ring[self.i % len(self.ring)]
        if self.fresh:
            started = time.thread_time_ns()
            step = fresh_step(step)
            self.work_cpu_ns += time.thread_time_ns() - started
        so, mro, book, new = self.current = step
        self.i += 1
        if self.foreign and runtime._runtime is None:  # paused: code of about the hooks' size, not spectrace's
            foreign_code(so, mro)
        for request in new:
            self.add(self.sched, request)
        self.execute(self.runner, so)
        self.sample(self.runner, None)
        self.update(self.sched, so, mro)

    def calibrate(self, busy: float) -> None:
        """Work repetitions so that an untraced step takes ``busy`` of the period in CPU time of this
        thread (median of several; CPU, so a neighbour's load on the machine does not move it)."""
        target = busy * self.period
        self.reps = 1
        for _ in range(CALIBRATION_STEPS // 15):
            times = []
            for _ in range(15):
                t0 = time.thread_time()
                self.step()
                times.append(time.thread_time() - t0)
            per_step = statistics.median(times)
            self.reps = max(1, round(self.reps * target / per_step))

    def run(self, seconds: float) -> list[float]:
        """Paced steps for ``seconds`` (whole steps); each one's time from when it was due to the end of its work."""
        out = []
        now = time.perf_counter()
        if self.due < now:  # after a pause between windows: start now
            self.due = now
        end_by = now + seconds
        while self.due < end_by:
            wait = self.due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            self.step()
            end = time.perf_counter()
            out.append(end - self.due)
            self.due = max(self.due + self.period, end)  # an engine that overran starts at once
        return out


def _install_profile():
    """bench/profile_flush.py's phase timers (thread CPU per flush phase), or the reason they are not."""
    try:
        from bench import profile_flush

        profile_flush.CPU.clear()
        profile_flush.CALLS.clear()
        profile_flush.instrument()
        return profile_flush
    except Exception as exc:  # the pipeline's internals moved: the measurement itself still runs
        return f"unavailable: {type(exc).__name__}: {exc}"


def _profile_totals(profile) -> dict | str:
    if isinstance(profile, str):
        return profile
    return {name: {"cpu_ms": round(cpu * 1e3, 2), "calls": profile.CALLS[name]} for name, cpu in profile.CPU.most_common()}


def _proc_cpu_s(pid: int) -> float:
    """CPU seconds of every thread of ``pid`` (schedstat: ns on CPU)."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    except OSError:
        pass
    return total / 1e9


def _thread_sched(tid: int) -> tuple[float, float]:
    """(seconds on CPU, seconds runnable but waiting for a core) of one thread."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            on_cpu, run_delay, _ = f.read().split()
        return int(on_cpu) / 1e9, int(run_delay) / 1e9
    except (OSError, ValueError):
        return float("nan"), float("nan")


def _rss_mb(pid: int | str = "self") -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except OSError:
        return float("nan")


def _thread_cpu() -> dict[str, float]:
    out: dict[str, float] = {}
    for t in threading.enumerate():
        try:
            out[t.name] = out.get(t.name, 0.0) + time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, TypeError, AttributeError):
            pass
    return out


def store_totals(store: Path) -> dict:
    """Files and bytes on disk per table, and the rows the store's reader sees (``spectrace.store.open``:
    a compacted store holds merged files beside raw ones it has not removed yet; the reader counts each row once)."""
    import spectrace.store

    tables: dict[str, dict[str, int]] = {}
    for path in store.rglob("*.parquet"):
        t = tables.setdefault(path.relative_to(store).parts[0], {"files": 0, "rows": 0, "bytes": 0})
        t["files"] += 1
        t["bytes"] += path.stat().st_size
    con = spectrace.store.open(store)
    try:
        for table, t in tables.items():
            t["rows"] = con.sql(f"select count(*) from {table}").fetchone()[0]
    finally:
        con.close()
    total = {key: sum(t[key] for t in tables.values()) for key in ("files", "rows", "bytes")}
    return {"tables": tables, **total}


# -- one job -------------------------------------------------------------------------------------------


def time_ship_phases() -> Callable[[], dict]:
    """The shipper's phases timed with its thread's CPU clock (``--ship-phases``; bench/profile_flush.py's timers, unused
    in an engine process whose pipeline runs elsewhere): the whole ``ship`` (collecting, pickling with its pauses,
    writing), collecting and, inside it, reading new requests' parameters and the state; pickling, and inside it the
    pauses for the GIL; writing the frame; reading acknowledgements. Returns a function that reads them:
    {phase: (cpu_ms, calls)}."""
    from bench import profile_flush
    from spectrace.recorder import shipper

    timed = profile_flush.timed
    pause = timed("pickle: pauses for the GIL", time.sleep)
    dumps = shipper.dumps_shipment
    shipper.dumps_shipment = timed("pickle", lambda shipment: dumps(shipment, pause=pause))
    shipper.write_frame = timed("write", shipper.write_frame)
    cls = shipper.Shipper
    for name, label in (("ship", "ship"), ("collect", "collect"), ("_requests", "collect: requests"),
                        ("_state", "collect: state"), ("_drain_acks", "acknowledgements")):
        setattr(cls, name, timed(label, getattr(cls, name)))
    return lambda: {name: (cpu * 1e3, profile_flush.CALLS[name]) for name, cpu in profile_flush.CPU.items()}


def job(shape: str, batch: int, rate: float, args, out: Path) -> None:
    k = args.k
    name = f"{shape}-{batch}x{rate:g}"
    work = SCRATCH / "gpu_rates" / name
    shutil.rmtree(work, ignore_errors=True)
    store = work / "store"
    store.mkdir(parents=True)
    run_id = f"bench-gpu-rates-{name}"
    probes = frozenset(args.probe)
    engine = Engine(batch, k, rate, args.busy, args.lifetime, fresh=args.objects == "fresh", probes=probes)
    child_pid = None
    shipping = None
    ship_phases = None
    if shape == "production":  # SPECTRACE_PIPELINE=process: the shipped shape, the real shipper and pipeline process
        from dataclasses import replace

        profile = "in the pipeline process"
        if args.ship_pauses == "off":
            from spectrace.recorder import wire

            wire.YIELD_S = 0
        ship_phases = time_ship_phases() if args.ship_phases else None
        settings = replace(settings_for(store), pipeline="process")
        if args.ship_interval is not None:  # SPECTRACE_SHIP_INTERVAL
            settings = replace(settings, ship_interval_s=args.ship_interval)
        rt = start_runtime(settings, VerifyCapture, run_id)
        if "hooks-only" in probes:
            for queue in CAPTURE_QUEUES:
                setattr(rt.verify, queue, deque(maxlen=0))
        skip_hook_bodies(probes)
        shipping = rt.pipeline.shipper
        child_pid = shipping.proc.pid
        if args.pipeline_nice:  # below the engine's priority (not what spectrace does: measured, not shipped)
            os.setpriority(os.PRIO_PROCESS, child_pid, os.getpriority(os.PRIO_PROCESS, 0) + args.pipeline_nice)
    else:
        profile = _install_profile()
        rt = start_runtime(settings_for(store), VerifyCapture, run_id)
    started = time.perf_counter()
    windows_started = False
    cpus = sorted(os.sched_getaffinity(0))  # before the first pinning narrows this thread's
    with_engine = ("spectrace-ship",) if args.pin == "shipper-with-engine" else ()
    if args.pin != "none":
        pin_apart(child_pid, cpus, with_engine)

    def set_tracing(on: bool) -> None:
        if "null" in probes and windows_started:
            on = False
        (runtime.resume if on else runtime.pause)()
        if "pipeline-stopped" in probes and windows_started:
            os.kill(child_pid, signal.SIGSTOP if on else signal.SIGCONT)

    # calibrate the work untraced, then warm the pipeline up traced (first flush, first Arrow set-up)
    set_tracing(False)
    engine.calibrate(args.busy)
    set_tracing(True)
    engine.run(args.warmup)
    traced_s, traced_steps = args.warmup * 1.0, engine.i
    windows = []
    windows_started = True
    pid, tid = os.getpid(), threading.get_native_id()
    rss_series = [_rss_mb()]
    child_rss_series = [_rss_mb(child_pid)] if child_pid else []
    backlog: list[int] = []
    try:
        for pair in range(args.pairs):
            order = (True, False) if pair % 2 == 0 else (False, True)
            for traced in order:
                set_tracing(traced)
                if args.pin != "none":
                    pin_apart(child_pid, cpus, with_engine)
                work0 = engine.work_cpu_ns
                engine.work_calls = []
                cpu0, main0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
                child0 = _proc_cpu_s(child_pid) if child_pid else 0.0
                delay0 = _thread_sched(tid)[1]
                step_times = engine.run(args.window)
                wall = time.perf_counter() - wall0
                cpu, main = time.process_time() - cpu0, time.thread_time() - main0
                work_cpu = (engine.work_cpu_ns - work0) / 1e9
                run_delay = _thread_sched(tid)[1] - delay0
                child_cpu = _proc_cpu_s(child_pid) - child0 if child_pid else 0.0
                if traced:
                    traced_s += wall
                    traced_steps += len(step_times)
                st = sorted(step_times)
                windows.append({
                    "pair": pair, "traced": traced, "steps": len(step_times), "wall_s": wall,
                    "step_ms_mean": statistics.fmean(step_times) * 1e3, "step_ms_p50": st[len(st) // 2] * 1e3,
                    "step_ms_p99": st[min(len(st) - 1, int(0.99 * len(st)))] * 1e3, "step_ms_max": st[-1] * 1e3,
                    "overruns": sum(t > engine.period for t in step_times),
                    "step_s_sum": sum(step_times), "engine_thread_run_delay_s": run_delay,
                    "engine_thread_cpu_s": main, "engine_work_cpu_s": work_cpu, "background_cpu_s": cpu - main,
                    "pipeline_process_cpu_s": child_cpu,
                    "work_call_ms_p50": statistics.median(engine.work_calls) / 1e6 if engine.work_calls else None,
                })
                rss_series.append(_rss_mb())
                if child_pid:
                    child_rss_series.append(_rss_mb(child_pid))
                if shipping is not None:  # messages shipped and not yet written by the pipeline process
                    backlog.append(len(shipping._unacked))
    finally:  # the probes' windows are over: traced to the end, the pipeline process running
        windows_started = False
        if "pipeline-stopped" in probes:
            os.kill(child_pid, signal.SIGCONT)
    set_tracing(True)
    threads = _thread_cpu()
    run_s = time.perf_counter() - started
    compactions = getattr(rt.pipeline.sink("duckdb"), "compactions", None)
    segments_written = getattr(rt.pipeline.sink("duckdb"), "segments_written", None)
    dropped = rt.pipeline.dropped
    verify_dropped = getattr(rt.verify, "dropped_steps", None)
    pipeline = {}
    if shipping is not None:
        runtime.stop()  # the last message, EOF, the pipeline process's last flush
        stats = rt.pipeline.stats()
        sink = stats.get("duckdb", {})
        compactions, segments_written, dropped = sink.get("compactions"), sink.get("segments_written"), stats["dropped"]
        pipeline = {"shipped_messages": shipping.messages, "shipped_bytes": shipping.bytes_shipped,
                    "lost_records": shipping.lost_records, "started": shipping.started,
                    "ship_cpu_ms": shipping.ship_cpu_ns / 1e6, "errors": stats.get("errors"),
                    "ship_phases": {name: {"cpu_ms": ms, "calls": calls}
                                    for name, (ms, calls) in ship_phases().items()} if ship_phases else None}
    else:
        runtime.stop()
        profile = _profile_totals(profile)
    result = {
        "shape": shape, "batch": batch, "k": k, "rate": rate, "busy": args.busy, "period_ms": engine.period * 1e3,
        "work_reps": engine.reps, "window_s": args.window, "run_s": run_s, "traced_s": traced_s,
        "traced_steps": traced_steps - CALIBRATION_STEPS,
        "windows": windows, "rss_mb": rss_series, "pipeline_rss_mb": child_rss_series, "thread_cpu_s": threads,
        "compactions": compactions, "segments_written": segments_written, "dropped_rows": dropped,
        "dropped_steps": verify_dropped, "errors": dict(rt.errors), "store": store_totals(store),
        "profile_ms": profile, "pipeline": pipeline, "pid": pid, "backlog_messages": backlog,
        "flush_interval_s": rt.settings.flush_interval_s, "ship_interval_s": rt.settings.ship_interval_s,
        "pipeline_nice": (args.pipeline_nice or 0) if shape == "production" else None, "pin": args.pin,
        "objects": args.objects, "probes": sorted(probes),
    }
    out.write_text(json.dumps(result))


# -- analysis ------------------------------------------------------------------------------------------


def pipeline_share(r: dict) -> dict | None:
    """The pipeline process's CPU per second traced, as a share of one core, over the whole job.

    Not the traced windows' own CPU: a traced window's records are flushed on the pipeline process's 2 s timer, so a
    flush often lands in the paused window after it (windows ordered T P P T T P ...: a paused window that follows a
    traced one read ~0.04 s of pipeline CPU at 256 x 50, one that follows a paused one ~0.005). So: every window's
    pipeline CPU, less the process's idle rate over the paused time, over the traced time. The idle rate is the
    median of the paused windows that follow a paused window (a compaction landing in one is work the traced
    records caused, and counts). With 0.5 s windows that median reads 0 (the 2 s flush timer's wake-ups land in a
    quarter of the windows, none in the median one), so the figure keeps the idle rate, ~0.2 % of a core, and reads
    high by about that. ``traced_windows`` is the traced windows' own mean, the figure reported before."""
    windows = r["windows"]
    if not any(w["pipeline_process_cpu_s"] for w in windows):
        return None
    traced = [w for w in windows if w["traced"]]
    paused_s = sum(w["wall_s"] for w in windows if not w["traced"])
    clean = [w for before, w in zip(windows, windows[1:]) if not w["traced"] and not before["traced"]]
    idle = statistics.median(w["pipeline_process_cpu_s"] / w["wall_s"] for w in clean) if clean else 0.0
    total = sum(w["pipeline_process_cpu_s"] for w in windows)
    return {"per_traced_s": (total - idle * paused_s) / sum(w["wall_s"] for w in traced), "idle": idle,
            "traced_windows": statistics.fmean(w["pipeline_process_cpu_s"] / w["wall_s"] for w in traced)}


def split(w: dict) -> dict:
    """A window's step time, ms a step: the engine thread on CPU, runnable but waiting for a core, and waiting for
    anything else -- the GIL (the sleep's timer slack is in both conditions alike). The engine thread's CPU splits
    into its own work (``fixed_work`` and ``fresh_step``, where no spectrace code runs: traced, it changes only by
    what the rest of the machine does to it -- caches, cores) and everything else: the hooks, and the stand-in's own
    calls around them."""
    cpu, delay, n = w["engine_thread_cpu_s"], w["engine_thread_run_delay_s"], w["steps"]
    out = {"step": w["step_s_sum"] / n * 1e3, "cpu": cpu / n * 1e3, "core_wait": delay / n * 1e3,
           "gil_wait": (w["step_s_sum"] - cpu - delay) / n * 1e3, "step_without_core_wait": (w["step_s_sum"] - delay) / n * 1e3}
    if "engine_work_cpu_s" in w:  # results since 2026-12-04
        out["work"] = w["engine_work_cpu_s"] / n * 1e3
        out["hooks"] = (cpu - w["engine_work_cpu_s"]) / n * 1e3
    return out


def _slowdown(ratios: list[float]) -> dict:
    """Traced-over-paused ratios, one a pair, as a slowdown: their geometric mean less 1, with its 95 % interval."""
    out = summary(ratios)
    return {"slowdown": out["ratio"] - 1, "ci95": [out["ci95"][0] - 1, out["ci95"][1] - 1], "pairs": out["pairs"]}


def _median_ratio(pairs: list) -> dict | None:
    if not pairs or pairs[0][0].get("work_call_ms_p50") is None:
        return None
    return _slowdown([on["work_call_ms_p50"] / off["work_call_ms_p50"] for on, off in pairs])


def analyse(r: dict) -> dict:
    """Paired estimates over the windows of one job (traced against paused, pair by pair)."""
    pairs = paired(r["windows"])

    def ratio(key: str) -> dict:
        return _slowdown([split(on)[key] / split(off)[key] for on, off in pairs])

    def share(w: dict, key: str) -> float:
        return w[key] / w["wall_s"]

    def mean_of(traced: bool, fn) -> float:
        return statistics.fmean(fn(w) for w in r["windows"] if w["traced"] == traced)

    keys = ("step", "cpu", "core_wait", "gil_wait") + (("work", "hooks") if "engine_work_cpu_s" in r["windows"][0] else ())
    added = {key: mean_ci([split(on)[key] - split(off)[key] for on, off in pairs]) for key in keys}
    rss, hours, store = r["rss_mb"], r["traced_s"] / 3600, r["store"]
    steps = max(1, r["traced_steps"])
    profile = r["profile_ms"]
    flush = profile.get("Pipeline.flush") if isinstance(profile, dict) else None
    ship_cpu = r["thread_cpu_s"].get("spectrace-ship")
    return {
        # what the engine loses: its step time (wall), and the same without its waits for a core (what a
        # host with free cores would see: the GIL is still shared, the cores are not)
        "slowdown": ratio("step"),
        "slowdown_without_core_wait": ratio("step_without_core_wait"),
        # the engine's own work, traced over paused: what tracing does to code it does not run in (``split``)
        "engine_work_slowdown": ratio("work") if "work" in keys else None,
        # the same for a fixed_work call's median CPU (results since 2026-12-05): a slowdown every call shares, or a
        # few slow ones
        "engine_work_median_slowdown": _median_ratio(pairs),
        "p99_ratio": summary([on["step_ms_p99"] / off["step_ms_p99"] for on, off in pairs]),
        "step_ms_paused": {key: mean_of(False, lambda w: split(w)[key]) for key in keys},
        "step_ms_added": added,
        "step_ms_p99": {"traced": mean_of(True, lambda w: w["step_ms_p99"]), "paused": mean_of(False, lambda w: w["step_ms_p99"])},
        "step_ms_max": {"traced": max(w["step_ms_max"] for w in r["windows"] if w["traced"]),
                        "paused": max(w["step_ms_max"] for w in r["windows"] if not w["traced"])},
        "overruns": {"traced": sum(w["overruns"] for w in r["windows"] if w["traced"]),
                     "paused": sum(w["overruns"] for w in r["windows"] if not w["traced"])},
        "steps_per_s": {"traced": mean_of(True, lambda w: w["steps"] / w["wall_s"]), "paused": mean_of(False, lambda w: w["steps"] / w["wall_s"])},
        # every thread of the engine's process but the engine thread, traced minus paused, share of one core
        "background_core": mean_ci([share(on, "background_cpu_s") - share(off, "background_cpu_s") for on, off in pairs]),
        # the pipeline process: paired traced minus paused (biased low: a paused window carries the flush of the
        # traced window before it), and over the whole job (``pipeline_share``)
        "pipeline_process_core": mean_ci([share(on, "pipeline_process_cpu_s") - share(off, "pipeline_process_cpu_s") for on, off in pairs]),
        "pipeline_process_share": pipeline_share(r),
        "flush_cpu_ms_per_flush": flush["cpu_ms"] / flush["calls"] if flush and flush["calls"] else None,
        "flush_cpu_us_per_step": flush["cpu_ms"] * 1e3 / steps if flush else None,
        "ship_cpu_us_per_step": ship_cpu * 1e6 / steps if ship_cpu is not None else None,
        "shipped_bytes_per_step": r["pipeline"]["shipped_bytes"] / steps if r.get("pipeline") else None,
        "ship_phases_us_per_step": {name: round(v["cpu_ms"] * 1e3 / steps, 1)
                                    for name, v in (r.get("pipeline") or {}).get("ship_phases", {}).items()}
                                   if (r.get("pipeline") or {}).get("ship_phases") else None,
        "profile_ms_per_s": {name: round(v["cpu_ms"] / r["traced_s"], 3) for name, v in profile.items()} if isinstance(profile, dict) else profile,
        "rss_mb": {"after_warmup": rss[0], "end": rss[-1], "max": max(rss), "growth": rss[-1] - rss[0]},
        "pipeline_rss_mb": ({"start": r["pipeline_rss_mb"][0], "end": r["pipeline_rss_mb"][-1],
                             "max": max(r["pipeline_rss_mb"]), "growth": r["pipeline_rss_mb"][-1] - r["pipeline_rss_mb"][0]}
                            if r["pipeline_rss_mb"] else None),
        "per_hour": {"rows": store["rows"] / hours,
                     "verify_rows": store["tables"].get("verify_steps", {}).get("rows", 0) / hours,
                     "segments_written": (r["segments_written"] or 0) / hours,
                     "files_in_store_at_end": store["files"], "bytes": store["bytes"] / hours},
        "request_steps_per_s": r["batch"] * r["rate"],
    }


def _no_backlog(r: dict) -> bool:
    backlog = r.get("backlog_messages")
    if not backlog:  # a result from before the backlog was sampled: its memory's trend, as then
        rss = r["pipeline_rss_mb"]
        return rss[-1] <= max(rss[: len(rss) // 2 + 1]) * 1.1
    return max(backlog) <= 2 * r["flush_interval_s"] / r["ship_interval_s"] + 1


def production_summary(r: dict) -> dict:
    """The shipped shape's figures at one point (issue #34's machine-readable summary)."""
    a = r["analysis"]
    share = pipeline_share(r) or {"per_traced_s": 0.0, "idle": 0.0, "traced_windows": 0.0}
    pipeline_core = share["per_traced_s"]
    lost = (r.get("pipeline") or {}).get("lost_records", 0)
    rss = r["pipeline_rss_mb"]
    return {
        "slowdown_pct": round(a["slowdown"]["slowdown"] * 100, 3),
        "slowdown_ci_high_pct": round(a["slowdown"]["ci95"][1] * 100, 3),
        "slowdown_no_core_wait_pct": round(a["slowdown_without_core_wait"]["slowdown"] * 100, 3),
        "slowdown_no_core_wait_ci_high_pct": round(a["slowdown_without_core_wait"]["ci95"][1] * 100, 3),
        "gil_wait_ms_per_step": round(a["step_ms_added"]["gil_wait"]["mean"], 4),
        # the slowdown's parts (``split``): the engine's own work slowed by the machine's sharing, and the engine
        # thread's CPU in the hooks and the stand-in's calls around them, ms a step, traced minus paused
        **({"engine_work_slowdown_pct": round(a["engine_work_slowdown"]["slowdown"] * 100, 3),
            "engine_work_slowdown_ci_pct": [round(x * 100, 3) for x in a["engine_work_slowdown"]["ci95"]],
            "hooks_ms_per_step": round(a["step_ms_added"]["hooks"]["mean"], 4),
            "hooks_ms_per_step_ci": [round(x, 4) for x in a["step_ms_added"]["hooks"]["ci95"]],
            "step_ms_paused": round(a["step_ms_paused"]["step"], 3)} if a.get("engine_work_slowdown") else {}),
        "pin": r.get("pin", "none"),
        "objects": r.get("objects", "ring"),
        "engine_background_pct_core": round(a["background_core"]["mean"] * 100, 3),
        "pipeline_pct_core": round(pipeline_core * 100, 2),  # over the whole job (pipeline_share)
        "pipeline_idle_pct_core": round(share["idle"] * 100, 2),
        "pipeline_pct_core_traced_windows": round(share["traced_windows"] * 100, 2),  # pipeline_pct_core before d852814
        # keeping up: nothing dropped or lost, the pipeline process not saturated, and no growing backlog: the
        # messages shipped and not yet written, at each window's end, never more than two flushes' worth (a
        # pipeline that falls behind grows it without bound). Its memory is reported beside it: it grows over the
        # first minute whatever the pace (the writer keeps up to 500 000 recent rows for its next compaction),
        # so memory's bound is the 5-minute job's (bench/results/gpu_rates_512x100_long.json).
        "pipeline_keeps_up": bool(not r["dropped_rows"] and not lost and pipeline_core < 0.9 and _no_backlog(r)),
        "pipeline_backlog_max_messages": max(r["backlog_messages"]) if r.get("backlog_messages") else None,
        "engine_rss_mb": round(a["rss_mb"]["end"], 1),
        "pipeline_rss_mb": round(max(rss), 1) if rss else None,
        "windows": len(r["windows"]),
        "traced_s": round(r["traced_s"], 1),
    }


def fmt_ci(d: dict, scale: float = 100, unit: str = " %") -> str:
    if d.get("ci95") is None:
        return f"{d['mean'] * scale:.2f}{unit}"
    return f"{d['mean'] * scale:+.2f}{unit} ({d['ci95'][0] * scale:+.2f} … {d['ci95'][1] * scale:+.2f})"


def verdict(ci: list[float] | None, mean: float, limit: float, high_limit: float | None = None) -> str:
    """met: the interval under the limit (or the mean under it and the interval under ``high_limit``); missed: the
    interval above the limit; otherwise not resolved."""
    low, high = ci if ci else (mean, mean)
    if high <= (limit if high_limit is None else high_limit) and mean <= limit:
        return "met"
    return "missed" if low > limit else "not resolved"


def verdicts(a: dict) -> dict:
    bg = a["background_core"]
    return {
        "slowdown": a["slowdown"], "slowdown_without_core_wait": a["slowdown_without_core_wait"], "background_core": bg,
        "slowdown_goal": verdict(a["slowdown"]["ci95"], a["slowdown"]["slowdown"], GOAL["slowdown"],
                                 GOAL["slowdown_ci_high"]),
        "slowdown_without_core_wait_goal": verdict(a["slowdown_without_core_wait"]["ci95"],
                                                   a["slowdown_without_core_wait"]["slowdown"], GOAL["slowdown"],
                                                   GOAL["slowdown_ci_high"]),
        "gil_wait_goal": verdict(None, a["step_ms_added"]["gil_wait"]["mean"], GOAL["gil_wait_ms"]),
        "background_goal": verdict(bg["ci95"], bg["mean"], GOAL["background_core"]),
        **({"pipeline_goal": verdict(None, a["pipeline_process_share"]["per_traced_s"], GOAL["pipeline_core"])}
           if a.get("pipeline_process_share") else {}),
    }


def line(r: dict) -> str:
    a = r["analysis"]

    def pct(d: dict) -> str:
        return f"{d['slowdown'] * 100:+.2f} % ({d['ci95'][0] * 100:+.2f} … {d['ci95'][1] * 100:+.2f})"

    added = a["step_ms_added"]
    pipe = ""
    if r["shape"] == "production":
        share = a.get("pipeline_process_share") or pipeline_share(r)
        pipe = (f", pipeline process {share['per_traced_s'] * 100:.2f} % a second traced (idle {share['idle'] * 100:.2f}; "
                f"traced windows alone {share['traced_windows'] * 100:.2f}; paired {fmt_ci(a['pipeline_process_core'])})")
    ship = f", shipping {a['ship_cpu_us_per_step']:.0f} µs CPU/step" if a["ship_cpu_us_per_step"] is not None else ""
    if a.get("ship_phases_us_per_step"):
        ship += " (" + ", ".join(f"{name} {us:.0f}" for name, us in a["ship_phases_us_per_step"].items()) + ")"
    flush = f", flush {a['flush_cpu_ms_per_flush']:.0f} ms CPU each" if a["flush_cpu_ms_per_flush"] else ""
    parts = ""
    if a.get("engine_work_slowdown"):
        median = f", a call's median {pct(a['engine_work_median_slowdown'])}" if a.get("engine_work_median_slowdown") else ""
        parts = (f" (its own work {pct(a['engine_work_slowdown'])}{median}, hooks and calls "
                 f"{fmt_ci(added['hooks'], 1e3, ' µs')} a step)")
    pinned = {"apart": ", engine thread pinned apart", "shipper-with-engine": ", engine thread pinned apart with the shipper"}.get(r.get("pin"), "")
    probes = f" [probe {', '.join(r['probes'])}]" if r.get("probes") else ""
    return (f"{r['shape']:9s}{probes} batch {r['batch']} k {r['k']} {r['rate']:g} steps/s ({a['slowdown']['pairs']} pairs): "
            f"slowdown {pct(a['slowdown'])}, without core waits {pct(a['slowdown_without_core_wait'])}; "
            f"per step +{added['gil_wait']['mean']:.3f} ms GIL, +{added['core_wait']['mean']:.3f} ms core, +{added['cpu']['mean']:.3f} ms CPU"
            f"{parts} (paused step {a['step_ms_paused']['step']:.2f} ms{pinned}); "
            f"background {fmt_ci(a['background_core'])} of a core{pipe}{ship}{flush}; "
            f"RSS {a['rss_mb']['after_warmup']:.0f} -> {a['rss_mb']['end']:.0f} MB; "
            f"{a['per_hour']['rows'] / 1e6:.1f} M rows/h, {a['per_hour']['segments_written']:.0f} segments/h; "
            f"{r['compactions']} compactions; load {r['load_before']} -> {r['load_after']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: one point, 12 pairs of windows (~1 min)")
    parser.add_argument("--shapes", nargs="+", choices=("inprocess", "production"), default=None,
                        help="default: inprocess and production at every point")
    parser.add_argument("--points", nargs="+", default=None, help="BATCHxSTEPS_PER_S (default: 256x50 512x50 512x100)")
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--busy", type=float, default=0.5, help="the engine thread's own work (CPU), share of the step period")
    parser.add_argument("--lifetime", type=int, default=150, help="mean request lifetime in steps")
    parser.add_argument("--window", type=float, default=0.5,
                        help="seconds per window (0.5: short windows pair better on this machine, whose speed drifts)")
    parser.add_argument("--pairs", type=int, default=None, help="pairs of windows per job (default 150: 2.5 minutes, past two compactions)")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--ship-interval", type=float, default=None,
                        help="seconds between shipments (production: SPECTRACE_SHIP_INTERVAL, default as shipped)")
    parser.add_argument("--pipeline-nice", type=int, default=None,
                        help="the pipeline process's nice increment over the engine's (production: none, as shipped)")
    parser.add_argument("--ship-pauses", choices=("on", "off"), default="on",
                        help="production shape: the shipper's pauses for the GIL between record groups (off: none, "
                             "to measure what they do)")
    parser.add_argument("--ship-phases", action="store_true",
                        help="production shape: time the shipper's phases (collecting, pickling, pauses, writing) with "
                             "its thread's CPU clock, per step")
    parser.add_argument("--objects", choices=("fresh", "ring"), default="fresh",
                        help="fresh: each step's vLLM objects made anew, as vLLM does (default); ring: the ring's own, "
                             "reused every ring of steps (results before 2026-12-04)")
    parser.add_argument("--pin", choices=("none", "apart", "shipper-with-engine"), default=None,
                        help="apart: the engine thread on one CPU, every other thread and the pipeline process on the "
                             "others, as on a host with a core for the engine thread (default where two CPUs or more "
                             "are allowed); none: the OS places them (results before 2026-12-04); shipper-with-engine: "
                             "apart, with the shipper's thread on the engine thread's CPU")
    parser.add_argument("--probe", nargs="+", choices=sorted(PROBES), default=[],
                        help="production shape: variants that say where a slowdown of the engine's own work comes from "
                             "(combinable): " + "; ".join(f"{name}: {what}" for name, what in PROBES.items()))
    parser.add_argument("--show", metavar="RESULTS_JSON", help="print the summary lines of a results file and exit")
    parser.add_argument("--name", default=None, help="results file bench/results/<name>.json (default gpu_rates[-quick])")
    args = parser.parse_args(argv)
    if args.ship_interval is not None and not 0.01 <= args.ship_interval <= 60:
        parser.error("--ship-interval takes seconds, 0.01 to 60 (SPECTRACE_SHIP_INTERVAL's range)")
    if args.show:
        for r in json.loads(Path(args.show).read_text())["results"]:
            print(line(r))
        return 0
    if args.pin is None:
        args.pin = "apart" if len(os.sched_getaffinity(0)) >= 2 else "none"
    elif args.pin != "none" and len(os.sched_getaffinity(0)) < 2:
        parser.error(f"--pin {args.pin} needs two CPUs or more (this process may use one)")
    if args.probe:
        if (args.shapes or ["production"]) != ["production"]:
            parser.error("--probe runs the production shape only (--shapes production)")
        args.shapes = ["production"]
    if args.quick:
        args.pairs = args.pairs or 12
        args.warmup = 2.0
    args.pairs = args.pairs or 150
    if args.shapes is None and args.points is None:
        jobs = [(s, p) for p in (["256x50"] if args.quick else POINTS) for s in ("inprocess", "production")]
    else:
        jobs = [(s, p) for p in (args.points or (["256x50"] if args.quick else POINTS)) for s in (args.shapes or ("inprocess", "production"))]
    try:
        parsed = [(s, int(p.split("x")[0]), float(p.split("x")[1])) for s, p in jobs]
    except (ValueError, IndexError):
        print(f"gpu_rates: --points takes BATCHxSTEPS_PER_S, e.g. 256x50 (got {' '.join(args.points)})", file=sys.stderr)
        return 2
    for key in [k for k in os.environ if k.startswith("SPECTRACE")]:
        del os.environ[key]  # only the Settings built here count

    t0 = time.perf_counter()
    import vllm.v1.core.sched.output  # noqa: F401  (12 s; once, before the jobs fork)
    import vllm.v1.outputs  # noqa: F401
    from vllm import SamplingParams  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    import bench.profile_flush  # noqa: F401
    import_s = time.perf_counter() - t0
    freeze_heap()
    (SCRATCH / "gpu_rates").mkdir(parents=True, exist_ok=True)
    results = []
    started = time.time()
    for shape, batch, rate in parsed:
        out = SCRATCH / "gpu_rates" / f"result-{shape}-{batch}x{rate:g}.json"
        out.unlink(missing_ok=True)
        load = loadavg()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                job(shape, batch, rate, args, out)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if status or not out.exists():
            print(f"{shape} {batch}x{rate:g}: the job failed (status {status})", file=sys.stderr)
            return 1
        r = json.loads(out.read_text())
        r["load_before"], r["load_after"] = load, loadavg()
        r["analysis"] = analyse(r)
        results.append(r)
        print(line(r), flush=True)
    goal = {r["shape"]: verdicts(r["analysis"]) for r in results
            if f"{r['batch']}x{r['rate']:g}" == GOAL["point"] and r["k"] == GOAL["k"]}
    name = args.name or ("gpu_rates-quick" if args.quick else "gpu_rates")
    path = write_result(name, {
        "production": {f"{r['batch']}x{r['rate']:g}": production_summary(r) for r in results if r["shape"] == "production"},
        "import_s": import_s, "seconds": round(time.time() - started + import_s, 1),
        "settings": {k: v for k, v in vars(args).items()}, "goal": {**GOAL, "results": goal},
        "default_settings": {"flush_interval_s": Settings.flush_interval_s, "compact_interval_s": Settings.compact_interval_s,
                             "exporters": list(Settings.exporters)},
        "results": results,
    })
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
