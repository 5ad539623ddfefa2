"""The pipeline process: one per traced engine process with ``SPECTRACE_PIPELINE=process``.

Started by the engine process's shipper (``spectrace.recorder.shipper``) as
``python -m spectrace.collector.process``; reads frames (a length, a pickle) on stdin:

1. the first: the engine's settings and identity (pid, host): every row, segment name and
   exposition file it writes is the engine's (``spectrace.identity.adopt``);
2. then one typed shipment (``spectrace.recorder.wire.Shipment``) every ship interval: the engine's records and
   state, applied to a real :class:`~spectrace.recorder.runtime.Runtime` under the engine's identity, whose collector
   (``spectrace.collector.collector.Collector``: the code the thread shape runs in the traced process) drains the
   shipped records from an :class:`~spectrace.collector.inbox.Inbox` on its flush thread (the judges, every sink,
   compaction);
3. EOF (the engine exited, or was killed): the runtime's shutdown (the engine/worker agreement,
   a last flush, the sinks closed), then exit. The agreement of the run still going is judged only after the
   engine's last message (``final``: it closed in order): an engine killed, or ended by ``os._exit``, may have
   shipped a worker's step whose engine-core side it never recorded, which would read as a disagreement.

A message marked ``flush`` is flushed at once and acknowledged on stdout (its sequence number),
which is all stdout carries: anything else printed goes to stderr, the engine's log.
"""

from __future__ import annotations

import gc
import logging
import os
import pickle
import signal
import sys
import threading
from dataclasses import replace

from spectrace.pipeline import Sink

log = logging.getLogger("vllm.spectrace")

FAULT = "pipeline_process"  # SPECTRACE_INJECT_FAULT name of the pipeline process's own fault


def apply(rt, shipment) -> None:
    """One shipment (``wire.Shipment``) into the runtime: state first, then what the engine's hooks and code
    recorded, each field as the record type it holds."""
    from spectrace.recorder.runtime import Run

    if shipment.state is not None:
        _apply_state(rt, shipment.state, Run)
    if shipment.errors:
        with rt._lock:
            for hook, delta in shipment.errors.items():
                rt.errors[hook] = rt.errors.get(hook, 0) + delta
    if shipment.dropped:
        rt.pipeline.count_dropped(shipment.dropped, buffer=True)  # the engine process's full buffer
    for value in shipment.values:  # spectrace.values records: the metrics sink's
        rt.pipeline.note(value)
    if shipment.spans:
        _apply_spans(rt, shipment.spans)
    for table, rows in shipment.rows.items():
        rt.pipeline.extend(table, rows)
    for facts in shipment.facts:  # the load-time readings: judged in the next flush (spectrace.collector.judging)
        rt.shape.facts(facts)
    if rt.drain is not None:
        rt.drain.source.add(shipment)  # the Inbox: the drain takes the shipped records from it
    for exclude in shipment.agreements:
        rt.shape.check_agreement(exclude=exclude)


def _apply_state(rt, state, Run) -> None:
    from spectrace.sinks import exposition

    for shipped in state.runs:
        run = rt.runs.get(shipped.run_id)
        if run is None:
            run = rt.runs[shipped.run_id] = Run(run_id=shipped.run_id, traceparent=shipped.traceparent,
                                                started_ns=shipped.started_ns)
        run.traceparent = shipped.traceparent
        run.info.update(shipped.info)
    current = state.run
    if current is not None and (rt.run is None or rt.run.run_id != current):
        rt.set_run(rt.runs[current])
    rt.ranks.update(state.ranks)
    for role in state.roles:
        if role not in rt.roles:
            rt.roles.add(role)
            rt.role_order.append(role)
    exposition.PROCESS_LABELS.update(state.labels)
    if rt.provider is None and rt.role_order:
        rt._build_telemetry(rt.role_order[0])  # as the engine did, at its first role


def _apply_spans(rt, spans: list) -> None:
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    import spectrace
    from spectrace.recorder.wire import rebuild_span

    if rt.provider is None:
        rt._build_telemetry(rt.role_order[0] if rt.role_order else None)
    scope = InstrumentationScope("spectrace", spectrace.__version__)
    for values in spans:
        try:
            span = rebuild_span(values, rt.provider.resource, scope)
        except Exception as exc:
            rt.count_error("pipeline.spans", exc)
            continue
        for processor in rt.span_processors:
            try:
                processor.on_end(span)
            except Exception as exc:
                rt.count_error("pipeline.spans", exc)


def _write_losses(rt, init: dict) -> None:
    """Records shippers lost, into the store's ``internal_errors`` (hook ``losses.HOOK``, ``count`` the records) and
    this pipeline's ``dropped``: what this engine's earlier pipeline process never wrote (the shipper's count, in the
    start message), and the ledgers of this host's engine processes that exited with a count no pipeline process
    took (``spectrace.recorder.losses``; each removed once the flush that wrote it is done)."""
    import time

    from spectrace.recorder import losses

    def row(pid, host, run_id, records, why):
        rt.pipeline.append("internal_errors", {**rt.common("process"), "run_id": run_id, "pid": pid, "host": host,
                                               "ts": time.time_ns(), "hook": losses.HOOK, "error": why[:500],
                                               "count": int(records)})

    if init.get("lost"):
        rt.pipeline.count_dropped(init["lost"])  # what an earlier pipeline process of this engine never took
        row(init["pid"], init["host"], init.get("run"), init["lost"], "an earlier pipeline process of this engine "
            "ended before writing them")
    losses.write_claimed(rt, init["host"])


