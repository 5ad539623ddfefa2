"""The engine's side of ``SPECTRACE_PIPELINE=process``: hooks and a shipper, nothing else.

    engine process                                   pipeline process (spectrace.collector.process)
    hooks ─ append ─▶ capture, ShippingPipeline ─ ship every 0.25 s ─▶ Runtime: drain, judges, every sink

A traced engine-core or worker process at a GPU engine's rates cannot afford the flush on its own
GIL (BENCHMARKS.md, "At GPU rates"). With ``SPECTRACE_PIPELINE=process`` its :class:`Runtime
<spectrace.recorder.runtime.Runtime>` keeps the hooks (they append what vLLM holds, as before) and
this shipper: a thread that, every ``SPECTRACE_SHIP_INTERVAL`` (0.25 s; backing off to
:data:`IDLE_WAIT_S` while nothing is recorded), takes what the hooks and the low-rate code
buffered and writes it, pickled in groups of records with short pauses between them that hand
the GIL to a waiting engine thread (the wire format: ``spectrace.recorder.wire``), to one pipeline
process it started (``subprocess``: fork-exec, never a fork of the engine; through a launcher, so that it is
not in the engine's process tree, which vLLM's shutdown SIGKILLs whole: ``spectrace.recorder.detached``). That process runs the
real runtime under the engine's identity (pid, host, roles, ranks, run: rows, segment names and
the exposition file are the engine's) and does everything else: the verification drain, every
judge, Arrow, every sink, compaction, the OpenTelemetry providers and the Prometheus exposition.

What is shipped (:meth:`Shipper.collect`): the engine's per-step records (each step's draft dict packed
once, ``wire.PackedDrafts``; lengths, rows, and the cached requests' ids and computed tokens), the worker's
step times, the proposals' totals, each request's parameters once its prefill is known (read here, once
per request: the pipeline process imports neither vLLM nor torch), each run's config facts once (``RunConfig``:
read here, the pipeline process holds no VllmConfig), the load-time hooks' readings (``LoadFacts``, plain values,
for its judge), the rows the low-rate hooks wrote, finished
spans as plain values, the value records the hooks made for the metrics (``spectrace.values``: run info, the
layout's verdicts, taps), hook error counts, drops, and the process's state (runs, roles, ranks, the labels vLLM's
series carry): one typed ``wire.Shipment``.

Failure costs vLLM nothing: a pipeline process that is gone loses the messages it never wrote, one
that takes nothing for :data:`PIPE_FULL_S` (stopped, hung: its pipe stays full) is killed and loses
them too; it is started again, at most :data:`MAX_RESTARTS` times; the capture's buffers stay bounded
as before. Every record not handed over is counted here (``lost_records``), whatever the reason: the next
pipeline process is told and counts it in ``dropped``; a count no pipeline process took (the last one died,
restarts exhausted, one stopped at the engine's exit) goes to this process's own exposition file and to a
ledger in the store that the next pipeline process on this host writes into the store
(``spectrace.recorder.losses``), and the engine's exit logs the totals. Past the restarts the shipper keeps
taking (and counting) what the hooks buffer, and says once, as an error, that tracing stopped for this process
and why. (It does not fall back to the in-process flush: docs/architecture.md says why.) The engine's exit
ends the pipeline process by EOF after a last flush and waits for it a bounded time (:data:`EXIT_WAIT_S`;
one seen stopped for :data:`STOPPED_GRACE_S` is killed then, its unwritten records counted); a killed engine's pipeline process sees
EOF as well and flushes what it has.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import subprocess
import sys
import threading
import time
from collections import defaultdict, deque
from typing import Any

from spectrace.buffer import RowBuffer
from spectrace.recorder import detached, losses, wire
from spectrace.recorder.verify.capture import Cached, ReadRequest, host_tokens
from spectrace.recorder.wire import FRAME, dumps_shipment, read_frame, span_values

log = logging.getLogger("vllm.spectrace")

MAX_RESTARTS = 3  # pipeline processes started again after one died; then records are dropped (counted, logged)
EXIT_WAIT_S = 30.0  # the engine's exit waits this long for its pipeline process's last flush
PIPE_FULL_S = 30.0  # a pipeline process that takes no byte of a message this long (stopped, hung) is killed
FLUSH_WAIT_S = 60.0  # flush() waits this long for the pipeline process to have written everything
# A pipeline process seen stopped (SIGSTOP, state T in /proc) this long without a break writes nothing while it stays
# so: flush() stops waiting for it (its messages stay unacknowledged: counted as lost if it never writes them), and the
# engine's exit kills it rather than waiting EXIT_WAIT_S. On real vLLM each run's end and each model load flushes on
# vLLM's thread: waiting FLUSH_WAIT_S for a stopped process there stalled vLLM a minute a flush.
STOPPED_GRACE_S = 5.0
MAX_PENDING_REQUESTS = 10_000  # requests whose prefill is not known yet (the oldest are shipped as they are)
STALE_REQUEST_S = 60.0  # a request not scheduled after this long is shipped without its prefill
# An idle process (nothing recorded, its state unchanged) sends no message, and the shipper's wait doubles from
# SPECTRACE_SHIP_INTERVAL up to this: waking ten times a second (0.1 s, the interval then) to send the same state cost
# an idle engine process ~0.4 % of a core and its pipeline process ~0.25 % (each wake ~0.4 ms of CPU, caches cold).
# Records that arrive after a quiet spell wait at most this long; the hooks' buffers hold them meanwhile. 0: every
# wake sends (the behaviour before; bench/idle.py measures the two).
IDLE_WAIT_S = 1.0


# -- spans -------------------------------------------------------------------------


def _span_processor_base():
    from opentelemetry.sdk.trace import SpanProcessor

    return SpanProcessor


class SpanShipper(_span_processor_base()):
    """The engine-side tracer provider's one span processor: every finished span, as values, to the shipper."""

    def __init__(self, shipper: "Shipper") -> None:
        self.shipper = shipper

    def on_end(self, span) -> None:
        try:
            self.shipper.spans.append(span_values(span))
        except Exception as exc:  # a span that does not convert is one counted error, never the caller's
            self.shipper.rt.count_error("shipper.spans", exc)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


