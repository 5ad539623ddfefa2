"""spectrace's OpenTelemetry metrics: the metrics contract, fed from the background flush.

| instrument                                | Prometheus series                                   | attributes |
|-------------------------------------------|-----------------------------------------------------|------------|
| counter spectrace.verify.drafted_tokens   | spectrace_verify_drafted_tokens_total               | position, context_bucket + common |
| counter spectrace.verify.accepted_tokens  | spectrace_verify_accepted_tokens_total              | position, context_bucket + common |
| counter spectrace.verify.steps            | spectrace_verify_steps_total                        | common |
| histogram spectrace.verify.acceptance_length | spectrace_verify_acceptance_length_bucket/_sum/_count | common (buckets 1..k+1) |
| counter spectrace.worker.verified_drafted_tokens / _accepted_tokens | spectrace_worker_verified_*_total | rank + common |
| gauge spectrace.config.finding            | spectrace_config_finding                            | code, severity, model_role + common (what the configs and checkpoints say) |
| gauge spectrace.runtime.finding           | spectrace_runtime_finding                           | code, severity, model_role + common (what the run measured: RUNTIME_CODES) |
| gauge spectrace.attention.layer           | spectrace_attention_layer                           | model_role, layer_index, declared_type, runtime_type, runtime_window, status (the audit's verdict: MISMATCH, explained, match, undeclared) + common |
| gauge spectrace.hidden_states.tap         | spectrace_hidden_states_tap                         | tap, expected_id, tapped_id + common |
| gauge spectrace.run.info                  | spectrace_run_info                                  | vllm_version, spectrace_version, num_speculative_tokens, model_runner + common |
| counters spectrace.speculation.{step_seconds,draft_seconds,request_steps,tokens} | spectrace_speculation_*_total | rank + common |
| gauge spectrace.speculation.speedup_estimate | spectrace_speculation_speedup_estimate           | rank + common |
| gauge spectrace.speculation.speedup_by_k  | spectrace_speculation_speedup_by_k                  | k, extrapolated, rank + common |
| gauge spectrace.context.boundary          | spectrace_context_boundary (value: tokens)          | model_role, field + common |
| counters spectrace.slice.{drafted_tokens,accepted_tokens} | spectrace_slice_{drafted,accepted}_tokens_total | dimension, value (at most 8 values per dimension and process, then `other`) + common |
| counters spectrace.drafts.{proposed,verified} | spectrace_drafts_{proposed,verified}_total     | common (synchronous scheduling) |
| counters spectrace.step_shapes.{steps,k_switches} | spectrace_step_shapes_{steps,k_switches}_total | batch_band, k + common (engine core) |
| counter spectrace.export.dropped          | spectrace_export_dropped_total                      | — |
| counter spectrace.internal.errors         | spectrace_internal_errors_total                     | hook |

Common attributes, on every series so PromQL can group by them: ``model``,
``draft_model``, ``method``, ``run_id``. The engine's thread never touches an
instrument: counters are added to once per flush from aggregated counts.

Fed from the flush's records by :class:`MetricsSink` alone (the first sink of a process with metrics): the
``verify_counts``, ``acceptance_lengths``, ``step_shapes``, ``context_boundaries``, ``draft_budget``,
``speculation_steps`` and ``findings`` rows of each batch, and its value records (``batch.values``,
``spectrace.values``: the run judge's speed-up estimates, per-flush slice counts, the layout's verdicts, taps, run
info, error counts, drops), which the code that computes them hands to the pipeline. Nothing outside
``spectrace/sinks/`` calls an instrument.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from typing import Any, Iterable

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource

from spectrace import values as value_records
from spectrace.audit import codes
from spectrace.audit.rules import active
from spectrace.pipeline import Batch, Sink

log = logging.getLogger("vllm.spectrace")

COMMON = ("model", "draft_model", "method", "run_id")
MAX_SLICE_VALUES = 8  # label values per slice dimension and process (bounded series)
# Findings about what the run measured (acceptance, verification, step timing, the scheduler's drafts), not about
# what the configs and checkpoints say: exposed as spectrace_runtime_finding, the others as spectrace_config_finding.
RUNTIME_CODES = frozenset((*codes.codes(component="verification"), *codes.codes(component="ranks"),
                           codes.DRAFTS_UNVERIFIED, codes.DYNAMIC_K_THRASHING, codes.PREFIX_HITS_DROPPED))


def common_labels(info: dict[str, Any], run_id: str | None) -> dict[str, str]:
    return {
        "model": str(info.get("target_model") or ""),
        "draft_model": str(info.get("draft_model") or ""),
        "method": str(info.get("method") or ""),
        "run_id": str(run_id or ""),
    }


class Metrics:
    def __init__(self, readers: list, resource: Resource) -> None:
        self.provider = MeterProvider(metric_readers=readers, resource=resource, shutdown_on_exit=False)
        meter = self.provider.get_meter("spectrace")
        self._meter = meter
        self._lock = threading.Lock()
        self.drafted = meter.create_counter("spectrace.verify.drafted_tokens", unit="", description="Draft tokens verified, per draft position")
        self.accepted = meter.create_counter("spectrace.verify.accepted_tokens", unit="", description="Draft tokens accepted, per draft position")
        self.steps = meter.create_counter("spectrace.verify.steps", unit="", description="Request-steps with drafts")
        self.worker_drafted = meter.create_counter("spectrace.worker.verified_drafted_tokens", unit="", description="Draft tokens a worker rank verified")
        self.worker_accepted = meter.create_counter("spectrace.worker.verified_accepted_tokens", unit="", description="Draft tokens a worker rank accepted")
        # does speculation pay? worker host time of steps that verified drafts, drafting's share,
        # and what they yielded: speed-up = tokens/request_steps * (1 - draft_seconds/step_seconds)
        self.spec_step_seconds = meter.create_counter("spectrace.speculation.step_seconds", unit="", description="Worker host seconds of steps that verified drafts")
        self.spec_draft_seconds = meter.create_counter("spectrace.speculation.draft_seconds", unit="", description="Of those, seconds spent drafting")
        self.spec_request_steps = meter.create_counter("spectrace.speculation.request_steps", unit="", description="Request-steps those steps verified")
        self.spec_tokens = meter.create_counter("spectrace.speculation.tokens", unit="", description="Tokens those request-steps yielded (accepted + 1 each)")
        self._boundaries: dict[tuple, dict[str, str]] = {}
        self._speedups: dict[tuple, tuple[float, dict[str, str]]] = {}
        self._speedups_by_k: dict[tuple, tuple[float, dict[str, str]]] = {}
        meter.create_observable_gauge("spectrace.speculation.speedup_by_k", [self._observe_values(self._speedups_by_k)], unit="", description="What k pays: the speed-up predicted at each k' (label k; extrapolated past the k in force) from the run's counts and step times so far, per worker rank; an estimate: the step time without drafts is fitted from the run, not measured (spectrace report prices it from a run without drafts)")
        meter.create_observable_gauge("spectrace.speculation.speedup_estimate", [self._observe_values(self._speedups)], unit="", description="Speed-up of speculative decoding: the time a token takes without drafts over the time it takes at the k in force (mean acceptance length x step time without drafts / step time), over every worker step of the run so far that verified drafts, per rank; an estimate: the step time without drafts is fitted from the run, not measured. Below 1 speculation costs more than it saves")
        self.slice_drafted = meter.create_counter("spectrace.slice.drafted_tokens", unit="", description="Draft tokens verified, per request slice (dimension, value)")
        self.slice_accepted = meter.create_counter("spectrace.slice.accepted_tokens", unit="", description="Draft tokens accepted, per request slice (dimension, value)")
        self._slice_values: dict[str, set[str]] = {}
        self.drafts_proposed = meter.create_counter("spectrace.drafts.proposed", unit="", description="Draft tokens the worker proposed (synchronous scheduling)")
        self.drafts_verified = meter.create_counter("spectrace.drafts.verified", unit="", description="Draft tokens the scheduled steps verified")
        self.shape_steps = meter.create_counter("spectrace.step_shapes.steps", unit="", description="Steps that verified drafts, by batch-size band and the k they drafted")
        self.shape_switches = meter.create_counter("spectrace.step_shapes.k_switches", unit="", description="Of those, steps whose previous verified step drafted another k")
        self.dropped = meter.create_counter("spectrace.export.dropped", unit="", description="Records or spans spectrace dropped instead of blocking")
        self._length_histogram: Any = None  # built at the first run (its buckets need k)
        self._findings: dict[tuple, dict[str, str]] = {}
        self._runtime_findings: dict[tuple, dict[str, str]] = {}
        self._layers: dict[tuple, dict[str, str]] = {}
        self._taps: dict[tuple, dict[str, str]] = {}
        self._runs: dict[str, dict[str, str]] = {}
        self._errors: dict[str, int] = {}
        meter.create_observable_gauge("spectrace.config.finding", [self._observe(self._findings)], unit="", description="1 while a configuration finding is present: what vLLM resolved, loaded or tapped for the target or drafter against what their checkpoints and settings declare (labels code, severity, model_role; spectrace report explains each)")
        meter.create_observable_gauge("spectrace.runtime.finding", [self._observe(self._runtime_findings)], unit="", description="1 while a runtime finding is present: what the run measured went wrong, e.g. acceptance collapsed or speculation does not pay (labels code, severity, model_role; spectrace report explains each)")
        meter.create_observable_gauge("spectrace.attention.layer", [self._observe(self._layers)], unit="", description="Attention layout per layer (value 1)")
        meter.create_observable_gauge("spectrace.hidden_states.tap", [self._observe(self._taps)], unit="", description="Hidden-state taps (value 1)")
        meter.create_observable_gauge("spectrace.context.boundary", [self._observe_boundaries], unit="", description="A context length where a model of the run changes behaviour (value: tokens)")
        meter.create_observable_gauge("spectrace.run.info", [self._observe(self._runs)], unit="", description="Run metadata (value 1)")
        meter.create_observable_counter("spectrace.internal.errors", [self._observe_errors], unit="", description="Exceptions inside spectrace hooks (vLLM unaffected)")

    def _observe(self, table: dict):
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            with self._lock:
                return [Observation(1, dict(attrs)) for attrs in table.values()]

        return callback

    def _observe_values(self, table: dict):
        """A gauge callback over ``table``: key -> (value, attributes)."""
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            with self._lock:
                return [Observation(value, dict(attrs)) for value, attrs in table.values()]

        return callback

    def _observe_errors(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            return [Observation(count, {"hook": hook}) for hook, count in self._errors.items()]

    def _observe_boundaries(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            return [Observation(int(attrs["tokens"]), {k: v for k, v in attrs.items() if k != "tokens"}) for attrs in self._boundaries.values()]

    # -- fed from the background flush --------------------------------------------


    def speedup_by_k(self, rows: list[dict[str, Any]], rank: int | None, labels: dict[str, str]) -> None:
        """The rows of ``spectrace.audit.rules.speedup.speedup_by_k`` for one run and rank (replacing the last ones)."""
        attrs = {**labels, "rank": str(rank if rank is not None else 0)}
        with self._lock:
            for row in rows:
                if row["speedup"] is not None:
                    key = (labels.get("run_id"), attrs["rank"], row["k"])
                    self._speedups_by_k[key] = (float(row["speedup"]), {**attrs, "k": str(row["k"]),
                                                                        "extrapolated": str(row["extrapolated"]).lower()})

    def speedup_estimate(self, speedup: float | None, rank: int | None, labels: dict[str, str]) -> None:
        """The run judge's speed-up over its window of a worker rank's steps (None: not judged yet)."""
        if speedup is not None:
            attrs = {**labels, "rank": str(rank if rank is not None else 0)}
            with self._lock:
                self._speedups[(labels.get("run_id"), attrs["rank"])] = (float(speedup), attrs)

    def speculation(self, steps: int, step_ns: int, draft_ns: int, request_steps: int, tokens: int, rank: int | None,
                    labels: dict[str, str]) -> None:
        attrs = {**labels, "rank": str(rank if rank is not None else 0)}
        self.spec_step_seconds.add(step_ns / 1e9, attrs)
        self.spec_draft_seconds.add(draft_ns / 1e9, attrs)
        self.spec_request_steps.add(request_steps, attrs)
        self.spec_tokens.add(tokens, attrs)

    def boundaries(self, rows: list[dict[str, Any]], labels: dict[str, str]) -> None:
        with self._lock:
            for row in rows:
                key = (labels.get("run_id"), row["model_role"], row["field"])
                self._boundaries[key] = {**labels, "model_role": str(row["model_role"]), "field": str(row["field"]), "tokens": str(row["tokens"])}


    def verify_counts(self, rows: list[dict[str, Any]], labels: dict[str, str]) -> None:
        for row in rows:
            attrs = {**labels, "position": str(row["position"]), "context_bucket": str(row["context_bucket"])}
            if row["drafted"]:
                self.drafted.add(row["drafted"], attrs)
            self.accepted.add(row["accepted"], attrs)

    def slices(self, counts: dict[tuple[str, str], list[int]], labels: dict[str, str]) -> None:
        """(dimension, value) -> [drafted, accepted]; a dimension's 9th distinct value and later ones read ``other``."""
        for (dimension, value), (drafted, accepted) in counts.items():
            seen = self._slice_values.setdefault(dimension, set())
            if value not in seen:
                if len(seen) >= MAX_SLICE_VALUES:
                    value = "other"
                else:
                    seen.add(value)
            attrs = {**labels, "dimension": dimension, "value": value}
            if drafted:
                self.slice_drafted.add(drafted, attrs)
            self.slice_accepted.add(accepted, attrs)

    def draft_budget(self, proposed: int, verified: int, labels: dict[str, str]) -> None:
        self.drafts_proposed.add(proposed, labels)
        self.drafts_verified.add(verified, labels)

    def step_shapes(self, rows: list[dict[str, Any]], labels: dict[str, str]) -> None:
        """One flush's ``step_shapes`` rows of one run."""
        for row in rows:
            attrs = {**labels, "batch_band": str(row["batch_band"]), "k": str(row["k"])}
            self.shape_steps.add(row["steps"], attrs)
            self.shape_switches.add(row["k_switches"], attrs)

    def worker_counts(self, drafted: int, accepted: int, rank: int | None, labels: dict[str, str]) -> None:
        attrs = {**labels, "rank": str(rank if rank is not None else 0)}
        self.worker_drafted.add(drafted, attrs)
        self.worker_accepted.add(accepted, attrs)

    def acceptance_lengths(self, lengths: list[int], counts: list[int], k: int, labels: dict[str, str]) -> None:
        # One instrument per process: its buckets (1..k+1) follow the first run's k.
        histogram = self._length_histogram
        if histogram is None:
            histogram = self._length_histogram = self._meter.create_histogram(
                "spectrace.verify.acceptance_length",
                unit="",
                description="Accepted draft tokens + 1 per request-step with drafts",
                explicit_bucket_boundaries_advisory=[float(b) for b in range(1, k + 2)],
            )
        total = 0
        for length, count in zip(lengths, counts):
            record_many(histogram, length, int(count), labels)
            total += int(count)
        if total:
            self.steps.add(total, labels)

    def finding(self, code: str, severity: str, model_role: str | None, labels: dict[str, str], present: bool = True) -> None:
        key = (code, model_role, labels.get("run_id"))
        table = self._runtime_findings if code in RUNTIME_CODES else self._findings
        with self._lock:
            if present:
                table[key] = {**labels, "code": code, "severity": severity, "model_role": model_role or ""}
            else:
                table.pop(key, None)

    def layout(self, rows: list[dict[str, Any]], labels: dict[str, str]) -> None:
        with self._lock:
            for row in rows:
                key = (labels.get("run_id"), row["model_role"], row["layer_index"])
                self._layers[key] = {
                    **labels,
                    "model_role": str(row["model_role"]),
                    "layer_index": str(row["layer_index"]),
                    "declared_type": str(row["declared_type"]),
                    "runtime_type": str(row["runtime_type"]),
                    "runtime_window": str(row["runtime_window"] or 0),
                    "status": str(row.get("status") or ""),  # the audit's verdict (spectrace.audit.layout_status)
                }

    def taps(self, rows: list[dict[str, Any]], labels: dict[str, str]) -> None:
        with self._lock:
            for i, row in enumerate(rows):
                self._taps[(labels.get("run_id"), i)] = {
                    **labels,
                    "tap": str(i),
                    "expected_id": str(row.get("expected_id")),
                    "tapped_id": str(row.get("tapped_id")),
                }

    def run_info(self, info: dict[str, Any], labels: dict[str, str], vllm_version: str | None, spectrace_version: str) -> None:
        with self._lock:
            self._runs[labels["run_id"]] = {
                **labels,
                "vllm_version": str(vllm_version or ""),
                "spectrace_version": spectrace_version,
                "num_speculative_tokens": str(info.get("num_speculative_tokens") or ""),
                "model_runner": str(info.get("model_runner") or ""),
            }

    def errors(self, counts: dict[str, int]) -> None:
        with self._lock:
            self._errors = dict(counts)

    def shutdown(self, timeout_millis: int = 3000) -> None:
        self.provider.shutdown(timeout_millis=timeout_millis)