class Acks:
    """What the engine is told: after every flush (the thread's, or one a message asked for), the last message
    whose records that flush wrote, and the pipeline's stats. The engine counts the records of messages never
    acknowledged as lost when this process dies (``Shipper._alive``)."""

    def __init__(self, out) -> None:
        self.out = out
        self.lock = threading.Lock()  # the applying loop and the flush thread
        self.applied = 0  # the last message whose records are all in the runtime
        self.taken = 0  # the last message the running flush took

    def flush_starts(self) -> None:  # the pipeline's first source: what is applied now, this flush writes
        self.taken = self.applied

    def send(self, seq: int, stats: dict) -> None:
        """One frame in one write of at most PIPE_BUF bytes on a non-blocking pipe: whole or not at all (an
        engine that does not read is never waited for; a later acknowledgement covers this one)."""
        from spectrace.recorder.wire import FRAME

        payload = pickle.dumps((seq, stats))
        if len(payload) + FRAME.size > 4096:
            payload = pickle.dumps((seq, None))
        with self.lock:
            try:
                os.write(self.out, FRAME.pack(len(payload)) + payload)
            except OSError:
                pass  # a full pipe, or the engine is gone (EOF follows)


class AckSink(Sink):
    """The pipeline's last sink: acknowledges the flush it was handed (every sink before it has written it)."""

    name = "ack"
    status = "ack"

    def __init__(self, acks: Acks, rt) -> None:
        self.acks, self.rt = acks, rt

    def export(self, batch) -> None:
        if self.acks.taken:
            self.acks.send(self.acks.taken, self.rt.pipeline.stats())

    def close(self) -> None:
        pass


# The records a message brings are containers (lists, dicts) that live until the flush that drains them, then go
# by reference counting; none is cyclic. With CPython's default thresholds (700, 10, 10) every ~700 of them start a
# collection that walks them again, and every few seconds a full one walks the process's whole heap: ~1 % of a core
# at 256 x 50 (a sixth of this process's CPU), for nothing. This process is spectrace's own, not vLLM's: the heap
# its start-up built (modules, the runtime) is frozen out of collections, and a young collection waits for
# GC_YOUNG_THRESHOLD more containers than were freed (two seconds of records at 256 x 50 stay below it).
GC_YOUNG_THRESHOLD = 50_000


def _tune_gc() -> None:
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def main() -> int:
    # Ctrl-C reaches the whole process group: the engine ends this process (EOF) after its last message
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # stdout carries the acknowledgements only: anything printed goes to the engine's stderr
    acks = os.dup(1)
    os.set_blocking(acks, False)
    os.dup2(2, 1)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s [pipeline pid %(process)d] %(message)s")
    inp = sys.stdin.buffer

    from spectrace import identity
    from spectrace.recorder.wire import loads_shipment, read_frame

    frame = read_frame(inp)
    if frame is None:
        return 0
    init = pickle.loads(frame)
    identity.adopt(init["pid"])

    from spectrace.collector.inbox import Inbox
    from spectrace.recorder import runtime

    rt = runtime.Runtime(replace(init["settings"], pipeline="thread", enabled=True), source=Inbox())
    rt.runs.clear()
    rt.run = None
    _write_losses(rt, init)
    ack = Acks(acks)
    rt.pipeline.sources.insert(0, ack.flush_starts)
    rt.pipeline.add_sink(AckSink(ack, rt))
    rt.pipeline.start()
    _tune_gc()
    # SPECTRACE_INJECT_FAULT=pipeline_process: the engine's first pipeline process kills itself, as `kill -9` would,
    # at the first message from the third on that carries engine steps (tests of the restart and of what is counted
    # as lost); a fault of the engine's own settings, never set in production
    doomed = FAULT in rt.settings.inject_fault and init.get("started") == 1
    messages = 0
    final = False
    try:
        while True:
            frame = read_frame(inp)
            if frame is None:
                if not final and messages:
                    rt.agreement_at_exit = False
                    log.warning("spectrace: the engine process (pid %d) ended without its last message (killed?); "
                                "what it shipped is written, and its last run's engine/worker agreement is not "
                                "judged (a step in flight would read as a disagreement)", init["pid"])
                break
            messages += 1
            try:
                shipment = loads_shipment(frame)
                if doomed and messages >= 3 and shipment.engine:
                    os.kill(os.getpid(), signal.SIGKILL)  # with engine steps read and not yet written
                with rt.pipeline._flush_lock:  # a flush takes whole shipments
                    apply(rt, shipment)
                    ack.applied = shipment.seq
            except Exception as exc:  # one bad shipment is counted; the next ones still count
                rt.count_error("pipeline.message", exc)
                continue
            final = final or shipment.final
            if shipment.flush:
                rt.flush()  # acknowledged by the AckSink
    finally:
        rt.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
