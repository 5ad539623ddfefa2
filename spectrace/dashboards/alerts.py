"""Alert rules for speculative decoding, written once and emitted twice.

``RULES`` defines each check once: a PromQL *value* (one series per alert
instance, the measured quantity), a comparison with a threshold, a ``for:``
duration, a severity and the text an on-call engineer reads. The windows,
durations and thresholds come from a ``Profile`` (production defaults, or a
short test profile). From that one definition:

- ``prometheus_rules(profile)``: a Prometheus rule file (``alert`` / ``expr`` / ``for``);
- ``grafana_rule_group(profile, datasource_uid)``: the Grafana-managed rule group
  as the provisioning HTTP API takes it (built with grafana-foundation-sdk);
- ``grafana_provisioning(profile, datasource_uid)``: the same group as a Grafana
  file-provisioning document (``provisioning/alerting/*.yaml``);
- ``alertmanager_example()``: an Alertmanager route for the Prometheus rules.

The same checks exist as named SQL for DuckDB users
(``spectrace query --named acceptance_collapse`` and friends).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from spectrace.audit import codes
from spectrace.dashboards import promql

GROUP = "spectrace"
FOLDER_TITLE = "Spectrace"
FOLDER_UID = "spectrace"
# The example data source that ``spectrace dashboards export`` provisions.
EXAMPLE_DATASOURCE_UID = "spectrace-prometheus"


@dataclass(frozen=True)
class Profile:
    """Windows, ``for:`` durations and thresholds of the rules.

    ``rate_window``: the window of "current" acceptance; ``baseline_window``: the
    deployment's own history that ``SpectraceAcceptanceDrop`` compares with;
    ``min_drafted_tokens``: drafted tokens within ``rate_window`` below which
    acceptance is not judged (too little traffic to tell).
    """

    name: str
    evaluation_interval: str
    rate_window: str
    baseline_window: str
    collapse_for: str
    drop_for: str
    finding_for: str
    collapse_threshold: float = 0.1
    drop_ratio: float = 0.5
    min_drafted_tokens: int = 200

    def replace(self, **changes: Any) -> "Profile":
        return dataclasses.replace(self, **changes)


PRODUCTION = Profile(
    name="production",
    evaluation_interval="1m",
    rate_window="5m",
    baseline_window="24h",
    collapse_for="5m",
    drop_for="15m",
    finding_for="1m",
)

# Seconds instead of minutes: for promtool unit tests and live tests against a
# short CPU run (a handful of requests drafts far fewer than 200 tokens in 15 s).
TEST = Profile(
    name="test",
    evaluation_interval="5s",
    rate_window="15s",
    baseline_window="2m",
    collapse_for="10s",
    drop_for="10s",
    finding_for="0s",
    min_drafted_tokens=20,
)

PROFILES = {p.name: p for p in (PRODUCTION, TEST)}


def profile(value: "str | Profile") -> Profile:
    if isinstance(value, Profile):
        return value
    try:
        return PROFILES[value]
    except KeyError:
        raise ValueError(f"unknown profile {value!r}; known: {', '.join(PROFILES)}") from None


def seconds(duration: str) -> int:
    """Seconds in a Prometheus duration such as ``1m``, ``90s`` or ``1h30m``."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a duration: {duration!r}")
    return int(sum(int(n) * units[u] for n, u in parts))


# --------------------------------------------------------------------------- values


# The acceptance alerts read the recording rules' per-instance rates (``promql.RECORDED_*``, over the
# profile's rate_window), as the acceptance panels do: the rule file's recording group must be loaded
# wherever these expressions are evaluated (Prometheus, or the Prometheus behind Grafana-managed rules).


def _volume_guard(p: Profile) -> str:
    """Instances that drafted enough tokens in the window to judge their acceptance (rate x window = increase)."""
    drafted = f"sum {promql.by(promql.INSTANCE)} ({promql.RECORDED_DRAFTED}) * {seconds(p.rate_window)}"
    return f"{drafted} >= {p.min_drafted_tokens}"


def _not_synthetic() -> str:
    """Instances whose acceptance is the drafter's: not those verifying with vLLM's synthetic rejection sampler
    (``SYNTHETIC_ACCEPTANCE``, a config finding named before the first request), whose acceptance is drawn."""
    on = ", ".join(promql.INSTANCE)
    synthetic = promql.series(promql.CONFIG_FINDING, ['code="' + codes.SYNTHETIC_ACCEPTANCE + '"'])
    return f"unless on ({on})\n{synthetic}"


