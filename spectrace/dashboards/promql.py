"""The Prometheus series spectrace exports, and the PromQL built on them.

The metric names below are the exporter's contract (``spectrace.sinks.metrics``);
the dashboards (``build.py``) and the alert rules (``alerts.py``) both build
their expressions here, so an acceptance rate means the same thing in a panel
and in an alert: accepted / drafted tokens at the same position, summed over
context buckets before dividing.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from spectrace.audit import codes
from spectrace.audit import layout as audit_layout

DRAFTED = "spectrace_verify_drafted_tokens_total"
ACCEPTED = "spectrace_verify_accepted_tokens_total"
VERIFY_STEPS = "spectrace_verify_steps_total"
ACCEPTANCE_LENGTH = "spectrace_verify_acceptance_length"  # histogram: _bucket, _sum, _count
WORKER_DRAFTED = "spectrace_worker_verified_drafted_tokens_total"
WORKER_ACCEPTED = "spectrace_worker_verified_accepted_tokens_total"
SLICE_DRAFTED = "spectrace_slice_drafted_tokens_total"  # dimension, value: the request slices (spectrace.audit.rules.slices)
SLICE_ACCEPTED = "spectrace_slice_accepted_tokens_total"
DRAFTS_PROPOSED = "spectrace_drafts_proposed_total"
DRAFTS_VERIFIED = "spectrace_drafts_verified_total"
SHAPE_STEPS = "spectrace_step_shapes_steps_total"  # batch_band, k: steps that verified drafts (engine core)
SHAPE_K_SWITCHES = "spectrace_step_shapes_k_switches_total"  # of those, steps right after a step at another k
CONFIG_FINDING = "spectrace_config_finding"  # findings about the configs and checkpoints
RUNTIME_FINDING = "spectrace_runtime_finding"  # findings about what the run measured (metrics.RUNTIME_CODES)
ATTENTION_LAYER = "spectrace_attention_layer"
HIDDEN_STATES_TAP = "spectrace_hidden_states_tap"
RUN_INFO = "spectrace_run_info"
EXPORT_DROPPED = "spectrace_export_dropped_total"
INTERNAL_ERRORS = "spectrace_internal_errors_total"

# One serving deployment: the same target, drafter and method behind one scrape job.
DEPLOYMENT = ("job", "model", "draft_model", "method")
# One serving process of a deployment.
INSTANCE = ("job", "instance", "model", "draft_model", "method")

# Recording rules (the rule file's "spectrace-recording" group; the window is the
# profile's rate_window: 5m in production). Per serving instance, pid and the
# OpenTelemetry scope labels summed away, so a fleet's panels read a few series per
# position instead of one per process and context bucket:
RECORDED_DRAFTED = "spectrace:verify_drafted_tokens:rate"
RECORDED_ACCEPTED = "spectrace:verify_accepted_tokens:rate"
RECORDED_LABELS = ("job", "instance", "model", "draft_model", "method", "model_name", "engine", "run_id", "position", "context_bucket")
# ... and over replicas (every instance of a deployment):
FLEET_BY_POSITION = "spectrace:verify_acceptance_by_position:ratio"
FLEET_BY_CONTEXT = "spectrace:verify_acceptance_by_context:ratio"

CONTEXT_BUCKETS = ("0-512", "512-1k", "1k-2k", "2k-4k", "4k-8k", "8k-16k", "16k+")

# the tap findings that mean the drafter reads the wrong hidden states (errors; TAP_DEFAULTED is a warning)
TAP_CODES = codes.codes(component="taps", severity="error")
# acceptance that moved in time, against the run's own level (spectrace.audit.rules.drift); ACCEPTANCE_RESTORED clears
# them on the gauge (the active rule), so a series present is a change not restored
TIME_CODES = (codes.ACCEPTANCE_STEP_CHANGE, codes.ACCEPTANCE_DECAY)
# the findings about requests and the scheduler: a slice the drafter cannot see, the token budget
REQUEST_CODES = (codes.SLICE_ACCEPTANCE_LOW, codes.THINKING_MODE_GAP, *codes.codes(component="scheduler"))


def findings(matchers: Iterable[str] = ()) -> str:
    """Every finding present, configuration and runtime: both gauges' series (the same labels)."""
    matchers = list(matchers)
    return f"({series(CONFIG_FINDING, matchers)} or {series(RUNTIME_FINDING, matchers)})"


def series(metric: str, matchers: Iterable[str] = ()) -> str:
    """``metric{m1, m2}`` (just ``metric`` without matchers)."""
    inner = ", ".join(matchers)
    return f"{metric}{{{inner}}}" if inner else metric


def by(labels: Sequence[str]) -> str:
    return f"by ({', '.join(labels)})" if labels else ""


def summed(fn: str, metric: str, window: str, labels: Sequence[str], matchers: Iterable[str] = ()) -> str:
    """``sum by (labels) (fn(metric{matchers}[window]))``."""
    grouping = f" {by(labels)} " if labels else ""
    return f"sum{grouping}({fn}({series(metric, matchers)}[{window}]))"


def ratio(
    numerator: str,
    denominator: str,
    window: str,
    labels: Sequence[str] = (),
    matchers: Iterable[str] = (),
    fn: str = "rate",
) -> str:
    """Rate of one counter over the rate of another, both summed by ``labels``."""
    matchers = list(matchers)
    return (
        f"{summed(fn, numerator, window, labels, matchers)}\n"
        f"  / {summed(fn, denominator, window, labels, matchers)}"
    )


