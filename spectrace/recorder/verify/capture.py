"""The verification capture: what the per-step hooks append, and nothing else.

The hooks (``spectrace.recorder.verify.hooks``) run on vLLM's threads, once per engine or
worker step. They append one record per step to a bounded deque here, holding only what
vLLM already holds on the host (references to its per-step objects, ints, lists of ints);
the shipper (``spectrace.recorder.shipper``) takes them every ship interval for a pipeline
process, or, where the flush runs in this process (``SPECTRACE_PIPELINE=thread``), the
collector's drain (``spectrace.collector.drain``) takes them on the flush thread. This is the
engine's side only: a pipeline process keeps the records it is shipped in an inbox of its own
(``spectrace.collector.inbox``), never in these deques.

Records are let go of on vLLM's threads. A record keeps its step's objects (the draft dict
and its lists, the frontend's outputs) until the shipper has sent it or the drain has
counted it, 0.25 or 2 s later. Freed there, hundreds of objects at once on another thread,
they no longer offset the engine thread's allocations in the cyclic collector's
young-generation count (CPython lowers the count on a free only while it is above zero), and
the collector ran more often on the engine thread: +35 µs a step at batch 64 (BENCHMARKS.md,
"The collector on the engine thread"). So the shipper and the drain hand the records they are
done with to :attr:`Capture.release`, and each per-step hook call drops one of them (two in
``update_from_output``, which appends two), about one for each record a step appends
(:meth:`Capture.release_one`): a step's objects are freed on vLLM's thread among its
allocations, as they are without tracing, one shipment later.

Records are named (:class:`EngineStep`, :class:`WorkerStep`: ``NamedTuple``;
:class:`StepTiming`: a ``__slots__`` object the timing hooks fill in as the step runs).
Built with positional arguments they cost what a tuple costs (bench/hotpath.py).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, NamedTuple

ENGINE = "engine_core"
WORKER = "worker"
FRONTEND = "frontend"

MAX_BUFFERED_STEPS = 100_000  # per deque: beyond it a step is dropped and counted
MAX_REQUEST_FLAGS = 100_000  # requests remembered (greedy, structured; trace headers)
MAX_ACTIVE_SLICES = 10_000  # requests whose slice the drain keeps (added, or verifying): the oldest go first


class EngineStep(NamedTuple):
    """One engine-core step that verified drafts (``Scheduler.update_from_output``)."""

    ts: int  # time.time_ns() at the hook
    step_no: int  # the engine core's step number in this process
    run_id: str | None
    drafts: dict  # scheduler_output.scheduled_spec_decode_tokens: request id -> draft token ids
    sampled_lens: list[int] | None  # tokens sampled per row (accepted + 1), before vLLM trims
    req_ids: list  # model_runner_output.req_ids: the output's rows (vLLM 0.34 has no req_id_to_index)
    cached: Any  # scheduler_output.scheduled_cached_reqs (request ids, computed tokens)
    invalid: dict | None  # scheduler_output.num_invalid_spec_tokens (structured output)
    num_sampled: int  # Scheduler.num_sampled_tokens_per_step
    # tokens each row emitted, where a request finished in the step (vLLM trims a stopped request's tokens in
    # place: EOS, max_tokens, stop token ids); None: no request finished, every row emitted what it sampled
    emitted_lens: list[int] | None = None
    finished: list[str] | None = None  # requests that finished in the step (Scheduler.finished_req_ids grew)
    # the step's sampled token ids per row (ModelRunnerOutput.sampled_token_ids, vLLM's own host lists, held not
    # copied), only where a reasoning parser's think markers are known: the drain reads each step's phase off them
    sampled_ids: list | None = None


class Cached(NamedTuple):
    """The cached requests' ids and computed tokens of one step (``CachedRequestData``'s two fields the drain
    reads), as the shipper hands them to a pipeline process."""

    req_ids: list
    num_computed_tokens: list


class WorkerStep(NamedTuple):
    """One worker step's verification output (V1 ``_bookkeeping_sync``, V2 ``AsyncOutput``)."""

    ts: int
    run_id: str | None
    rank: int | None
    drafts: Any  # V1: request id -> draft token ids; V2: draft count per row
    valid_lens: list[int]  # tokens each row yielded (accepted + 1)
    row_of: dict | None  # V1: request id -> row; V2: None (rows aligned with ``drafts``)


class RequestNote(NamedTuple):
    """One request as the scheduler took it (``Scheduler.add_request``): references vLLM holds, read in the drain."""

    run_id: str | None
    request_id: str
    sampling_params: Any  # Request.sampling_params (None for pooling)
    lora_request: Any  # Request.lora_request
    prefill_stats: Any  # Request.prefill_stats: prompt and prefix-cache tokens once first scheduled
    prompt_token_ids: Any = None  # Request.prompt_token_ids (vLLM's list): its tail says the thinking mode
    think_markers: Any = None  # (start ids, end ids) from the run's ReasoningConfig; None without a reasoning parser