def _collapse_value(p: Profile) -> str:
    position_0 = promql.recorded_acceptance(promql.INSTANCE, ['position="0"'])
    overall = promql.recorded_acceptance(promql.INSTANCE)
    return f"{promql.paren(promql.lower_of(position_0, overall))}\nand\n{_volume_guard(p)}\n{_not_synthetic()}"


def _baseline(p: Profile) -> str:
    """The deployment's acceptance over the baseline window, from the recorded rates.

    Each recorded sample is a rate over rate_window, so every drafted token is counted in as many
    samples as windows overlap it, the same number for accepted and drafted: summed over the baseline
    window, their ratio is the acceptance over that window (up to its edges).
    """
    grouping = promql.by(promql.DEPLOYMENT)
    accepted = f"sum {grouping} (sum_over_time({promql.RECORDED_ACCEPTED}[{p.baseline_window}]))"
    drafted = f"sum {grouping} (sum_over_time({promql.RECORDED_DRAFTED}[{p.baseline_window}]))"
    return f"{accepted}\n  / {drafted}"


def _drop_value(p: Profile) -> str:
    current = promql.recorded_acceptance(promql.INSTANCE)
    baseline = _baseline(p)
    on = ", ".join(promql.DEPLOYMENT)
    return (f"{promql.paren(current)}\n/ on ({on}) group_left ()\n{promql.paren(baseline)}\nand\n{_volume_guard(p)}"
            f"\n{_not_synthetic()}")


# The finding's own severity label is left out: the alert's severity label (routing) replaces it.
_FINDING_LABELS = (*promql.INSTANCE, "run_id", "model_role", "code")


def _findings(*matchers: str) -> str:
    return f"max {promql.by(_FINDING_LABELS)} {promql.findings(list(matchers))}"


def _config_error_value(p: Profile) -> str:
    # what a synthetic-acceptance run measured (ACCEPTANCE_COLLAPSE of a drawn rate, ...) is no health signal; its
    # config findings are
    matcher = ['severity="error"']
    config = promql.series(promql.CONFIG_FINDING, matcher)
    runtime = f"({promql.series(promql.RUNTIME_FINDING, matcher)} {_not_synthetic()})"
    return f"max {promql.by(_FINDING_LABELS)} ({config} or {runtime})"


def _tap_mismatch_value(p: Profile) -> str:
    # at severity error: a tap code said as info (caused by another, or a convention that cannot be told) is no alert
    return _findings('code=~"' + "|".join(promql.TAP_CODES) + '"', 'severity="error"')


def _time_signature_value(p: Profile) -> str:
    # drawn acceptance (a synthetic sampler) moves when its knob does: no health signal either
    runtime = promql.series(promql.RUNTIME_FINDING, ['code=~"' + "|".join(promql.TIME_CODES) + '"'])
    return f"max {promql.by(_FINDING_LABELS)} ({runtime} {_not_synthetic()})"


def _request_finding_value(p: Profile) -> str:
    return _findings('code=~"' + "|".join(promql.REQUEST_CODES) + '"')


@dataclass(frozen=True)
class AlertRule:
    """One check. ``threshold`` and ``for_`` name ``Profile`` fields (or give a number)."""

    name: str
    uid: str
    severity: str
    value: Callable[[Profile], str]
    op: str  # "<" or ">"
    threshold: "str | float"
    for_: str
    summary: str
    description: str
    named_query: str

    def threshold_value(self, p: Profile) -> float:
        return getattr(p, self.threshold) if isinstance(self.threshold, str) else float(self.threshold)

    def for_duration(self, p: Profile) -> str:
        return getattr(p, self.for_)

    def expr(self, p: Profile) -> str:
        """The Prometheus alert expression: the value, kept where it breaches the threshold."""
        return f"{promql.paren(self.value(p))} {self.op} {_number(self.threshold_value(p))}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


_DEPLOYMENT_TEXT = "{{ $labels.draft_model }} drafting for {{ $labels.model }} ({{ $labels.method }}) on {{ $labels.instance }}"

