"""The wire between an engine process and its pipeline process: one typed :class:`Shipment`, in frames.

Both sides of ``SPECTRACE_PIPELINE=process`` depend on this module and on nothing of each other: the engine's
shipper (``spectrace.recorder.shipper``) writes, the pipeline process (``spectrace.collector.process``) reads.

- A frame is a length (8 bytes, network order) and a payload; EOF, or a frame cut short, ends the stream.
- A shipment is one :class:`Shipment` (a dataclass with a :data:`VERSION`), pickled by :func:`dumps_shipment`: its
  per-step records (:data:`PARTS`) in groups, with a pause for the GIL between groups, so that an engine thread that
  woke while it pickles waits at most a group. Its fields hold the record types the hooks made
  (``spectrace.recorder.verify.capture``: ``EngineStep``, ``WorkerStep``, ``StepTiming``, ``Proposal``,
  ``HostStep``, ``ReadRequest``), the value records only the metrics sink reads (``spectrace.values``), rows of
  ``spectrace.records`` tables and the process's state (:class:`ProcessState`); the far side gets the same types
  back, never a method name to call.
- Spans travel as plain values (:func:`span_values`, :func:`rebuild_span`).
"""

from __future__ import annotations

import io
import pickle
import struct
import time
from collections import deque
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple


FRAME = struct.Struct("!Q")

# A message's per-step records are pickled in groups by one pickler (its memo shared: a request id or a dict two
# records hold is written once), and between groups, once ``YIELD_AFTER_NS`` of pickling has passed, the shipper
# sleeps ``YIELD_S``: a waiting engine thread takes the GIL then, and the shipper's next group mostly waits for the
# engine thread's next release (its wait on the device). One ``pickle.dumps`` of the whole message holds the GIL
# in C for its whole length (~0.6 ms at batch 256, 5 steps), and an engine thread that woke in it waited all of it
# (bench/gpu_rates.py at 256 x 50: +0.155 ms of GIL wait a step in 2 of 5 jobs, ~0.01 in the others). Each pause
# costs the shipper 20-45 µs of CPU (a sleep and the GIL handed back and forth; 45 in a 256 x 50 job), so groups are
# sized to about ``YIELD_AFTER_NS`` of pickling each, not one record.
PARTS = ("engine", "worker", "requests")  # the shipment's fields pickled in groups of records
YIELD_AFTER_NS = 150_000
YIELD_S = 20e-6  # 0: no pauses (bench/gpu_rates.py --ship-pauses off, to measure what they do)


class GilPauses:
    """The shipper's pauses for the GIL during one stretch of work (pickling a message, reading its requests):
    :meth:`due` sleeps ``YIELD_S`` once ``YIELD_AFTER_NS`` has passed since the last pause (or the start), so that an
    engine thread waiting for the GIL gets it. ``pause``: the sleep (``time.sleep`` when None, looked up per call)."""

    __slots__ = ("_pause", "_mark")

    def __init__(self, pause=None) -> None:
        self._pause = pause
        self._mark = time.perf_counter_ns()

    def due(self, now: int | None = None) -> None:
        """Pause if it is time (``now``: the caller's ``perf_counter_ns`` reading, if it has one)."""
        if YIELD_S and (time.perf_counter_ns() if now is None else now) - self._mark >= YIELD_AFTER_NS:
            (self._pause or time.sleep)(YIELD_S)
            self._mark = time.perf_counter_ns()


# -- draft dicts as they travel ------------------------------------------------------


class PackedDrafts(NamedTuple):
    """A step's draft dict (``scheduled_spec_decode_tokens``: request id -> draft token ids) as the shipper sends
    it: the request ids in the dict's order, each row's length (a byte each) and every row's tokens joined (4-byte
    ints in this host's byte order: both ends of the wire run on one host). Packing costs the engine's process about
    what pickling the dict's lists did; the pipeline process reads the packed form as arrays instead of unpickling,
    counting and freeing a list per request-step (bench/ship_encoding.py, bench/pipeline_replay.py)."""

    ids: list
    lengths: bytes
    tokens: bytes


