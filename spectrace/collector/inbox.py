"""The collector's side of a shipment: the records an engine process shipped, waiting for the drain.

A pipeline process has no hooks, so it has no capture: each shipment (``spectrace.recorder.wire.Shipment``) is put
here (:meth:`Inbox.add`), and the drain (``spectrace.collector.drain.Drain``) takes from it what it takes from the
hooks' capture where the flush runs in the traced process: the same ``take_*`` methods, flags, trace headers and
run configs (``RunConfig``, read in the engine's process and shipped once per run). Records are freed here as they
are drained (no vLLM thread to hand them back to).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any


class Inbox:
    """The shipped records a pipeline process's drain takes (the capture's reading side)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a shipment goes in whole; the drain takes between two
        self.engine_steps: deque = deque()
        self.worker_steps: deque = deque()
        self.worker_timings: deque = deque()
        self.new_requests: deque = deque()
        self.proposals: deque = deque()
        self.host_steps: deque = deque()
        self.finished: deque = deque()
        self.dropped_steps = 0
        self.request_flags: dict[str, tuple[bool, bool]] = {}  # request id -> (greedy, structured output)
        self.request_traces: dict[str, dict[str, str]] = {}  # request id -> W3C trace headers
        self.run_facts: dict[str, Any] = {}  # run id -> its RunConfig, as shipped

    def add(self, shipment) -> None:
        """One shipment's records, in the order the drain takes them."""
        from spectrace.recorder.verify.capture import MAX_REQUEST_FLAGS

        with self._lock:
            self.run_facts.update(shipment.configs)
            for request, flags, traces in shipment.requests:
                self.new_requests.append(request)
                if flags is not None:
                    if len(self.request_flags) >= MAX_REQUEST_FLAGS:
                        self.request_flags.pop(next(iter(self.request_flags)))
                    self.request_flags[request.request_id] = flags
                if traces:
                    if len(self.request_traces) >= MAX_REQUEST_FLAGS:
                        self.request_traces.pop(next(iter(self.request_traces)))
                    self.request_traces[request.request_id] = traces
            self.finished.extend(shipment.finished)
            self.engine_steps.extend(shipment.engine)
            self.worker_steps.extend(shipment.worker)
            for timing in shipment.timings:  # finished on the engine's side: the drain here takes every one
                timing.done = True
            self.worker_timings.extend(shipment.timings)
            self.proposals.extend(shipment.proposals)
            self.host_steps.extend(shipment.host)
            self.dropped_steps += shipment.dropped_steps

    def config_of(self, run_id: str | None):
        facts = self.run_facts.get(run_id)
        if facts is None:  # a run whose config never came (its engine core is not in the shipping process)
            from spectrace.recorder.verify.run_config import RunConfig

            facts = self.run_facts[run_id] = RunConfig(None)
        return facts

    def _take(self, queue: deque) -> list:
        with self._lock:
            return [queue.popleft() for _ in range(len(queue))]

    def take_finished(self) -> list:
        return self._take(self.finished)

    def take_engine_steps(self) -> list:
        return self._take(self.engine_steps)

    def take_worker_steps(self) -> list:
        return self._take(self.worker_steps)

    def take_timings(self) -> list:
        return self._take(self.worker_timings)

    def take_new_requests(self) -> list:
        return self._take(self.new_requests)

    def take_proposals(self) -> list:
        return self._take(self.proposals)

    def take_host_steps(self) -> list:
        return self._take(self.host_steps)

    def take_dropped(self) -> int:
        with self._lock:
            dropped, self.dropped_steps = self.dropped_steps, 0
        return dropped

    def let_go(self, *batches: list) -> None:
        """Drained: freed here, as the drain drops them (no vLLM thread in this process)."""