class ReadRequest(NamedTuple):
    """A request's note as a pipeline process gets it: its parameters already read (``request_parameters``)."""

    run_id: str | None
    request_id: str
    params: dict


class Proposal(NamedTuple):
    """The drafts the worker proposed after one step (``Scheduler.update_draft_token_ids``, synchronous scheduling)."""

    run_id: str | None
    # DraftTokenIds.draft_token_ids: one list per request (a new object every step); as the shipper sends it, their
    # total (an int: the token budget counts nothing else)
    draft_token_ids: list | int


class StepTiming:
    """One worker step's host times, filled in by the timing hooks as the step runs."""

    __slots__ = ("run_id", "rank", "has_drafts", "execute_ns", "sample_ns", "draft_ns", "done", "scheduled_tokens", "requests")

    def __init__(self, run_id: str | None, rank: int | None, has_drafts: bool, execute_ns: int, done: bool,
                 scheduled_tokens: int, requests: int) -> None:
        self.run_id = run_id
        self.rank = rank
        self.has_drafts = has_drafts  # the step verified drafts
        self.execute_ns = execute_ns  # GPUModelRunner.execute_model (the target forward)
        self.sample_ns = 0  # sample_tokens (verification, drafting, bookkeeping)
        self.draft_ns = 0  # propose_draft_token_ids (drafting, inside sample_tokens)
        self.done = done  # no sample_tokens will follow (execute_model returned the output)
        self.scheduled_tokens = scheduled_tokens
        self.requests = requests

    def __reduce__(self):  # shipped as its fields (a tuple), not a dict of slots
        return _timing, (self.run_id, self.rank, self.has_drafts, self.execute_ns, self.sample_ns, self.draft_ns,
                         self.done, self.scheduled_tokens, self.requests)

    def __eq__(self, other) -> bool:
        return type(other) is StepTiming and self.__reduce__()[1] == other.__reduce__()[1]

    __hash__ = None


def _timing(run_id, rank, has_drafts, execute_ns, sample_ns, draft_ns, done, scheduled_tokens, requests) -> StepTiming:
    timing = StepTiming(run_id, rank, has_drafts, execute_ns, done, scheduled_tokens, requests)
    timing.sample_ns, timing.draft_ns = sample_ns, draft_ns
    return timing


class HostStep(NamedTuple):
    """One step's host time outside the worker (what k pays prices it beside the worker's step): the engine core's
    ``Scheduler.schedule`` plus ``update_from_output``, or the frontend's ``OutputProcessor.process_outputs``."""

    run_id: str | None
    role: str  # ENGINE or FRONTEND
    ns: int  # host clock (perf_counter_ns) around the timed calls
    # the tokens the step emitted: an int, a list of per-row lengths (engine core, a step that verified drafts),
    # or the frontend's list of engine-core outputs (each ``new_token_ids`` counted in the drain)
    tokens: Any
    stamp: float | None = None  # frontend: the engine step's timestamp (AsyncLLM processes one step in chunks)


def host_tokens(step: HostStep) -> int:
    """The tokens one host step emitted (read in the drain, never on vLLM's thread)."""
    tokens = step.tokens
    if isinstance(tokens, int):
        return tokens
    if step.role == FRONTEND:
        return sum(len(getattr(output, "new_token_ids", None) or ()) for output in tokens)
    return sum(tokens)