class MetricsSink(Sink):
    """The process's instruments (:class:`Metrics`) updated from each flush's records, before the sinks that read
    them (the exposition file, OTLP's reader) see the batch: the first sink of a process with metrics.
    ``labels(run_id)``: a run's common attributes; ``run_k(run_id)``: its num_speculative_tokens, or None."""

    name = "metrics"

    def __init__(self, metrics: Metrics, labels, run_k) -> None:
        self.metrics = metrics
        self._labels = labels
        self._run_k = run_k

    def export(self, batch: Batch) -> None:
        metrics = self.metrics
        for part in batch:
            table = self._TABLES.get(part.table)
            if table is None:
                continue
            handle, columns = table
            run_id = None if part.run_id == "none" else part.run_id
            rows = part.arrow.select([c for c in columns if c in part.arrow.column_names]).to_pylist()
            handle(self, metrics, rows, run_id, self._labels(run_id))
        for value in batch.values:
            handle = self._VALUES.get(type(value))
            if handle is not None:
                handle(self, metrics, value)

    # -- value records (spectrace.values) ----------------------------------------

    def _run_info(self, metrics: Metrics, value: value_records.RunInfo) -> None:
        metrics.run_info(value.info, self._labels(value.run_id), value.vllm_version, value.spectrace_version)

    def _layout(self, metrics: Metrics, value: value_records.LayoutVerdicts) -> None:
        metrics.layout(value.rows, self._labels(value.run_id))

    def _taps(self, metrics: Metrics, value: value_records.Taps) -> None:
        metrics.taps(value.rows, self._labels(value.run_id))

    def _speedup(self, metrics: Metrics, value: value_records.Speedup) -> None:
        labels = self._labels(value.run_id)
        if value.by_k:
            metrics.speedup_by_k(value.by_k, value.rank, labels)
        metrics.speedup_estimate(value.estimate, value.rank, labels)

    def _slice_counts(self, metrics: Metrics, value: value_records.SliceCounts) -> None:
        metrics.slices(value.counts, self._labels(value.run_id))

    def _error_counts(self, metrics: Metrics, value: value_records.ErrorCounts) -> None:
        metrics.errors(value.counts)

    def _dropped(self, metrics: Metrics, value: value_records.Dropped) -> None:
        if value.count > 0:
            metrics.dropped.add(value.count)

    _VALUES = {
        value_records.RunInfo: _run_info,
        value_records.LayoutVerdicts: _layout,
        value_records.Taps: _taps,
        value_records.Speedup: _speedup,
        value_records.SliceCounts: _slice_counts,
        value_records.ErrorCounts: _error_counts,
        value_records.Dropped: _dropped,
    }

    def _verify_counts(self, metrics: Metrics, rows: list[dict], run_id: str | None, labels: dict[str, str]) -> None:
        metrics.verify_counts([r for r in rows if r["source"] == "engine_core"], labels)
        workers: dict[int | None, list[int]] = {}
        for r in rows:
            if r["source"] == "worker":
                sums = workers.setdefault(r["rank"], [0, 0])
                sums[0] += r["drafted"]
                sums[1] += r["accepted"]
        for rank, (drafted, accepted) in workers.items():
            metrics.worker_counts(drafted, accepted, rank, labels)

    def _acceptance_lengths(self, metrics: Metrics, rows: list[dict], run_id: str | None, labels: dict[str, str]) -> None:
        engine = [r for r in rows if r["source"] == "engine_core"]
        if engine:
            k = self._run_k(run_id) or max(r["length"] for r in engine) - 1
            metrics.acceptance_lengths([r["length"] for r in engine], [r["count"] for r in engine], int(k), labels)

    def _step_shapes(self, metrics: Metrics, rows: list[dict], run_id: str | None, labels: dict[str, str]) -> None:
        metrics.step_shapes(rows, labels)

    def _boundaries(self, metrics: Metrics, rows: list[dict], run_id: str | None, labels: dict[str, str]) -> None:
        metrics.boundaries(rows, labels)

    def _draft_budget(self, metrics: Metrics, rows: list[dict], run_id: str | None, labels: dict[str, str]) -> None:
        for r in rows:
            metrics.draft_budget(r["proposed"], r["verified"], labels)

    def _speculation(self, metrics: Metrics, rows: list[dict], run_id: str | None, labels: dict[str, str]) -> None:
        for r in rows:
            metrics.speculation(r["steps"], r["step_ns"], r["draft_ns"], r["request_steps"], r["tokens"], r["rank"], labels)

    def _findings(self, metrics: Metrics, rows: list[dict], run_id: str | None, labels: dict[str, str]) -> None:
        for r in rows:  # the one rule of what is active (a recovery clears its collapse), as top and report read it
            targets, present = active.effect(r["code"])
            for code in targets:
                metrics.finding(code, r["severity"], r["model_role"], labels, present=present)

    # table -> (its handler, the columns it reads)
    _TABLES = {
        "verify_counts": (_verify_counts, ("source", "rank", "position", "context_bucket", "drafted", "accepted")),
        "acceptance_lengths": (_acceptance_lengths, ("source", "length", "count")),
        "step_shapes": (_step_shapes, ("batch_band", "k", "steps", "k_switches")),
        "context_boundaries": (_boundaries, ("tokens", "model_role", "field")),
        "draft_budget": (_draft_budget, ("proposed", "verified")),
        "speculation_steps": (_speculation, ("rank", "steps", "step_ns", "draft_ns", "request_steps", "tokens")),
        "findings": (_findings, ("code", "severity", "model_role")),
    }