RULES: tuple[AlertRule, ...] = (
    AlertRule(
        name="SpectraceAcceptanceCollapse",
        uid="spectrace-acceptance-collapse",
        severity="critical",
        value=_collapse_value,
        op="<",
        threshold="collapse_threshold",
        for_="collapse_for",
        summary="Speculative decoding acceptance collapsed to {{ $value | humanizePercentage }} on {{ $labels.instance }}",
        description=(
            "Position-0 or overall draft acceptance of " + _DEPLOYMENT_TEXT + " is "
            "{{ $value | humanizePercentage }}: nearly every drafted token is rejected, so speculative "
            "decoding only adds latency. Likely cause: the drafter does not fit the target (wrong checkpoint, "
            "vocabulary or tokenizer), reads hidden states from the wrong layers, or lost its attention layout "
            "at load (sliding window dropped). Run: spectrace query --named acceptance_collapse, then "
            "spectrace query --named config_errors."
        ),
        named_query="acceptance_collapse",
    ),
    AlertRule(
        name="SpectraceAcceptanceDrop",
        uid="spectrace-acceptance-drop",
        severity="warning",
        value=_drop_value,
        op="<",
        threshold="drop_ratio",
        for_="drop_for",
        summary="Draft acceptance on {{ $labels.instance }} fell to {{ $value | humanizePercentage }} of its baseline",
        description=(
            "Draft acceptance of " + _DEPLOYMENT_TEXT + " is {{ $value | humanizePercentage }} of the "
            "deployment's own acceptance over the baseline window. Likely cause: a changed drafter or target "
            "revision or config, or traffic moving to long contexts where a drafter that lost its sliding window "
            "stops agreeing (see acceptance by context bucket). Run: spectrace query --named acceptance_drop, "
            "then spectrace query --named acceptance_by_position."
        ),
        named_query="acceptance_drop",
    ),
    AlertRule(
        name="SpectraceConfigError",
        uid="spectrace-config-error",
        severity="warning",
        value=_config_error_value,
        op=">",
        threshold=0,
        for_="finding_for",
        summary="Speculative decoding misconfigured: {{ $labels.code }} ({{ $labels.model_role }}) on {{ $labels.instance }}",
        description=(
            "spectrace found {{ $labels.code }} (severity error) for the {{ $labels.model_role }} model of "
            + _DEPLOYMENT_TEXT + ", run {{ $labels.run_id }}. Likely cause: vLLM resolved the model config "
            "differently from what the checkpoint declares (a field dropped or defaulted, a different attention layout, method or "
            "vocabulary, a RoPE or dtype the drafter was not trained in) or left drafter parameters unloaded, so the "
            "drafter runs with settings or weights it was not trained with, usually without an error in "
            "vLLM's logs. Run: spectrace query --named config_errors (message, evidence and fix per finding)."
        ),
        named_query="config_errors",
    ),
    AlertRule(
        name="SpectraceTapMismatch",
        uid="spectrace-tap-mismatch",
        severity="warning",
        value=_tap_mismatch_value,
        op=">",
        threshold=0,
        for_="finding_for",
        summary="Drafter reads the wrong hidden states: {{ $labels.code }} on {{ $labels.instance }}",
        description=(
            "The hidden states tapped from the target for " + _DEPLOYMENT_TEXT + " (run {{ $labels.run_id }}) "
            "are not the layers the drafter declares ({{ $labels.code }}). Likely cause: the drafter's "
            "auxiliary-layer ids were defaulted or misread by vLLM, or the drafter was trained against another "
            "target depth; acceptance drops without an error. Run: spectrace query --named tap_mismatch."
        ),
        named_query="tap_mismatch",
    ),
    AlertRule(
        name="SpectraceAcceptanceShifted",
        uid="spectrace-acceptance-shifted",
        severity="warning",
        value=_time_signature_value,
        op=">",
        threshold=0,
        for_="finding_for",
        summary="Draft acceptance on {{ $labels.instance }} changed in time: {{ $labels.code }}",
        description=(
            "spectrace found {{ $labels.code }} for " + _DEPLOYMENT_TEXT + " (run {{ $labels.run_id }}): acceptance "
            "stepped down at a moment (ACCEPTANCE_STEP_CHANGE) or has been declining steadily "
            "(ACCEPTANCE_DECAY), against the run's own level for the same contexts and draft positions, and has not "
            "come back (ACCEPTANCE_RESTORED clears it). Likely cause: something changed at that moment (a weight "
            "reload or update, a LoRA swap, a drafter or target redeployed, a cache reset), or state that builds up "
            "while the server runs; the finding's evidence has when it began and whether the requests in flight "
            "across it accepted less too. Run: spectrace query --named acceptance_in_time, then spectrace report."
        ),
        named_query="acceptance_in_time",
    ),
    AlertRule(
        name="SpectraceRequestsCostAcceptance",
        uid="spectrace-requests-cost-acceptance",
        severity="warning",
        value=_request_finding_value,
        op=">",
        threshold=0,
        for_="finding_for",
        summary="Requests or the scheduler cost speculation: {{ $labels.code }} on {{ $labels.instance }}",
        description=(
            "spectrace found {{ $labels.code }} for " + _DEPLOYMENT_TEXT + " (run {{ $labels.run_id }}). Likely cause: "
            "requests whose penalties, logit bias, grammar or LoRA adapter the drafter cannot see accept far below the "
            "rest (SLICE_ACCEPTANCE_LOW), requests served in the thinking mode the drafter was not trained in "
            "(THINKING_MODE_GAP), or max_num_batched_tokens too small for max_num_seqs x (1 + k) trims drafts "
            "(TOKEN_BUDGET_SHORT, DRAFTS_UNVERIFIED), or a dynamic-speculation schedule whose k flips from step to step "
            "(DYNAMIC_K_THRASHING). Run: spectrace query --named slice_acceptance_low, then "
            "spectrace report (acceptance by request slice, drafts proposed vs verified, the k each batch size drafted)."
        ),
        named_query="slice_acceptance_low",
    ),
)


