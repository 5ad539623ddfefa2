"""Per-process tracing state: settings, the flush pipeline, the tracer, the run.

One :class:`Runtime` per process, created by the plugin when ``SPECTRACE=1``.

Runs and trace context
    A run is one engine start (one config resolution). The frontend starts it in
    ``EngineArgs.create_engine_config``: it opens the root span ``spectrace.run``
    and puts ``<run_id>;<traceparent>`` into ``SPECTRACE_ACTIVE_RUN`` so that the
    engine-core and worker processes vLLM starts afterwards join the same run
    and the same trace. Processes that hold several roles (single-process vLLM)
    share the in-memory run.

Roles
    A process's role comes from the hook site that fires in it: ``frontend``,
    ``engine_core`` or ``worker``. Each record carries the role of the hook that
    wrote it.

Forks
    Everything per process (buffers, locks, the flush thread, the verification
    capture, telemetry) belongs to one :class:`Runtime`. A child forked from a
    traced process keeps the installed hooks and builds a runtime of its own at its
    first hook (``os.register_at_fork``, and a pid check as prometheus_client does);
    it never touches the parent's locks, which another thread may have held at the fork.

Errors
    spectrace's own work inside a hook runs under :func:`guard`, whose only boundary
    is ``try: yield / except``: nothing that can raise runs before the ``yield``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import os
import random
import sys
import threading
import time
from typing import Any, Iterator

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import spectrace
from spectrace import identity, redact
from spectrace.load_facts import LoadFacts, plain
from spectrace.values import Dropped, ErrorCounts, RunInfo
from spectrace.vllm_objects.configs import run_info
from spectrace.settings import ACTIVE_RUN_ENV, Settings, inherited
from spectrace.recorder.hooks import Hook, HookSet
from spectrace.recorder import support
from spectrace.recorder.runs import Run, new_run_id, vllm_version  # callers name them runtime.Run, .vllm_version

log = logging.getLogger("vllm.spectrace")

_propagator = TraceContextTextMapPropagator()


class SystemRandomIds(IdGenerator):
    """Trace and span ids from the operating system's randomness (``random.SystemRandom``), not from the ``random``
    module's global generator, which the OpenTelemetry SDK's default reads and vLLM seeds (``seed``, 0 by default):
    with it every run of one process, and every restart of a server, made the same ids, so that their traces merged
    into one in a tracing backend (three runs of one test engine shared a trace id)."""

    def __init__(self) -> None:
        self._random = random.SystemRandom()

    def generate_span_id(self) -> int:
        while not (span_id := self._random.getrandbits(64)):
            pass
        return span_id

    def generate_trace_id(self) -> int:
        while not (trace_id := self._random.getrandbits(128)):
            pass
        return trace_id

    def is_trace_id_random(self) -> bool:
        return True


def pipeline_shape(setting: str) -> str:
    """``SPECTRACE_PIPELINE`` resolved: ``auto`` is ``process`` wherever vLLM is loaded, its CPU platform included,
    and ``thread`` where it is not (the CLI, a test without vLLM). At a GPU engine's rates the flush thread would cost
    the engine 13-25 % (BENCHMARKS "At GPU rates"); on the CPU engine the process shape cost less than the thread
    shape too (traced over paused at batch 16 and 64: 0.989 and 0.994 against 0.986 and 0.985; BENCHMARKS "The CPU
    engine in either shape")."""
    if setting != "auto":
        return setting
    return "process" if "vllm.platforms" in sys.modules else "thread"


class Runtime:
    """One process's tracing state.

    ``make_capture`` builds the per-process verification capture the hooks append to
    (``spectrace.recorder.verify.capture.Capture``), so a forked child gets its own. ``shape``: where the records go,
    chosen once here from ``SPECTRACE_PIPELINE``: ``spectrace.recorder.shipper.ShipperShape`` (to a pipeline
    process) or ``spectrace.collector.collector.Collector`` (the flush on a thread here, over ``source``: the
    hooks' capture, or a pipeline process's inbox).
    """

    def __init__(self, settings: Settings, make_capture: Any = None, *, source: Any = None) -> None:
        redact.install_logging_filter()  # every line spectrace logs goes through the one redaction
        shape = pipeline_shape(settings.pipeline)
        if shape != settings.pipeline:
            settings = dataclasses.replace(settings, pipeline=shape)
        self.settings = settings
        self.make_capture = make_capture
        self.pid = identity.pid()  # whose records these are (a pipeline process writes under its engine's pid)
        self._owner = os.getpid()  # the process this runtime lives in (forks, atexit)
        self.host = settings.host
        self.roles: set[str] = set()
        self.role_order: list[str] = []  # roles in the order they first fired (the first names the telemetry)
        self.ranks: dict[str, int] = {}
        self.hooks = HookSet()
        self.errors: dict[str, int] = {}
        self._errors_written: dict[str, int] = {}
        self.run: Run | None = None
        self.runs: dict[str, Run] = {}
        self._runs_started = 0
        self._lock = threading.RLock()
        self.provider: TracerProvider | None = None
        self._tracer = None
        self.metrics = None
        self.span_processors: list = []  # what the tracer provider hands finished spans to (a pipeline process replays)
        self._dropped_reported = 0
        self._shut_down = False
        self.agreement_at_exit = True  # a pipeline process whose engine ended without its last message: False
        self.pending_start_line: tuple[int, str] | None = None  # the start-up line, until vLLM's log is set up
        self.verify = make_capture() if make_capture is not None else None  # what the hooks append to
        # model loads in this process (recorder.weights): the one in progress, and the last per model role
        self.weight_loads: dict[str, Any] = {}
        # The one choice of shape, made here: a shipper to a pipeline process (the records leave this process), or
        # the collector on a flush thread of this process, draining ``source`` (the hooks' capture; a pipeline
        # process passes its inbox of shipments).
        if settings.pipeline == "process":
            from spectrace.recorder.shipper import ShipperShape

            self.shape = ShipperShape(self)
        else:
            from spectrace.collector.collector import Collector  # layers: up (the thread shape hosts the collector here)

            self.shape = Collector(self, source if source is not None else self.verify)
        self.pipeline, self.exporter_status = self.shape.pipeline()
        parent_run = inherited(ACTIVE_RUN_ENV)
        if parent_run:
            self.set_run(Run.from_env_value(parent_run))

    # -- telemetry (built at the first hook that fires: then role and run are known) --

    @property
    def tracer(self):
        if self._tracer is None:
            self._build_telemetry(None)
        return self._tracer

    def _resource(self, role: str | None) -> Resource:
        attributes: dict[str, Any] = {
            "service.name": os.environ.get("OTEL_SERVICE_NAME", "vllm"),
            "host.name": self.host,
            "process.pid": self.pid,
            "spectrace.version": spectrace.__version__,
            "vllm.version": vllm_version() or "unknown",
        }
        if role:
            attributes["spectrace.process.role"] = role
        if self.run is not None:
            attributes["spectrace.run_id"] = self.run.run_id
            for key in ("target_model", "draft_model", "method"):
                if self.run.info.get(key):
                    attributes[f"spectrace.{key}"] = str(self.run.info[key])
        rank = self.ranks.get(role) if role else None
        if rank is not None:
            attributes["spectrace.rank"] = rank
        return Resource.create(attributes)

    def _build_telemetry(self, role: str | None) -> None:
        with self._lock:
            if self._tracer is not None:
                return
            resource = self._resource(role)
            provider = TracerProvider(resource=resource, shutdown_on_exit=False, id_generator=SystemRandomIds())
            self.provider = provider
            self.shape.telemetry(provider, resource)
            self._tracer = provider.get_tracer("spectrace", spectrace.__version__)

    def _add_span_processor(self, processor) -> None:
        self.provider.add_span_processor(processor)
        self.span_processors.append(processor)

    @property
    def shipping(self) -> bool:
        """Whether this process ships its records to a pipeline process (``SPECTRACE_PIPELINE=process``)."""
        return self.settings.pipeline == "process"

    @property
    def drain(self):
        """The verification drain, where this process flushes (None where it ships, or has no capture)."""
        return getattr(self.shape, "drain", None)

    @property
    def metered(self) -> bool:
        """Whether this process's records feed metrics (Prometheus or OTLP): then the code that computes a value that
        is not a row (``spectrace.values``) hands it to the pipeline for the metrics sink."""
        return bool({"prometheus", "otlp"} & set(self.settings.exporters))

    def _flush_metric_counters(self) -> None:
        dropped = self.pipeline.dropped
        if self.metered:
            delta = dropped - self._dropped_reported
            if delta > 0:
                self.pipeline.note(Dropped(delta))
            with self._lock:
                errors = dict(self.errors)
            self.pipeline.note(ErrorCounts(errors))
        self._dropped_reported = dropped

    def run_k(self, run_id: str | None) -> int | None:
        """The run's num_speculative_tokens, where the run is known (steps of no run: a frontend whose engine
        start was not traced, or a fault injected there)."""
        run = self.run_by_id(run_id)
        return run.info.get("num_speculative_tokens") if run is not None else None

    def labels(self, run_id: str | None = None) -> dict[str, str]:
        from spectrace.sinks.metrics import common_labels

        run = self.run_by_id(run_id) if run_id else self.run
        return common_labels(run.info if run else {}, run.run_id if run else None)

    def note_vllm_config(self, vllm_config: Any) -> None:
        """Fill the current run's target / draft / method from a VllmConfig (engine core, worker)."""
        if self.run is None or self.run.info.get("method") is not None:
            return
        self.run.info.update(run_info(None, vllm_config))
        if self.metered:
            self.pipeline.note(RunInfo(self.run.run_id, dict(self.run.info), vllm_version(), spectrace.__version__))

    # -- lifecycle ------------------------------------------------------------

    def install(self, hooks: list[Hook], now: bool = False) -> None:
        for hook in hooks:
            reason = self.hooks.install(hook, now)
            self.record(
                "hooks",
                {
                    "ts": time.time_ns(),
                    "hook": hook.name,
                    "target": hook.target,
                    "status": self.hooks.status(hook.name),
                    "detail": reason or self.hooks.untested.get(hook.name, ""),
                    "vllm_version": vllm_version(),
                    "supported_versions": support.range_text(hook.name),
                },
                role="process",
            )

    def shutdown(self) -> None:
        if self._owner != os.getpid() or self._shut_down:
            return  # a forked child's inherited atexit (the parent's buffers), or stop() then atexit
        self._shut_down = True
        pending, self.pending_start_line = self.pending_start_line, None
        if pending is not None:  # a process that never began a run still says what ran
            log.log(pending[0], "%s", pending[1])
        try:
            self.shape.at_shutdown()  # the collector judges the last run's agreement; a shipper leaves it to its own
            if self.provider is not None:
                self.provider.force_flush(timeout_millis=5000)
        except Exception as exc:
            self.count_error("process.shutdown", exc)
        finally:
            self.pipeline.close()
            if self.metrics is not None:
                try:
                    self.metrics.shutdown()
                except Exception:
                    pass
            if self.provider is not None:
                try:
                    self.provider.shutdown()
                except Exception:
                    pass

    def set_run(self, run: "Run | None") -> None:
        if run is not None:
            self.runs[run.run_id] = run
            for sink in self.pipeline.sinks:
                sink.writing(run.run_id)  # the store never evicts the run this process writes
        self.run = run
        pending, self.pending_start_line = self.pending_start_line, None
        if pending is not None and run is not None:  # vLLM's logging is set up by the time a run starts
            log.log(pending[0], "%s; run %s", pending[1], run.run_id)

    def run_by_id(self, run_id: str | None) -> "Run | None":
        if run_id is None:
            return None
        return self.runs.get(run_id) or Run(run_id=run_id, traceparent="")

    # -- runs -----------------------------------------------------------------

    def begin_run(self) -> Run:
        """Start a new run in this (frontend) process and open its root span."""
        with self._lock:
            self._runs_started += 1
            run_id = self.settings.run_id or new_run_id()
            if self.settings.run_id and self._runs_started > 1:
                run_id = f"{self.settings.run_id}.{self._runs_started}"
            previous = self.run
            run = Run(run_id=run_id, traceparent="")
            self.set_run(run)
            self._build_telemetry("frontend")
            root = self.tracer.start_span(
                "spectrace.run",
                context=None,
                attributes={
                    "spectrace.run_id": run_id,
                    "spectrace.process.role": "frontend",
                },
            )
            carrier: dict[str, str] = {}
            _propagator.inject(carrier, context=trace.set_span_in_context(root))
            run.traceparent = carrier.get("traceparent", "")
            run.root_span = root
            if previous is not None and self.verify is not None:
                self.shape.check_agreement(exclude=run_id)
            os.environ[ACTIVE_RUN_ENV] = run.env_value()
            return run

    def end_run_span(self, error: BaseException | None = None) -> None:
        run = self.run
        if run is None or run.root_span is None or not run.root_span.is_recording():
            return
        span = run.root_span
        for key, value in run.info.items():
            if value is not None:
                span.set_attribute(f"spectrace.{key}", value)
        if error is not None:
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.end()
        self.flush()

    # -- roles ----------------------------------------------------------------

    def enter_role(self, role: str, rank: int | None = None) -> None:
        """Note that ``role`` fires in this process; the first time, emit process start."""
        if rank is not None:
            self.ranks[role] = rank
        if role in self.roles:
            return
        self.roles.add(role)
        self.role_order.append(role)
        self._build_telemetry(role)
        attrs = {
            "spectrace.process.roles": sorted(self.roles),
            "spectrace.hooks.installed": sorted(self.hooks.installed),
            "spectrace.hooks.missing": json.dumps(self.hooks.missing),
            "spectrace.exporters": json.dumps(self.exporter_status),
        }
        with self.span("spectrace.process.start", role=role, attributes=attrs):
            pass

    # -- emitting -------------------------------------------------------------

    def common(self, role: str, rank: int | None = None, *, run_id: str | None = None) -> dict[str, Any]:
        if run_id is None and self.run is not None:
            run_id = self.run.run_id
        return {
            "run_id": run_id,
            "process_role": role,
            "pid": self.pid,
            "host": self.host,
            "rank": rank if rank is not None else self.ranks.get(role),
        }

    def record(self, table: str, row: dict[str, Any], *, role: str, rank: int | None = None, run: "Run | None" = None) -> None:
        self.pipeline.append(table, {**self.common(role, rank, run_id=run.run_id if run else None), **row})

    def records(self, table: str, rows: list[dict[str, Any]], *, role: str, rank: int | None = None) -> None:
        common = self.common(role, rank)
        self.pipeline.extend(table, [{**common, **row} for row in rows])

    def facts(self, kind: str, facts: dict[str, Any], *, role: str, rank: int | None = None, span: Any = None) -> None:
        """Hand a load-time hook's reading to the collector to judge (``spectrace.load_facts``): ``span``, where its
        findings go (their span is that one's child). The hook flushes after it, so they are written by then."""
        context = span.get_span_context() if span is not None else None
        parent = (context.trace_id, context.span_id) if context is not None and context.is_valid else None
        self.shape.facts(LoadFacts(kind, role, rank if rank is not None else self.ranks.get(role),
                                   self.run.run_id if self.run is not None else None, time.time_ns(), parent,
                                   plain(facts)))

    def flush(self) -> None:
        """Write everything buffered now (records a failing load must not lose)."""
        self.pipeline.flush()

    def start_span(
        self,
        name: str,
        *,
        role: str,
        rank: int | None = None,
        attributes: dict[str, Any] | None = None,
        start_time: int | None = None,
        run: "Run | None" = None,
        links: list | None = None,
        parent: Any = None,
    ) -> Any:
        """A span in the run's trace (default: the current run), with the common attributes set; ``parent``: an
        OpenTelemetry context to start it under instead of the run's root."""
        run = run or self.run
        attrs: dict[str, Any] = {"spectrace.process.role": role}
        if run is not None:
            attrs["spectrace.run_id"] = run.run_id
        rank = rank if rank is not None else self.ranks.get(role)
        if rank is not None:
            attrs["spectrace.rank"] = rank
        attrs.update({k: v for k, v in (attributes or {}).items() if v is not None})
        if parent is None:
            parent = run.context if run is not None and run.traceparent else None
        return self.tracer.start_span(name, context=parent, attributes=attrs, start_time=start_time, links=links)

    @staticmethod
    def end_span(span: Any, error: BaseException | None = None) -> None:
        if span is None:
            return
        if error is not None:
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.end()

    @contextlib.contextmanager
    def span(self, name: str, **kwargs: Any) -> Iterator[Any]:
        """``start_span`` as a context manager; an exception inside marks the span failed."""
        span = self.start_span(name, **kwargs)
        try:
            yield span
        except BaseException as exc:
            self.end_span(span, exc)
            raise
        else:
            self.end_span(span)

    # -- errors inside spectrace ---------------------------------------------

    def count_error(self, hook: str, exc: BaseException) -> None:
        with self._lock:
            first = hook not in self.errors
            self.errors[hook] = self.errors.get(hook, 0) + 1
        if first:
            log.warning(
                "spectrace: hook %s raised %s: %s (vLLM is unaffected; further errors "
                "of this hook are counted in internal_errors, not logged)",
                hook,
                type(exc).__name__,
                exc,
                exc_info=exc,
            )

    def take_error_deltas(self) -> dict[str, int]:
        """Hook errors counted since the last call, per hook (the flush's ``internal_errors`` rows, or the shipper's
        message to a pipeline process: one of the two takes them)."""
        with self._lock:
            deltas = {
                hook: count - self._errors_written.get(hook, 0)
                for hook, count in self.errors.items()
                if count != self._errors_written.get(hook, 0)
            }
            self._errors_written.update(self.errors)
        return deltas

    def _flush_error_counts(self) -> None:
        for hook, delta in self.take_error_deltas().items():
            self.pipeline.append(
                "internal_errors",
                {**self.common("process"), "ts": time.time_ns(), "hook": hook, "error": "", "count": delta},
            )


_runtime: Runtime | None = None
_parent: Runtime | None = None  # in a forked child: the runtime inherited from the parent
_start_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """Forget the parent's runtime (its locks may be held by a thread that is gone)."""
    global _runtime, _parent, _start_lock
    _start_lock = threading.Lock()
    if _runtime is not None:
        _parent, _runtime = _runtime, None


os.register_at_fork(after_in_child=_after_fork_in_child)


def get() -> Runtime | None:
    """This process's runtime, or None when tracing is off.

    In a forked child the first call builds the child's own runtime, keeping the
    installed hooks and the parent's run.
    """
    rt = _runtime
    if rt is not None and rt._owner == os.getpid():
        return rt
    if rt is None and _parent is None:
        return None
    return start()


def start(settings: Settings | None = None, *, hooks: list[Hook] | None = None, make_capture: Any = None) -> Runtime:
    """Create this process's runtime (once) and install ``hooks``."""
    global _runtime, _parent
    with _start_lock:
        previous = _runtime or _parent
        if previous is not None and previous._owner == os.getpid():
            return previous
        if previous is not None:  # forked child: the hooks are inherited, keep them
            rt = Runtime(settings or previous.settings, make_capture or previous.make_capture)
            rt.hooks = previous.hooks
            if rt.run is None and previous.run is not None:
                rt.set_run(Run(previous.run.run_id, previous.run.traceparent, info=dict(previous.run.info)))
        else:
            rt = Runtime(settings or Settings.from_env(), make_capture)
            rt.install(hooks or [])
            if hooks:
                _log_start(rt)
        _runtime, _parent = rt, None
        rt.pipeline.start()
        rt.shape.at_start(first=previous is None)
        atexit.register(rt.shutdown)
        return rt


def _log_start(rt: Runtime) -> None:
    """The process's one start-up line in vLLM's log: the vLLM (and whether it lies in the tested range), the hooks
    active and why the others are not, where records go and in which pipeline shape. A warning where a hook that this
    vLLM has did not install, or where the vLLM is outside the tested range; else information."""
    version = vllm_version() or "unknown"
    try:
        inside = version != "unknown" and support.in_range(version, support.VLLM_RANGE)
    except ValueError:
        inside = False
    where = f"store {rt.settings.dir}" if "duckdb" in rt.settings.exporters else "no store"
    shape = rt.shape.name
    line = (f"spectrace: tracing on in pid {rt.pid} (vLLM {version}{'' if inside else ', outside the tested range ' + support.VLLM_RANGE}): "
            f"{rt.hooks.summary()}; {where}; exporters {', '.join(rt.settings.exporters) or 'none'}; {shape}")
    failed = rt.hooks.missing or rt.hooks.unsupported
    level = logging.WARNING if failed or not inside else logging.INFO
    if not _vllm_logging_ready() and rt.run is None:
        rt.pending_start_line = (level, line)  # a frontend loads plugins before vLLM sets up its log: said at its run
        return
    log.log(level, "%s", line)


def _vllm_logging_ready() -> bool:
    """Whether an information line of ``vllm.spectrace`` reaches a handler yet (vLLM configures its logger lazily;
    the frontend loads plugins before that)."""
    logger = log
    while logger is not None:
        if logger.handlers:
            return log.isEnabledFor(logging.INFO)
        if not logger.propagate:
            return False
        logger = logger.parent
    return False


def stop() -> None:
    """Remove every hook and flush (tests, and embedding applications)."""
    global _runtime, _parent
    with _start_lock:
        rt, _runtime, _parent = _runtime, None, None
    if rt is not None:
        rt.hooks.uninstall_all()
        rt.shutdown()


_paused: Runtime | None = None  # tracing switched off at run time (pause / resume)


def pause() -> None:
    """Switch tracing off at run time, hooks installed: every hook returns at once (it finds no
    runtime) and the flush thread idles. For measuring what tracing costs in one engine
    (bench/ab_windows.py); ``resume()`` switches it back on. Nothing is lost: rows buffered
    before the pause are flushed after it."""
    global _runtime, _paused
    with _start_lock:
        if _runtime is not None:
            _paused, _runtime = _runtime, None
            _paused.pipeline.paused = True


def resume() -> None:
    global _runtime, _paused
    with _start_lock:
        if _paused is not None:
            _paused.pipeline.paused = False
            _runtime, _paused = _paused, None


class InjectedFault(RuntimeError):
    """What a hook named by ``SPECTRACE_INJECT_FAULT`` raises (tests of the error boundary)."""

    def __init__(self, hook: str) -> None:
        super().__init__(f"fault injected into {hook} (SPECTRACE_INJECT_FAULT)")


def active(hook: str) -> Runtime | None:
    """The runtime a per-step hook records into, or None (tracing off or paused).

    Raises ``InjectedFault`` for a hook named in ``SPECTRACE_INJECT_FAULT``: a per-step hook
    calls it first inside its own ``try`` (a ``with guard()`` per step costs too much there).
    """
    rt = _runtime or get()  # get(): only in a freshly forked child
    if rt is not None and hook in rt.settings.inject_fault:
        raise InjectedFault(hook)
    return rt


@contextlib.contextmanager
def guard(hook: str) -> Iterator[Runtime | None]:
    """Run spectrace's own work for ``hook``: any exception is caught, counted and logged once.

    Yields this process's runtime, or None when there is nothing to do (tracing off,
    or a fault injected into ``hook``: its work is lost as if it had raised at once, and
    counted). The boundary is only ``try: yield / except``, so nothing raises into
    vLLM and vLLM's code after the ``with`` always runs.
    """
    try:
        rt = get()
        if rt is not None and hook in rt.settings.inject_fault:
            rt = None
            raise InjectedFault(hook)
    except Exception as exc:  # a forked child's runtime failed to build, or an injected fault
        rt = None
        count_hook_error(hook, exc)
    try:
        yield rt
    except Exception as exc:
        count_hook_error(hook, exc, rt)


def count_hook_error(hook: str, exc: BaseException, rt: Runtime | None = None) -> None:
    """Count an exception inside ``hook`` (logged once per hook); never raises."""
    rt = rt or _runtime
    if rt is not None:
        rt.count_error(hook, exc)
    else:
        log.warning("spectrace: hook %s raised %s: %s (vLLM is unaffected)", hook, type(exc).__name__, exc)