# -- a histogram fed with counts ------------------------------------------------

_bulk_supported = True  # False once the installed SDK's internals were found to differ


def record_many(histogram: Any, value: float, count: int, attributes: dict[str, str]) -> None:
    """``histogram.record(value, attributes)`` ``count`` times, in one update per stream.

    The metrics API has no weighted record, and the flush aggregates request-steps into
    counts per acceptance length; recording them one by one took most of the flush
    thread's time at batch 64 (bench/ab_windows.py, BENCHMARKS.md). So: one real
    ``record`` (validation, exemplars, the stream created in every reader), then the
    other ``count - 1`` added to each reader's bucket aggregation of those attributes,
    under the same locks, in the same order, as the SDK's own ``record`` and ``collect``
    take them. On an SDK whose internals differ (checked before anything is changed) it
    falls back to calling ``record`` ``count`` times; tests/test_metrics.py compares the
    two on the installed SDK.
    """
    global _bulk_supported
    if count <= 0:
        return
    histogram.record(value, attributes)
    if count == 1:
        return
    streams = _histogram_streams(histogram) if _bulk_supported else None
    if streams is None:
        if _bulk_supported:
            _bulk_supported = False
            log.info("spectrace: this opentelemetry-sdk has no known histogram layout; acceptance lengths are recorded one by one")
        for _ in range(count - 1):
            histogram.record(value, attributes)
        return
    from opentelemetry.sdk.metrics._internal._view_instrument_match import _hash_attributes

    extra = count - 1
    for match in streams:
        keys = match._view._attribute_keys
        attrs = dict(attributes) if keys is None else {k: v for k, v in attributes.items() if k in keys}
        with match._lock:  # as consume_measurement with reset_on_collect: a delta collect cannot drop it
            aggregation = match._get_or_create_aggregation(_hash_attributes(attrs), attrs)
            with aggregation._lock:
                if aggregation._value is None:
                    aggregation._value = aggregation._get_empty_bucket_counts()
                aggregation._sum += value * extra
                if aggregation._record_min_max:
                    aggregation._min = min(aggregation._min, value)
                    aggregation._max = max(aggregation._max, value)
                aggregation._value[bisect_left(aggregation._boundaries, value)] += extra


def _histogram_streams(histogram: Any) -> list | None:
    """The SDK's per-reader streams of ``histogram`` with every part ``record_many`` uses, or None."""
    try:
        from opentelemetry.sdk.metrics._internal.aggregation import _ExplicitBucketHistogramAggregation

        streams = []
        for storage in histogram._measurement_consumer._reader_storages.values():
            for match in storage._instrument_view_instrument_matches[histogram]:
                if not (
                    hasattr(match, "_lock") and hasattr(match, "_get_or_create_aggregation")
                    and hasattr(match._view, "_attribute_keys")
                    # the aggregation a new stream gets (a View may choose another kind)
                    and isinstance(match._aggregation, _ExplicitBucketHistogramAggregation)
                ):
                    return None
                for aggregation in match._attributes_aggregation.values():
                    if not isinstance(aggregation, _ExplicitBucketHistogramAggregation) or not all(
                        hasattr(aggregation, name)
                        for name in ("_lock", "_value", "_sum", "_min", "_max", "_record_min_max", "_boundaries",
                                     "_get_empty_bucket_counts")
                    ):
                        return None
                streams.append(match)
        return streams
    except (AttributeError, ImportError, KeyError, TypeError):
        return None