# -- the engine side's shape ---------------------------------------------------------


class ShipperShape:
    """``SPECTRACE_PIPELINE=process``, the engine's side (``Runtime.shape``): a buffer the hooks append to and a
    shipper; finished spans to the shipper; the agreement judged by the pipeline process, in order with the
    records (the other shape: ``spectrace.collector.collector.Collector``)."""

    name = "pipeline process"
    drain = None  # the records are drained in the pipeline process

    def __init__(self, rt) -> None:
        self.rt = rt

    def pipeline(self):
        settings = self.rt.settings
        return ShippingPipeline(settings, self.rt), {name: "pipeline process" for name in settings.exporters}

    def telemetry(self, provider, resource) -> None:
        self.rt._add_span_processor(SpanShipper(self.rt.pipeline.shipper))

    def check_agreement(self, exclude: str | None = None) -> None:
        self.rt.pipeline.check_agreement(exclude)

    def facts(self, facts) -> None:
        """A load-time hook's reading (``spectrace.load_facts.LoadFacts``): judged by the pipeline process. Pickled
        once here first (a load's few readings): one that does not pickle raises into its hook's guard (counted),
        never into the shipment that would carry it."""
        pickle.dumps(facts, protocol=pickle.HIGHEST_PROTOCOL)
        self.rt.pipeline.shipper.facts.append(facts)

    def at_start(self, first: bool) -> None:
        pass  # the pipeline process takes the host's loss ledgers at its start

    def at_shutdown(self) -> None:
        pass  # the pipeline process judges the last run's agreement at its EOF (after the final shipment)


# -- the engine side's pipeline -----------------------------------------------------