def pack_drafts(drafts: dict) -> "PackedDrafts | dict":
    """``drafts`` packed; as it is where it does not pack (a row of 256 drafts or more, an id beyond 32 bits,
    something not an int): the pipeline process reads both."""
    values = drafts.values()
    flat: list = []
    try:
        deque(map(flat.extend, values), 0)  # the rows joined, in C
        return PackedDrafts(list(drafts), bytes(map(len, values)), struct.pack(f"={len(flat)}i", *flat))
    except (ValueError, TypeError, OverflowError, struct.error):
        return drafts


def drafts_total(drafts) -> int:
    """Draft tokens in a draft dict, packed or not."""
    if type(drafts) is PackedDrafts:
        return sum(drafts.lengths)
    return sum(map(len, drafts.values()))


# -- frames: a length and a pickle ------------------------------------------------


def write_frame(out, payload: bytes) -> None:
    out.write(FRAME.pack(len(payload)))
    out.write(payload)
    out.flush()


def dumps_shipment(shipment: "Shipment", *, pause=time.sleep) -> bytes:
    """A shipment as one payload: the shipment without its :data:`PARTS` and their lengths, then their records in
    groups (lists), pickled by one pickler (a memo shared by all: a request id or a dict two records hold is written
    once), with a pause for the GIL whenever ``YIELD_AFTER_NS`` of pickling passed. A group holds as many records as
    the last group's pickling time says fit in ``YIELD_AFTER_NS``."""
    parts = [(key, getattr(shipment, key)) for key in PARTS]
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dump((replace(shipment, **{key: [] for key in PARTS}), [(key, len(records)) for key, records in parts]))
    clock = time.perf_counter_ns
    pauses = GilPauses(pause)
    for _, records in parts:
        i, size = 0, 1
        while i < len(records):
            group = records[i:i + size]
            started = clock()
            pickler.dump(group)
            now = clock()
            i += len(group)
            size = max(1, min(4 * size, size * YIELD_AFTER_NS // max(now - started, 1)))
            pauses.due(now)
    return out.getvalue()


def loads_shipment(payload: bytes) -> "Shipment":
    """:func:`dumps_shipment`'s shipment again (one unpickler: the memo spans the groups). Raises ``ValueError`` for a
    payload that is not a shipment of this :data:`VERSION` (both ends run one install: a mismatch is a bug)."""
    unpickler = pickle.Unpickler(io.BytesIO(payload))
    head = unpickler.load()
    if not (isinstance(head, tuple) and len(head) == 2 and isinstance(head[0], Shipment)):
        raise ValueError(f"not a shipment: {type(head).__name__}")
    shipment, parts = head
    if shipment.version != VERSION:
        raise ValueError(f"shipment version {shipment.version}, this collector reads {VERSION}")
    for key, n in parts:
        records: list = []
        while len(records) < n:
            records += unpickler.load()
        setattr(shipment, key, records)
    return shipment


def read_frame(inp) -> bytes | None:
    """One frame's payload, or None at EOF (a frame cut short is EOF too)."""
    head = _read_exactly(inp, FRAME.size)
    if head is None:
        return None
    return _read_exactly(inp, FRAME.unpack(head)[0])


def _read_exactly(inp, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = inp.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# -- spans and metric updates as plain values ---------------------------------------


def span_values(span) -> tuple:
    """A finished span as plain, picklable values (``rebuild_span`` makes it a span again)."""
    ctx = span.get_span_context()
    parent = span.parent
    return (
        span.name,
        (ctx.trace_id, ctx.span_id, ctx.is_remote, int(ctx.trace_flags), list(ctx.trace_state.items())),
        (parent.trace_id, parent.span_id, parent.is_remote, int(parent.trace_flags), list(parent.trace_state.items()))
        if parent is not None else None,
        dict(span.attributes or {}),
        [(e.name, dict(e.attributes or {}), e.timestamp) for e in span.events],
        [((link.context.trace_id, link.context.span_id, link.context.is_remote, int(link.context.trace_flags),
           list(link.context.trace_state.items())), dict(link.attributes or {})) for link in span.links],
        int(span.kind.value),
        (int(span.status.status_code.value), span.status.description),
        span.start_time,
        span.end_time,
    )


def rebuild_span(values: tuple, resource, scope):
    """The ``ReadableSpan`` a pipeline process hands its span processors (rows, OTLP)."""
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState
    from opentelemetry.trace.status import Status, StatusCode

    def context(v):
        return SpanContext(v[0], v[1], v[2], TraceFlags(v[3]), TraceState(v[4]))

    name, ctx, parent, attributes, events, links, kind, status, start, end = values
    return ReadableSpan(
        name=name,
        context=context(ctx),
        parent=context(parent) if parent is not None else None,
        resource=resource,
        attributes=attributes,
        events=[Event(n, a, t) for n, a, t in events],
        links=[Link(context(c), a) for c, a in links],
        kind=SpanKind(kind),
        status=Status(StatusCode(status[0]), status[1]),
        start_time=start,
        end_time=end,
        instrumentation_scope=scope,
    )


# -- the shipment ---------------------------------------------------------------------

VERSION = 1  # Shipment's layout; loads_shipment refuses another


@dataclass
class RunState:
    """A run as the engine process knows it (``spectrace.recorder.runs.Run`` without its live span)."""

    run_id: str
    traceparent: str
    started_ns: int
    info: dict[str, Any]


@dataclass
class ProcessState:
    """What the engine process is: its runs and current run, the roles that fired in it (in order) and their ranks,
    and the labels vLLM's series carry (``spectrace.sinks.exposition.PROCESS_LABELS``)."""

    run: str | None
    runs: list[RunState]
    roles: list[str]
    ranks: dict[str, int]
    labels: dict[str, str]


class ShippedRequest(NamedTuple):
    """A request as the engine process read it once its prefill was known (``ReadRequest``), with its flags
    (greedy, structured output) and W3C trace headers where it had them."""

    request: Any  # spectrace.recorder.verify.capture.ReadRequest
    flags: tuple[bool, bool] | None
    traces: dict[str, str] | None


@dataclass
class Shipment:
    """Everything an engine process recorded since its last shipment, typed (module docstring).

    ``engine`` / ``worker``: the steps as the hooks made them, each draft dict packed once (:class:`PackedDrafts`)
    and the cached requests' two fields (``capture.Cached``); ``timings``: the worker's finished ``StepTiming``s;
    ``proposals``: ``Proposal``s with their draft totals (an int); ``host``: ``HostStep``s with their tokens counted
    (an int); ``requests``: :class:`ShippedRequest`; ``finished``: (run, ts, request ids) of steps without drafts;
    ``configs``: run id -> its ``RunConfig`` (once per run and pipeline process); ``rows``: table -> rows the
    low-rate hooks wrote; ``values``: ``spectrace.values`` records; ``spans``: :func:`span_values`; ``errors``: hook
    error counts since the last shipment; ``dropped``: rows the engine's full buffer refused; ``dropped_steps``:
    steps the capture's full buffers refused; ``agreements``: for each run begun, the engine/worker agreement to
    judge of every other run (its id: the one excluded); ``facts``: the load-time hooks' readings
    (``spectrace.load_facts.LoadFacts``), for the collector to judge; ``flush``: flush at once and acknowledge; ``final``: the
    engine's orderly end."""

    seq: int = 0
    state: ProcessState | None = None
    engine: list = field(default_factory=list)
    worker: list = field(default_factory=list)
    requests: list = field(default_factory=list)
    timings: list = field(default_factory=list)
    proposals: list = field(default_factory=list)
    host: list = field(default_factory=list)
    finished: list = field(default_factory=list)
    configs: dict = field(default_factory=dict)
    rows: dict = field(default_factory=dict)
    values: list = field(default_factory=list)
    spans: list = field(default_factory=list)
    errors: dict = field(default_factory=dict)
    dropped: int = 0
    dropped_steps: int = 0
    agreements: list = field(default_factory=list)
    facts: list = field(default_factory=list)
    flush: bool = False
    final: bool = False
    version: int = VERSION

    RECORDS = ("engine", "worker", "timings", "proposals", "host", "spans", "facts")  # what counts as records (lost, if lost)

    def records(self) -> int:
        """The records it carries (what is counted as lost if it never reaches a pipeline process): the per-step
        records, the spans and the rows."""
        return sum(len(getattr(self, key)) for key in self.RECORDS) + sum(map(len, self.rows.values()))

    def carries_only_state(self) -> bool:
        """Nothing but the state (an idle process's wake)."""
        return not any(getattr(self, f.name) for f in fields(self) if f.name not in ("seq", "state", "version"))