def rule(name: str) -> AlertRule:
    for r in RULES:
        if r.name == name:
            return r
    raise KeyError(name)


# --------------------------------------------------------------------------- Prometheus


def prometheus_rules(p: "str | Profile" = PRODUCTION) -> dict[str, Any]:
    """The Prometheus rule file (``rule_files:``) as a dict."""
    p = profile(p)
    rules = []
    for r in RULES:
        rules.append(
            {
                "alert": r.name,
                "expr": r.expr(p),
                "for": r.for_duration(p),
                "labels": {"severity": r.severity},
                "annotations": {"summary": r.summary, "description": r.description},
            }
        )
    recording = {"name": f"{GROUP}-recording", "interval": p.evaluation_interval, "rules": promql.recording_rules(p.rate_window)}
    return {"groups": [{"name": GROUP, "interval": p.evaluation_interval, "rules": rules}, recording]}


# --------------------------------------------------------------------------- Grafana

_VALUE_REF = "B"  # the reduce node whose value the annotations print


def _grafana_text(text: str) -> str:
    """Prometheus annotation template -> Grafana's: ``$value`` is the reduce node's value there."""
    return re.sub(r"\$value\b", f"$values.{_VALUE_REF}.Value", text)


_GRAFANA_OPS = {"<": "lt", ">": "gt"}
_GRAFANA_TICK = 10  # Grafana's scheduler: group intervals are non-zero multiples of 10 s