class ShippingPipeline(RowBuffer):
    """The engine process's pipeline: the same bounded buffer and counters the hooks append to
    (``spectrace.buffer.RowBuffer``: no numpy, pyarrow or sink in this process), no sources and no sinks here; its
    shipper's thread ships instead of flushing (:class:`Shipper`)."""

    def __init__(self, settings, rt) -> None:
        super().__init__(max_buffer_rows=settings.max_buffer_rows)
        self.flush_interval_s = settings.ship_interval_s
        self.dropped_taken = 0  # of ``dropped``, what the shipper already handed on
        self.shipper = Shipper(rt, settings, self)

    def take(self) -> tuple[dict, list, int]:
        """The buffered rows and value records, and the rows dropped since the last take. (No column sets: only the
        drain writes them, and it runs in the pipeline process.)"""
        with self._lock:
            rows, self._rows = self._rows, defaultdict(list)
            self._columns.clear()
            values, self._values = self._values, []
            self._buffered = 0
            dropped, self.dropped_taken = self.dropped - self.dropped_taken, self.dropped
        return dict(rows), values, dropped

    def flush(self) -> int:
        """Ship everything now and wait until the pipeline process has written it (bounded)."""
        return self.shipper.ship(wait=True)

    def maintain(self) -> None:
        pass  # the pipeline process's sinks maintain the store

    def start(self) -> None:
        self.shipper.start()

    def check_agreement(self, exclude: str | None) -> None:
        """The engine/worker agreement of every run but ``exclude``, judged by the pipeline process in order with the
        records (``Shipment.agreements``)."""
        self.shipper.agreements.append(exclude)

    def close(self) -> None:
        self.shipper.close()

    def stats(self) -> dict[str, Any]:
        """The pipeline process's counters and sinks' stats at its last acknowledged flush, this process's
        drops added, and the shipper's own."""
        remote = self.shipper.remote_stats
        out = {"dropped": self.dropped, "buffer_dropped": self.buffer_dropped, "flushes": 0, "rows_flushed": 0,
               "errors": {}, **remote}
        untaken = self.dropped - self.dropped_taken  # refused by this process's full buffer, not shipped yet
        out["dropped"] = remote.get("dropped", 0) + untaken  # what was shipped, the pipeline process counted
        out["buffer_dropped"] = remote.get("buffer_dropped", 0) + untaken
        out["shipper"] = self.shipper.stats()
        return out


PIPELINE_OF = "SPECTRACE_PIPELINE_OF"  # the traced process's pid, in its pipeline process's environment (not a setting)