def acceptance(window: str, labels: Sequence[str] = (), matchers: Iterable[str] = (), fn: str = "rate") -> str:
    """Acceptance rate: accepted / drafted tokens (engine-core counts)."""
    return ratio(ACCEPTED, DRAFTED, window, labels, matchers, fn)


def slice_acceptance(window: str, labels: Sequence[str] = ("dimension", "value"), matchers: Iterable[str] = (),
                     fn: str = "rate") -> str:
    """Acceptance per request slice (a penalty, temperature band, prefix-cache hit, ...)."""
    return ratio(SLICE_ACCEPTED, SLICE_DRAFTED, window, labels, matchers, fn)


def unverified_share(window: str, labels: Sequence[str] = (), matchers: Iterable[str] = (), fn: str = "rate") -> str:
    """Share of proposed draft tokens that no step verified (trimmed by the token budget, or finished requests')."""
    return f"1 - {paren(ratio(DRAFTS_VERIFIED, DRAFTS_PROPOSED, window, labels, matchers, fn))}"


def k_switch_share(window: str, labels: Sequence[str] = (), matchers: Iterable[str] = (), fn: str = "rate") -> str:
    """Share of the verified steps whose previous verified step drafted another k (dynamic speculation thrashing)."""
    return ratio(SHAPE_K_SWITCHES, SHAPE_STEPS, window, labels, matchers, fn)


def steps_by_k(window: str, matchers: Iterable[str] = ()) -> str:
    """Verified steps per second by the k they drafted."""
    return summed("rate", SHAPE_STEPS, window, ["k"], matchers)


def worker_acceptance(window: str, labels: Sequence[str] = (), matchers: Iterable[str] = ()) -> str:
    """Acceptance as each worker rank verified it."""
    return ratio(WORKER_ACCEPTED, WORKER_DRAFTED, window, labels, matchers)


def mean_acceptance_length(window: str, labels: Sequence[str] = (), matchers: Iterable[str] = (), fn: str = "rate") -> str:
    """Mean tokens emitted per request-step with drafts (accepted + 1)."""
    return ratio(f"{ACCEPTANCE_LENGTH}_sum", f"{ACCEPTANCE_LENGTH}_count", window, labels, matchers, fn)


SPEEDUP_ESTIMATE = "spectrace_speculation_speedup_estimate"  # gauge, per rank (docs/speedup.md, "Does speculation pay?")
SPEEDUP_BY_K = "spectrace_speculation_speedup_by_k"  # gauge, per rank and k' (docs/speedup.md, "What k pays")


def paren(expr: str) -> str:
    """``expr`` in parentheses, indented on its own lines."""
    body = "\n".join("  " + line if line else line for line in expr.splitlines())
    return f"(\n{body}\n)"


def lower_of(a: str, b: str) -> str:
    """Element-wise minimum of two vectors with the same label sets.

    ``a < b`` keeps a's series where a is lower; ``or b`` fills in b for the
    other label sets (and where a is NaN, e.g. nothing drafted at position 0).
    """
    return f"{paren(a)}\n< {paren(b)}\nor {paren(b)}"


def attention_layout(matchers: Iterable[str] = ()) -> str:
    """Attention layers; their ``status`` label is the audit's verdict on the layer.

    ``MISMATCH``: a ``LAYOUT_MISMATCH`` error names the layer; ``explained``: a
    ``LAYOUT_MISMATCH`` caused by another finding (info); ``match``; ``undeclared``
    (``spectrace.audit.layout_status``). The exporter writes it, so the panel and the
    findings apply one rule (the declared, resolved and runtime type and window).
    """
    return series(ATTENTION_LAYER, matchers)


def layout_mismatches(matchers: Iterable[str] = ()) -> str:
    """Attention layers a ``LAYOUT_MISMATCH`` error names."""
    return series(ATTENTION_LAYER, [*matchers, f'status="{audit_layout.MISMATCH}"'])


def recorded_acceptance(labels: Sequence[str] = (), matchers: Iterable[str] = ()) -> str:
    """Acceptance from the recorded per-instance rates: accepted / drafted, summed by ``labels``."""
    matchers = list(matchers)
    grouping = f" {by(labels)} " if labels else ""
    return (
        f"sum{grouping}({series(RECORDED_ACCEPTED, matchers)})\n"
        f"  / sum{grouping}({series(RECORDED_DRAFTED, matchers)})"
    )


def recording_rules(rate_window: str) -> list[dict[str, str]]:
    """The recording rules: per-instance rates, then acceptance over replicas per position and per context bucket."""
    keep = ", ".join(RECORDED_LABELS)
    rules = [
        {"record": RECORDED_DRAFTED, "expr": f"sum by ({keep}) (rate({DRAFTED}[{rate_window}]))"},
        {"record": RECORDED_ACCEPTED, "expr": f"sum by ({keep}) (rate({ACCEPTED}[{rate_window}]))"},
    ]
    for name, label in ((FLEET_BY_POSITION, "position"), (FLEET_BY_CONTEXT, "context_bucket")):
        rules.append({"record": name, "expr": recorded_acceptance([*DEPLOYMENT_LABELS, label])})
    return rules


# A deployment across replicas, as vLLM's own series name it too (model_name).
DEPLOYMENT_LABELS = ("job", "model", "draft_model", "method", "model_name")