class Capture:
    """The per-process buffers the hot path appends to (one per runtime; a forked child builds its own)."""

    def __init__(self) -> None:
        # deques: the engine thread appends while the flush thread pops, and neither
        # ever loses the other's item (a list swapped under the appender could).
        self.engine_steps: deque[EngineStep] = deque()
        self.worker_steps: deque[WorkerStep] = deque()
        self.worker_timings: deque[StepTiming] = deque()
        self.open_timing: StepTiming | None = None  # the step being timed now (the drain leaves it)
        self.dropped_steps = 0  # steps not buffered because the flush fell behind
        self.engine_step_no = 0
        self.request_flags: dict[str, tuple[bool, bool]] = {}  # request id -> (greedy, structured output)
        self.request_traces: dict[str, dict[str, str]] = {}  # request id -> W3C trace headers
        self.new_requests: deque[RequestNote] = deque()  # requests added since the last drain
        self.proposals: deque[Proposal] = deque()
        self.host_steps: deque[HostStep] = deque()  # engine core and frontend host time per step (what k pays)
        # (run, ts, request ids) finished in an engine step without drafts (those with drafts: EngineStep.finished)
        self.finished: deque[tuple[str | None, int, list[str]]] = deque()
        self.schedule_ns = 0  # the engine core's last Scheduler.schedule, added to its update_from_output
        self.keep_sampled = False  # a reasoning parser's markers are known: engine steps hold their sampled ids
        # records the shipper sent or the drain counted, and the objects they hold: dropped by vLLM's threads
        self.release: deque | None = deque()
        # the facts the drain reads of each run's VllmConfig, read here, in the engine's process (RunConfig)
        self.run_configs: dict[str, object] = {}  # run id -> its VllmConfig (engine core)
        self.run_facts: dict[str, Any] = {}  # run id -> its RunConfig (each part read once)
        self.runtime_layers: dict | None = None  # role -> layer rows, when a worker loaded the models in this process

    # -- the engine's facts (engine core, worker: at start-up and model load) --------------

    def note_config(self, run_id: str | None, vllm_config) -> None:
        """Keep the run's VllmConfig (engine core): its boundaries are read in the drain."""
        if run_id is None:
            return
        if len(self.run_configs) >= 16:
            self.run_configs.pop(next(iter(self.run_configs)))
        self.run_configs[run_id] = vllm_config
        self.run_facts.pop(run_id, None)  # read anew from this config

    def note_layout(self, runtime_layers: dict) -> None:
        """What the models a worker loaded in this process run (role -> layer rows): the judge's layout facts."""
        self.runtime_layers = runtime_layers

    def config_of(self, run_id: str | None):
        """What the drain reads of the run's VllmConfig (``RunConfig``: each part read once, on first use; a
        pipeline process is shipped the parts, read in the engine's process: ``RunConfig.__getstate__``)."""
        facts = self.run_facts.get(run_id)
        if facts is None:
            from spectrace.recorder.verify.run_config import RunConfig

            if len(self.run_facts) >= 16:
                self.run_facts.pop(next(iter(self.run_facts)))
            facts = self.run_facts[run_id] = RunConfig(self.run_configs.get(run_id), lambda: self.runtime_layers)
        return facts

    # -- the hooks' side (vLLM's threads) ----------------------------------------------

    def release_one(self) -> None:
        """Drop the oldest record the shipper or the drain is done with: its step's objects are freed here, on vLLM's
        thread. Each per-step hook call calls it once (``update_from_output`` twice: a host step and an engine step),
        about once for each record a step appends, so records are let go of as fast as they come, a step's worth a
        step. Dropping a whole shipment's records at once, even on vLLM's thread, still met a count at
        zero, and the collector ran nearly as often (BENCHMARKS.md)."""
        try:
            self.release.popleft()
        except (IndexError, AttributeError):  # nothing waiting
            pass

    def add_worker_step(self, run_id: str | None, rank: int | None, drafts, sampled, row_of: dict | None) -> None:
        """One worker step's verification output (V1 and V2 hooks): the rows' lengths, bounded."""
        if len(self.worker_steps) < MAX_BUFFERED_STEPS:
            self.worker_steps.append(WorkerStep(time.time_ns(), run_id, rank, drafts, list(map(len, sampled)), row_of))

    # -- the drain's side (flush thread) ---------------------------------------------

    def take_engine_steps(self) -> list[EngineStep]:
        queue = self.engine_steps
        return [queue.popleft() for _ in range(len(queue))]

    def take_worker_steps(self) -> list[WorkerStep]:
        queue = self.worker_steps
        return [queue.popleft() for _ in range(len(queue))]

    def take_timings(self) -> list[StepTiming]:
        """Every finished step's timing (the newest stays while its sample_tokens may still run)."""
        queue = self.worker_timings
        taken = []
        while len(queue) > 1 or (queue and queue[0].done):
            taken.append(queue.popleft())
        return taken

    def take_new_requests(self) -> list[RequestNote]:
        queue = self.new_requests
        return [queue.popleft() for _ in range(len(queue))]

    def take_proposals(self) -> list[Proposal]:
        queue = self.proposals
        return [queue.popleft() for _ in range(len(queue))]

    def take_finished(self) -> list[tuple[str | None, int, list[str]]]:
        """Taken before the engine steps: every step a taken request verified drafts in was appended before it."""
        queue = self.finished
        return [queue.popleft() for _ in range(len(queue))]

    def take_host_steps(self) -> list[HostStep]:
        queue = self.host_steps
        return [queue.popleft() for _ in range(len(queue))]

    def let_go(self, *batches: list) -> None:
        """Records taken, and sent or counted: for vLLM's threads to drop (:meth:`release_one`). What is still
        waiting from the last call with records no step came to take (tracing paused, an idle engine): it is freed
        here. A call without records changes nothing (an idle engine keeps at most one call's records)."""
        release = self.release
        if release is None or not any(batches):  # nothing new
            return
        release.clear()
        for batch in batches:
            release.extend(batch)

    def take_dropped(self) -> int:
        dropped, self.dropped_steps = self.dropped_steps, 0
        return dropped


VerifyCapture = Capture  # the name runtime.start(make_capture=...) callers know