class Shipper:
    """Takes what the engine's process buffered and hands it to its pipeline process (module docstring)."""

    def __init__(self, rt, settings, pipeline: ShippingPipeline) -> None:
        self.rt = rt
        self.settings = settings
        self.pipeline = pipeline
        self.spans: deque = deque()
        self.agreements: deque = deque()  # runs begun: the agreement of every other run to judge (Shipment.agreements)
        self.facts: deque = deque()  # load-time hooks' readings, for the pipeline process to judge (Shipment.facts)
        self.proc: detached.Detached | None = None
        self.started = 0  # pipeline processes started
        self.messages = 0
        self.idle_skips = 0  # wakes that found nothing to send
        self.lost_messages = 0
        self.lost_records = 0  # records in messages that never reached a pipeline process
        self.ship_cpu_ns = 0  # thread CPU the shipper spent collecting and pickling
        self.bytes_shipped = 0
        self._lost_unreported = 0  # lost records no pipeline process has written yet (the ledger's count)
        self._handed = 0  # of them, those the running pipeline process was told, until it acknowledges a flush
        self._seq = 0
        self._acked = 0
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ship_lock = threading.Lock()  # one message at a time (the thread, flush(), close())
        self._ack_lock = threading.Lock()  # one reader of the acknowledgements at a time
        self._pending: dict[str, Any] = {}  # request id -> its note, until its prefill is known
        self._pending_since: dict[str, float] = {}
        self._configs_sent: set = set()
        self._last_state: wire.ProcessState | None = None  # the state the last shipment carried
        self._closed = False
        self._unacked: deque = deque()  # (seq, records) shipped and not yet written by the pipeline process
        self.stopped: str | None = None  # why tracing stopped for this process (restarts exhausted), said once
        self.lost_by_reason: dict[str, int] = {}  # records lost, by why (the exit's totals line)
        self.ledger = losses.Ledger(settings, rt.pid, rt.host)  # where a count no pipeline process took is kept
        self._published = 0.0  # when the ledger and the exposition file were last written
        self._unpublished = False
        self.remote_stats: dict[str, Any] = {}  # the pipeline process's Pipeline.stats() at its last acknowledged flush

    # -- the pipeline process ------------------------------------------------------------

    def _spawn(self) -> bool:
        if self.started > MAX_RESTARTS:
            return False
        if self.started:
            log.warning("spectrace: the pipeline process ended (exit %s); starting it again (%d of %d); "
                        "%d records lost so far", self.proc.returncode if self.proc else None, self.started,
                        MAX_RESTARTS, self.lost_records)
        self.started += 1
        self._configs_sent.clear()  # a new pipeline process knows no run's config yet
        if "prometheus" in self.settings.exporters:
            # the server's exposition directory, resolved here (made by the first traced process, or inherited) and
            # handed on in the environment: the pipeline process writes this engine's file where the API server's
            # collector (or this engine's standalone endpoint) reads, and the processes vLLM starts later find it
            from spectrace.sinks.exposition import server_dir

            try:
                self.ledger.metrics_path = server_dir(self.settings.metrics_dir) / self.ledger.metrics_name
            except Exception as exc:
                self.rt.count_error("shipper.metrics_dir", exc)
        if self.proc is not None:
            for pipe in (self.proc.stdin, self.proc.stdout):
                try:
                    pipe.close()
                except OSError:
                    pass
        env = dict(os.environ)
        env.pop("SPECTRACE", None)  # the pipeline process traces nothing itself
        # whose it is, in its environment (/proc/PID/environ): it is nobody's child in the engine's tree (detached)
        env[PIPELINE_OF] = str(self.rt.pid)
        try:
            # forked by a launcher, out of the engine's process tree: vLLM's shutdown SIGKILLs that tree (recorder.detached)
            self.proc = detached.launch(sys.executable, "spectrace.collector.process", env)
            os.set_blocking(self.proc.stdin.fileno(), False)  # every write is bounded (_write)
            init = {"settings": self.settings, "pid": self.rt.pid, "host": self.rt.host, "lost": self._lost_unreported,
                    "started": self.started, "run": self.rt.run.run_id if self.rt.run is not None else None}
            if not self._write(pickle.dumps(init, protocol=pickle.HIGHEST_PROTOCOL)):
                raise OSError("the pipeline process took no start message")
        except Exception as exc:
            log.error("spectrace: cannot start the pipeline process: %s: %s (records are dropped and counted)",
                      type(exc).__name__, exc)
            self.proc = None
            return False
        # the new pipeline process writes the count at its first flush: it is that process's once it acknowledged one
        # (a process killed before that wrote nothing: the count goes to the next one, or to the ledger)
        self._handed = self._lost_unreported
        return True

    def _alive(self) -> bool:
        if self.proc is not None and self.proc.poll() is None:
            return True
        if self.proc is not None and self._unacked:  # shipped, never written: lost with the process
            self._lost(sum(records for _, records in self._unacked), messages=len(self._unacked),
                       why=f"the pipeline process ended (exit {self.proc.returncode}) before writing them")
            self._unacked.clear()
        if self.started > MAX_RESTARTS:
            self._stop_tracing()
            return False
        return self._spawn()

    def _stop_tracing(self) -> None:
        """Restarts exhausted: said once, as an error; the shipper goes on taking and counting what the hooks buffer."""
        if self.stopped is not None:
            return
        code = self.proc.returncode if self.proc is not None else None
        self.stopped = (f"the pipeline process ended {self.started} times (last exit {code}), "
                        f"past its {MAX_RESTARTS} restarts")
        log.error("spectrace: TRACING STOPPED for this process (pid %d): %s. vLLM is unaffected; from here every record "
                  "is dropped and counted (%d lost so far), in this process's /metrics (spectrace_shipper_lost_records_"
                  "total, spectrace_tracing_stopped) and, once it exits, by the next pipeline process on this host in "
                  "the store's internal_errors (hook %s)", self.rt.pid, self.stopped, self.lost_records, losses.HOOK)
        self._publish(force=True)

    # -- collecting --------------------------------------------------------------------

    def collect(self) -> wire.Shipment:
        """One shipment: everything buffered since the last one."""
        rt = self.rt
        shipment = wire.Shipment()
        capture = rt.verify
        if capture is not None:
            shipment.finished = capture.take_finished()  # before the engine steps: the steps each request drafted in
            engine = capture.take_engine_steps()  # first: every request these steps verified was scheduled before
            worker = capture.take_worker_steps()
            if engine or worker:
                shipment.engine, shipment.worker = self._steps(engine, worker)
            shipment.timings = capture.take_timings()
            proposals = capture.take_proposals()
            if proposals:  # the pipeline process counts their drafts, nothing else: their totals travel
                shipment.proposals = [p._replace(draft_token_ids=sum(map(len, p.draft_token_ids))) for p in proposals]
            host = capture.take_host_steps()
            if host:  # tokens counted here (the frontend's are its outputs' lists), off vLLM's thread
                shipment.host = [h._replace(tokens=host_tokens(h)) for h in host]
            shipment.dropped_steps = capture.take_dropped()
            shipment.requests = self._requests(capture)
            runs = {step.run_id for step in engine} | {p.run_id for p in proposals}
            configs = {run_id: capture.config_of(run_id) for run_id in runs - self._configs_sent}
            if configs:
                self._configs_sent.update(configs)
                shipment.configs = configs
            capture.let_go(engine, worker, proposals, host)  # sent as values: vLLM's threads drop them (capture)
        shipment.rows, shipment.values, shipment.dropped = self.pipeline.take()
        shipment.errors = self.rt.take_error_deltas()
        for key, queue in (("spans", self.spans), ("agreements", self.agreements), ("facts", self.facts)):
            if queue:
                setattr(shipment, key, [queue.popleft() for _ in range(len(queue))])
        shipment.state = self._state()
        return shipment

    @staticmethod
    def _steps(engine: list, worker: list) -> tuple[list, list]:
        """The engine's and the worker's steps as they travel: each draft dict packed once (``wire.PackedDrafts``;
        the worker's step holds the engine's dict where both run in this process), the cached requests' two fields,
        with pauses for the GIL as between pickled groups (packing takes ~35 µs a step at batch 256, k 7)."""
        packed: dict[int, Any] = {}
        pauses = wire.GilPauses()

        def pack(drafts):
            got = packed.get(id(drafts))  # every dict is held by its step until the message is sent
            if got is None:
                got = packed[id(drafts)] = wire.pack_drafts(drafts)
            return got

        engine_out = []
        for step in engine:
            cached = step.cached
            engine_out.append(step._replace(
                drafts=pack(step.drafts),
                cached=Cached(cached.req_ids, cached.num_computed_tokens) if cached is not None else None))
            pauses.due()
        worker_out = []
        for step in worker:  # V1: request id -> draft ids; V2: drafts per row (a list or an array), as it is
            worker_out.append(step._replace(drafts=pack(step.drafts)) if type(step.drafts) is dict else step)
            pauses.due()
        return engine_out, worker_out

    def _requests(self, capture) -> list:
        """Requests whose prefill is known (or that waited too long), their parameters read here."""
        from spectrace.vllm_objects.requests import request_parameters

        pending, since = self._pending, self._pending_since
        now = time.monotonic()
        for note in capture.take_new_requests():
            if len(pending) >= MAX_PENDING_REQUESTS:
                oldest = next(iter(pending))
                since[oldest] = 0.0  # shipped below as it is
            pending[note.request_id] = note
            since[note.request_id] = now
        if not pending:
            return []
        out = []
        flags, traces = capture.request_flags, capture.request_traces
        pauses = wire.GilPauses()  # a message's new requests take ~5-10 µs each to read: pauses as between groups
        for request_id in list(pending):
            note = pending[request_id]
            stats = note.prefill_stats
            if stats is not None and not getattr(stats, "num_prompt_tokens", 1) and now - since[request_id] < STALE_REQUEST_S:
                continue  # not scheduled yet
            del pending[request_id], since[request_id]
            try:
                params = request_parameters(note.sampling_params, note.lora_request, stats, note.prompt_token_ids,
                                            note.think_markers)
            except Exception as exc:
                self.rt.count_error("shipper.requests", exc)
                continue
            out.append(wire.ShippedRequest(ReadRequest(note.run_id, request_id, params), flags.get(request_id),
                                           traces.get(request_id)))
            pauses.due()
        return out

    def _state(self) -> wire.ProcessState:
        exposition = sys.modules.get("spectrace.sinks.exposition")  # loaded where vLLM's labels were read
        rt = self.rt
        return wire.ProcessState(
            run=rt.run.run_id if rt.run is not None else None,
            runs=[wire.RunState(r.run_id, r.traceparent, r.started_ns, dict(r.info)) for r in list(rt.runs.values())],
            roles=list(rt.role_order),
            ranks=dict(rt.ranks),
            labels=dict(exposition.PROCESS_LABELS) if exposition is not None else {},
        )

    # -- shipping ----------------------------------------------------------------------

    def ship(self, *, wait: bool = False, final: bool = False) -> int:
        """Collect and send one message; with ``wait``, until the pipeline process has flushed it. Never raises."""
        with self._ship_lock:
            started = time.thread_time_ns()
            try:
                shipment = self.collect()
                records = shipment.records()
            except Exception as exc:
                self.rt.count_error("shipper.collect", exc)
                return 0
            if self.stopped is not None:  # no pipeline process any more: taken from the hooks' buffers, counted
                if records:
                    self._lost(records, why=self.stopped)
                else:
                    self.idle_skips += 1
                    if self._unpublished:
                        self._publish()
                self.ship_cpu_ns += time.thread_time_ns() - started
                return 0
            if (IDLE_WAIT_S and not (wait or final) and shipment.carries_only_state()
                    and shipment.state == self._last_state):
                self.idle_skips += 1
                self.ship_cpu_ns += time.thread_time_ns() - started
                return 0  # nothing new since the last shipment
            self._last_state = shipment.state
            self._seq += 1
            seq = shipment.seq = self._seq
            shipment.flush = wait or final
            shipment.final = final  # the engine's orderly end: the pipeline process may judge its last run whole
            if wire.YIELD_S:
                time.sleep(wire.YIELD_S)  # the GIL for a waiting engine thread, between collecting and pickling
            try:
                payload = dumps_shipment(shipment)
            except Exception as exc:
                self.rt.count_error("shipper.pickle", exc)
                self._lost(records, why="a shipment that could not be pickled")
                return 0
            self.ship_cpu_ns += time.thread_time_ns() - started
            if not self._alive():
                self._lost(records, why=self.stopped or "no pipeline process could be started")
                return 0
            if not self._write(payload):  # gone, or killed for a pipe that stayed full: the next message starts another
                self._lost(records, why="the pipeline process did not take the message")
                return 0
            self._unacked.append((seq, records))
            self.messages += 1
            self.bytes_shipped += len(payload)
        if wait or final:
            self._await(seq, FLUSH_WAIT_S)
        return records

    def _write(self, payload: bytes) -> bool:
        """One frame to the pipeline process, on its non-blocking pipe: True once written whole. False when it is gone,
        or took no byte for :data:`PIPE_FULL_S` (stopped or hung): then it is killed (a frame cut short would corrupt
        the stream), and the next message counts what it never wrote and starts another."""
        proc = self.proc
        if proc is None:
            return False
        try:
            fd = proc.stdin.fileno()
        except (OSError, ValueError):
            return False
        deadline = time.monotonic() + PIPE_FULL_S
        for chunk in (FRAME.pack(len(payload)), payload):
            view = memoryview(chunk)
            while view:
                try:
                    written = os.write(fd, view)
                    if written:  # it takes bytes: the wait for the next ones starts again (hung = no byte at all)
                        view = view[written:]
                        deadline = time.monotonic() + PIPE_FULL_S
                except BlockingIOError:
                    pass
                except (OSError, ValueError):
                    return False
                if not view:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("spectrace: the pipeline process (pid %d) took nothing for %.0f s (its pipe stayed "
                                "full: stopped or hung); killed, its unwritten records counted as lost", proc.pid,
                                PIPE_FULL_S)
                    self._kill_now(proc)
                    return False
                try:
                    select.select([], [fd], [], min(left, 0.5))
                except (OSError, ValueError):
                    return False
                if proc.poll() is not None:
                    return False
        return True

    @staticmethod
    def _kill_now(proc) -> None:
        try:
            proc.kill()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass

    def _lost(self, records: int, messages: int = 1, why: str = "") -> None:
        first = not self.lost_messages
        self.lost_messages += messages
        self.lost_records += records
        self._lost_unreported += records
        if records:
            self.lost_by_reason[why or "not handed over"] = self.lost_by_reason.get(why or "not handed over", 0) + records
        if first:
            log.warning("spectrace: the pipeline process did not take a message (%d records dropped and counted; "
                        "vLLM is unaffected)", records)
        self._publish()

    def _publish(self, *, force: bool = False) -> None:
        """The count where it outlives the pipeline processes: the ledger (what none took) and this process's
        exposition file; at most once a second unless ``force``. Never raises."""
        now = time.monotonic()
        if not force and now - self._published < 1.0:
            self._unpublished = True
            return
        self._published, self._unpublished = now, False
        if not (self.lost_records or self.stopped):
            return
        run = self.rt.run.run_id if self.rt.run is not None else None
        try:
            self.ledger.write(self._lost_unreported, self.lost_records, self.lost_messages, list(self.lost_by_reason), run)
        except Exception as exc:
            self.rt.count_error("shipper.ledger", exc)
        try:
            exposition = sys.modules.get("spectrace.sinks.exposition")
            labels = dict(exposition.PROCESS_LABELS) if exposition is not None else {}
            self.ledger.write_metrics(self.lost_records, self.stopped, labels)
        except Exception as exc:
            self.rt.count_error("shipper.exposition", exc)

    def _await(self, seq: int, timeout: float) -> bool:
        """Read the pipeline process's acknowledgements until ``seq`` is acknowledged, at most ``timeout`` s."""
        with self._ack_lock:
            return self._read_acks(seq, timeout)

    def _read_acks(self, seq: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        proc = self.proc
        stopped = _StoppedFor(proc.pid) if proc is not None else None
        while self._acked < seq and proc is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("spectrace: the pipeline process has not flushed after %.0f s; going on", timeout)
                return False
            try:
                ready, _, _ = select.select([proc.stdout.raw], [], [], min(left, 0.5))
            except (OSError, ValueError):
                return False
            if not ready:
                if proc.poll() is not None:
                    return False
                if stopped.seconds() >= STOPPED_GRACE_S:
                    log.warning("spectrace: the pipeline process (pid %d) is stopped (SIGSTOP?); not waiting for its "
                                "flush (%d records not confirmed written)", proc.pid, self.unconfirmed())
                    return False
                continue
            frame = read_frame(proc.stdout.raw)  # unbuffered: select sees every byte not read yet
            if frame is None:
                return False
            self._ack(frame)
        return self._acked >= seq

    def _ack(self, frame: bytes) -> None:
        try:
            seq, stats = pickle.loads(frame)
        except Exception:
            return
        self._acked = max(self._acked, seq)
        if self._handed:  # its first flush is done: the count it was told at its start is in the store
            self._lost_unreported = max(0, self._lost_unreported - self._handed)
            self._handed = 0
            self._publish(force=True)
        while self._unacked and self._unacked[0][0] <= seq:
            self._unacked.popleft()
        if isinstance(stats, dict):
            self.remote_stats = stats

    # -- the thread --------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        if self.proc is None and self._spawn():
            self.rt.exporter_status.update(
                {name: f"pipeline process (pid {self.proc.pid})" for name in self.settings.exporters})
        self._thread = threading.Thread(target=self._loop, name="spectrace-ship", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        wait = self.settings.ship_interval_s  # read at every wake (bench/ship_interval.py switches the settings)
        while not self._stop.wait(wait):
            if self.pipeline.paused:
                continue
            skipped = self.idle_skips
            self.ship()
            self._drain_acks()
            # idle: wait twice as long next time, up to IDLE_WAIT_S; anything sent: the interval again
            interval = self.settings.ship_interval_s
            wait = min(2 * wait, max(interval, IDLE_WAIT_S)) if self.idle_skips > skipped else interval

    def _drain_acks(self) -> None:
        """Acknowledgements of messages nobody waits for: read so the pipe never fills."""
        proc = self.proc
        if proc is None or not self._ack_lock.acquire(blocking=False):
            return
        try:
            while select.select([proc.stdout.raw], [], [], 0)[0]:
                frame = read_frame(proc.stdout.raw)
                if frame is None:
                    return
                self._ack(frame)
        except (OSError, ValueError):
            return
        finally:
            self._ack_lock.release()

    def close(self) -> None:
        """A last message, then EOF; wait (bounded) for the pipeline process's last flush and exit.

        Bounded: a pipeline process that stops reading (hung) would block the last write, so a watchdog kills it
        after :data:`EXIT_WAIT_S` (the write then fails, its records counted as lost); once EOF is delivered the
        engine waits for its last flush at most :data:`EXIT_WAIT_S` more, and leaves it to finish on its own; one seen
        stopped (SIGSTOP) for :data:`STOPPED_GRACE_S` is killed at once, its unwritten records counted."""
        if self._closed:
            return
        self._closed = True
        proc = self.proc
        watchdog = threading.Timer(EXIT_WAIT_S, self._kill, args=(proc,))
        watchdog.daemon = True
        watchdog.start()
        try:
            self._stop.set()
            if self._thread is not None and self._thread is not threading.current_thread():
                self._thread.join(timeout=EXIT_WAIT_S)
            self._thread = None
            self.ship(final=True)
            proc = self.proc
            if proc is None:
                return
            try:
                proc.stdin.close()
            except OSError:
                pass
            watchdog.cancel()  # EOF is delivered: from here it only writes what it has, on its own
            try:
                _wait_unless_stopped(proc, EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                if not _stopped(proc.pid):
                    log.warning("spectrace: the pipeline process (pid %d) is still writing after %.0f s; it finishes "
                                "on its own (%d records not confirmed written yet)", proc.pid, EXIT_WAIT_S,
                                sum(n for _, n in self._unacked))
                    return
                log.warning("spectrace: the pipeline process (pid %d) is stopped (SIGSTOP?) at exit; killed, its "
                            "unwritten records counted as lost", proc.pid)
                self._kill_now(proc)
            self._drain_acks()  # its last flush's acknowledgements
            if self._unacked:  # shipped and never written: lost with it
                self._lost(sum(n for _, n in self._unacked), messages=len(self._unacked),
                           why=f"the pipeline process ended at exit (exit {proc.returncode}) before writing them")
                self._unacked.clear()
        finally:
            watchdog.cancel()
            self._totals()

    def _totals(self) -> None:
        """At exit: one line with every record this process lost, and where the count is kept."""
        self._publish(force=True)
        if not self.lost_records:
            return
        reasons = "; ".join(f"{n} {why}" for why, n in self.lost_by_reason.items())
        kept = (f"{self._lost_unreported} of them never reached a pipeline process: kept in {self.ledger.path} for "
                "the next pipeline process on this host to write into the store" if self._lost_unreported and
                self.ledger.path is not None else "every one counted in the store's dropped records")
        log.warning("spectrace: this process (pid %d) lost %d records in %d messages to its pipeline processes "
                    "(%d started%s): %s; %s", self.rt.pid, self.lost_records, self.lost_messages, self.started,
                    f"; tracing stopped: {self.stopped}" if self.stopped else "", reasons, kept)

    @staticmethod
    def _kill(proc) -> None:
        if proc is not None and proc.poll() is None:
            log.warning("spectrace: the pipeline process (pid %d) took no records for %.0f s at exit; killed, its "
                        "unwritten records counted as lost", proc.pid, EXIT_WAIT_S)
            proc.kill()

    def unconfirmed(self) -> int:
        """Records shipped that the pipeline process has not acknowledged written yet."""
        return sum(n for _, n in list(self._unacked))

    def stats(self) -> dict[str, Any]:
        return {
            "pid": self.proc.pid if self.proc is not None else None,
            "started": self.started,
            "messages": self.messages,
            "idle_skips": self.idle_skips,
            "bytes": self.bytes_shipped,
            "lost_messages": self.lost_messages,
            "lost_records": self.lost_records,
            "unconfirmed_records": self.unconfirmed(),  # shipped, not acknowledged written yet
            "lost_unreported": self._lost_unreported,  # of them, what no pipeline process took (the ledger's count)
            "stopped": self.stopped,
            "ship_cpu_ms": self.ship_cpu_ns / 1e6,
        }


def _stopped(pid: int) -> bool:
    """Is ``pid`` stopped (SIGSTOP, a debugger): state T or t in /proc?"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


class _StoppedFor:
    """How long ``pid`` has been seen stopped without a break (0 while it runs), read from /proc at each call."""

    def __init__(self, pid: int) -> None:
        self.pid, self.since = pid, None

    def seconds(self) -> float:
        if not _stopped(self.pid):
            self.since = None
            return 0.0
        now = time.monotonic()
        if self.since is None:
            self.since = now
        return now - self.since


def _wait_unless_stopped(proc, timeout: float) -> None:
    """``proc.wait(timeout)``, cut short once ``proc`` was seen stopped :data:`STOPPED_GRACE_S` without a break.
    Raises subprocess.TimeoutExpired when it has not exited."""
    deadline = time.monotonic() + timeout
    stopped = _StoppedFor(proc.pid)
    while True:
        left = deadline - time.monotonic()
        try:
            proc.wait(timeout=max(0.0, min(left, 0.5)))
            return
        except subprocess.TimeoutExpired:
            if left <= 0.5 or stopped.seconds() >= STOPPED_GRACE_S:
                raise