def grafana_interval(p: Profile) -> int:
    """The profile's evaluation interval in seconds, rounded up to what Grafana's scheduler accepts."""
    return max(_GRAFANA_TICK, -(-seconds(p.evaluation_interval) // _GRAFANA_TICK) * _GRAFANA_TICK)


def grafana_rule_group(
    p: "str | Profile" = PRODUCTION,
    datasource_uid: str = EXAMPLE_DATASOURCE_UID,
    folder_uid: str = FOLDER_UID,
) -> dict[str, Any]:
    """The Grafana-managed rule group, in the provisioning HTTP API's shape.

    Each rule: A = the PromQL value (instant), B = last value of A,
    C = threshold on B (the condition). Healthy or idle deployments return no
    series, which counts as OK (``noDataState: OK``).
    """
    try:
        from grafana_foundation_sdk.builders import alerting, expr, prometheus
        from grafana_foundation_sdk.models import alerting as alerting_model
        from grafana_foundation_sdk.models import dashboard as dashboard_model
    except ImportError:
        raise ImportError("Grafana alert rules need grafana-foundation-sdk: pip install 'spectrace[dashboards]'") from None

    p = profile(p)
    window = max(seconds(p.baseline_window), seconds(p.rate_window), 600)
    expressions = dashboard_model.DataSourceRef(type_val="__expr__", uid="__expr__")
    group = alerting.RuleGroup(GROUP).folder_uid(folder_uid).interval(grafana_interval(p))
    for r in RULES:
        query = (
            prometheus.Dataquery()
            .ref_id("A")
            .expr(r.value(p))
            .instant()
            .datasource(dashboard_model.DataSourceRef(type_val="prometheus", uid=datasource_uid))
        )
        reduce = (
            expr.TypeReduce()
            .ref_id(_VALUE_REF)
            .expression("A")
            .reducer("last")
            .settings(expr.ExprTypeReduceSettings().mode("dropNN"))
            .datasource(expressions)
        )
        condition = (
            expr.TypeThreshold()
            .ref_id("C")
            .expression(_VALUE_REF)
            .conditions(
                [
                    expr.ExprTypeThresholdConditions().evaluator(
                        expr.ExprTypeThresholdConditionsEvaluator()
                        .type(_GRAFANA_OPS[r.op])
                        .params([r.threshold_value(p)])
                    )
                ]
            )
            .datasource(expressions)
        )
        group.with_rule(
            alerting.Rule(r.name)
            .uid(r.uid)
            .rule_group(GROUP)
            .folder_uid(folder_uid)
            .org_id(1)
            .condition("C")
            .for_val(r.for_duration(p))
            .no_data_state("OK")
            .exec_err_state("Error")
            .labels({"severity": r.severity})
            .annotations({"summary": _grafana_text(r.summary), "description": _grafana_text(r.description)})
            .is_paused(False)
            .with_query(
                alerting.Query("A")
                .datasource_uid(datasource_uid)
                .relative_time_range(alerting_model.RelativeTimeRange(from_val=window, to=0))
                .model(query)
            )
            .with_query(alerting.Query(_VALUE_REF).datasource_uid("__expr__").model(reduce))
            .with_query(alerting.Query("C").datasource_uid("__expr__").model(condition))
        )
    return _plain(group.build())


def grafana_provisioning(
    p: "str | Profile" = PRODUCTION,
    datasource_uid: str = EXAMPLE_DATASOURCE_UID,
    folder: str = FOLDER_TITLE,
) -> dict[str, Any]:
    """The rule group as a Grafana alerting file-provisioning document."""
    p = profile(p)
    api = grafana_rule_group(p, datasource_uid)
    rules = []
    for r in api["rules"]:
        rules.append(
            {
                "uid": r["uid"],
                "title": r["title"],
                "condition": r["condition"],
                "data": r["data"],
                "noDataState": r["noDataState"],
                "execErrState": r["execErrState"],
                "for": r["for"],
                "annotations": r["annotations"],
                "labels": r["labels"],
                "isPaused": r.get("isPaused", False),
            }
        )
    interval = grafana_interval(p)
    every = p.evaluation_interval if seconds(p.evaluation_interval) == interval else f"{interval}s"
    group = {"orgId": 1, "name": GROUP, "folder": folder, "interval": every, "rules": rules}
    return {"apiVersion": 1, "groups": [group]}


def _plain(built: Any) -> Any:
    """SDK objects -> plain JSON values."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    return json.loads(json.dumps(built, cls=JSONEncoder))


# --------------------------------------------------------------------------- Alertmanager


def alertmanager_example() -> dict[str, Any]:
    """An Alertmanager config routing the Prometheus rules: critical pages, the rest opens tickets.

    The receivers are webhooks on localhost; replace them with PagerDuty, Slack, ...
    """
    spectrace = 'alertname=~"Spectrace.*"'
    return {
        "route": {
            "receiver": "default",
            "group_by": ["alertname", "job", "model", "draft_model"],
            "routes": [
                {
                    "matchers": [spectrace, 'severity="critical"'],
                    "receiver": "spectrace-page",
                    "group_wait": "30s",
                    "group_interval": "5m",
                    "repeat_interval": "4h",
                },
                {
                    "matchers": [spectrace],
                    "receiver": "spectrace-ticket",
                    "group_wait": "1m",
                    "group_interval": "15m",
                    "repeat_interval": "24h",
                },
            ],
        },
        "inhibit_rules": [
            {
                # a collapse is also a drop: page once
                "source_matchers": ['alertname="SpectraceAcceptanceCollapse"'],
                "target_matchers": ['alertname="SpectraceAcceptanceDrop"'],
                "equal": list(promql.INSTANCE),
            },
            {
                # a tap finding of severity error is also a config error: report the specific one
                "source_matchers": ['alertname="SpectraceTapMismatch"'],
                "target_matchers": ['alertname="SpectraceConfigError"', 'code=~"TAP_.*"'],
                "equal": ["instance", "run_id", "code"],
            },
        ],
        "receivers": [
            {"name": "default"},
            {"name": "spectrace-page", "webhook_configs": [{"url": "http://127.0.0.1:5001/spectrace/page"}]},
            {"name": "spectrace-ticket", "webhook_configs": [{"url": "http://127.0.0.1:5001/spectrace/ticket"}]},
        ],
    }
