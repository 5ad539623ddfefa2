"""The two Grafana dashboards, built with grafana-foundation-sdk (Grafana 11.6 build).

    python -m spectrace.dashboards.build          # rewrite the committed JSON and rule files
    python -m spectrace.dashboards.build --check  # exit 1 when they differ from the code

Every panel reads Prometheus through the ``${datasource}`` variable and is
filtered by the ``model``, ``draft_model``, ``instance`` and ``run`` variables.
``panel_queries()`` lists every PromQL expression with Grafana's macros and
variables substituted, for promtool checks and live tests.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Iterator

from spectrace.audit import codes
from spectrace.audit import layout as audit_layout
from spectrace.dashboards import alerts, promql
from spectrace.dashboards.kit import ALERT_MATCHERS, COLLAPSE_THRESHOLD, MATCHERS, PROCESS_MATCHERS, Kit

GENERATED = Path(__file__).with_name("generated")

ACCEPTANCE_UID = "spectrace-acceptance"
CONFIGURATION_UID = "spectrace-configuration"
ACCEPTANCE_FILE = "speculative-decoding-acceptance.json"
CONFIGURATION_FILE = "speculative-decoding-configuration.json"
TAGS = ["spectrace", "vllm", "speculative-decoding"]

SEVERITY_COLORS = {"error": ("error", "red"), "warning": ("warning", "orange"), "info": ("info", "blue")}


def _eq(label: str, value: str) -> str:
    return f'{label}="{value}"'


_TAP_MATCHER = 'code=~"' + "|".join(promql.TAP_CODES) + '"'


def _alerts(alertname: str, state: str) -> str:
    """The ALERTS series of one spectrace rule in one state, filtered by the dashboard variables."""
    return promql.series("ALERTS", [_eq("alertname", alertname), _eq("alertstate", state), *ALERT_MATCHERS])


def _firing(alertname: str) -> str:
    """2 while the alert fires, 1 while pending, per alert and instance."""
    return f"max by (alertname, instance) ({_alerts(alertname, 'firing')} * 2 or {_alerts(alertname, 'pending')})"


def acceptance_dashboard() -> Any:
    """"Speculative decoding — acceptance": is the drafter earning its keep, per position, context and rank."""
    k = Kit()
    db, dm, cm = k.dashboard, k.dm, k.cm
    W = "$__rate_interval"
    collapse = alerts.rule("SpectraceAcceptanceCollapse")

    d = (
        db.Dashboard("Speculative decoding — acceptance")
        .uid(ACCEPTANCE_UID)
        .description(
            "Draft acceptance from spectrace's engine-core counts (accepted / drafted tokens at the same "
            "position). Red bands mark acceptance below the collapse threshold "
            f"({COLLAPSE_THRESHOLD:.0%})."
        )
        .tags(TAGS).time("now-3h", "now").refresh("30s").timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .variables(k.variables())
        .annotation(
            db.AnnotationQuery().name("Acceptance collapse").datasource(k.ds).enable(True).icon_color("red")
            .expr(_alerts(collapse.name, "firing"))
        )
        .link(db.DashboardLink("Configuration").type(dm.DashboardLinkType.DASHBOARDS).tags(["spectrace"])
              .include_vars(True).keep_time(True).as_dropdown(False))
    )

    # -- overview
    d = d.with_row(k.row("Overview"))
    d = d.with_panel(
        k.stat_panel("Acceptance rate", "Accepted / drafted tokens over the selected time range, all positions.", "percentunit")
        .thresholds(k.acceptance_steps()).decimals(1)
        .with_target(k.query(promql.acceptance("$__range", matchers=MATCHERS, fn="increase"), instant=True))
    )
    d = d.with_panel(
        k.stat_panel("Position-0 acceptance", "Acceptance of the first drafted token over the selected time range: "
               "near zero means the drafter does not fit the target.", "percentunit")
        .thresholds(k.acceptance_steps()).decimals(1)
        .with_target(k.query(promql.acceptance("$__range", matchers=[*MATCHERS, 'position="0"'], fn="increase"), instant=True))
    )
    d = d.with_panel(
        k.stat_panel("Mean acceptance length", "Tokens emitted per request-step with drafts (accepted + 1) over the "
               "selected time range; 1 means no draft token was ever accepted.", "suffix: tok/step")
        .thresholds(k.steps((None, "red"), (1.2, "orange"), (1.5, "green"))).decimals(2)
        .with_target(k.query(promql.mean_acceptance_length("$__range", matchers=MATCHERS, fn="increase"), instant=True))
    )
    d = d.with_panel(
        k.stat_panel("Collapse alert", f"Instances where {collapse.name} fires now (Prometheus rule state, ALERTS).", "none")
        .thresholds(k.count_steps("red"))
        .mappings([dm.ValueMap(options={"0": dm.ValueMappingResult(text="OK", color="green")})])
        .with_target(k.query(f"count({_alerts(collapse.name, 'firing')}) or vector(0)", instant=True))
    )

    # -- by position and context
    d = d.with_row(k.row("Acceptance by position and context"))
    d = d.with_panel(
        k.acceptance_timeseries("Acceptance rate by position", "Accepted / drafted tokens at each draft position. "
                                "Later positions are accepted only after every earlier one, so they sit lower.")
        .with_target(k.query(promql.recorded_acceptance(["position"], MATCHERS), "position {{position}}"))
    )
    d = d.with_panel(
        k.heatmap.Panel().id(k.next_id()).title("Acceptance heatmap: position × time")
        .description("One row per draft position, colour = acceptance rate (red 0 %, green 100 %).")
        .datasource(k.ds).span(12).height(8)
        .calculate(False)
        .rows_frame(k.heatmap.RowsHeatmapOptions().layout(cm.HeatmapCellLayout.UNKNOWN).value("acceptance"))
        .color(k.heatmap.HeatmapColorOptions().mode(k.hm.HeatmapColorMode.SCHEME).scheme("RdYlGn")
               .scale(k.hm.HeatmapColorScale.LINEAR).min(0).max(1).steps(64))
        .filter_values(k.heatmap.FilterValueRange().le(-1))  # keep 0 % cells: they are the collapse
        .cell_values(k.heatmap.CellValues().unit("percentunit").decimals(0))
        .y_axis(k.heatmap.YAxisConfig().unit("none").axis_label("draft position"))
        .show_value(cm.VisibilityMode.NEVER).cell_gap(1)
        .with_target(k.query(promql.recorded_acceptance(["position"], MATCHERS), "{{position}}"))
    )
    order = ["position\\context_bucket", *promql.CONTEXT_BUCKETS]
    d = d.with_panel(
        k.table_panel("Acceptance by context bucket × position",
                      "Acceptance over the selected range, one row per draft position and one column per context "
                      "length. The sliding-window signature: a drafter whose sliding window was dropped (or a "
                      "short-context drafter) agrees at short contexts and turns red to the right.", span=12)
        .unit("percentunit").decimals(1).min(0).max(1)
        .color_scheme(db.FieldColor().mode(dm.FieldColorModeId.CONTINUOUS_RD_YL_GR))
        .cell_options(k.cm.TableColoredBackgroundCellOptions())
        .no_value("—")
        .with_target(k.query(promql.acceptance("$__range", ["context_bucket", "position"], MATCHERS, fn="increase"),
                             instant=True, table=True))
        .with_transformation(k.transform("groupingToMatrix", {"columnField": "context_bucket", "rowField": "position", "valueField": "Value"}))
        .with_transformation(k.hide_fields(rename={"position\\context_bucket": "position"}, order=order))
        .with_transformation(k.transform("convertFieldType", {"conversions": [{"targetField": "position", "destinationType": "number"}]}))
        .with_transformation(k.transform("sortBy", {"sort": [{"field": "position", "desc": False}]}))
        .override_by_name("position", [k.prop("custom.cellOptions", {"type": "auto"}), k.prop("unit", "none"),
                                       k.prop("decimals", 0), k.prop("custom.width", 90)])
    )
    d = d.with_panel(
        k.acceptance_timeseries("Acceptance rate by context bucket", "All positions, by the request's context length "
                                "when the draft was verified.")
        .with_target(k.query(promql.recorded_acceptance(["context_bucket"], MATCHERS), "{{context_bucket}}"))
    )

    # -- throughput
    d = d.with_row(k.row("Throughput"))
    d = d.with_panel(
        k.timeseries_panel("Mean acceptance length over time", "Tokens emitted per request-step with drafts (accepted + 1).",
                     "suffix: tok/step", span=8)
        .min(1).decimals(2)
        .with_target(k.query(promql.mean_acceptance_length(W, matchers=MATCHERS), "mean acceptance length"))
    )
    d = d.with_panel(
        k.timeseries_panel("Drafted and accepted tokens", "Tokens per second the drafter proposed and the target accepted.",
                     "suffix: tok/s", span=8)
        .min(0)
        .with_target(k.query(promql.summed("rate", promql.DRAFTED, W, [], MATCHERS), "drafted", ref="A"))
        .with_target(k.query(promql.summed("rate", promql.ACCEPTED, W, [], MATCHERS), "accepted", ref="B"))
    )
    d = d.with_panel(
        k.timeseries_panel("Verify steps", "Request-steps with drafts verified per second.", "suffix: steps/s", span=8)
        .min(0)
        .with_target(k.query(promql.summed("rate", promql.VERIFY_STEPS, W, [], MATCHERS), "request-steps"))
    )

    # -- does speculation pay?
    d = d.with_row(k.row("Does speculation pay?"))
    d = d.with_panel(
        k.timeseries_panel("Speed-up estimate", "Estimated speed-up over decoding without drafts: mean acceptance "
                           "length × the steps' time without drafts (verification fitted against scheduled tokens) / their "
                           "time, from the worker's host clock over every step of the run so far that verified drafts; an estimate: the time without drafts is fitted, not measured (model: spectrace docs, \"Does speculation pay?\"). Below 1 speculation costs more than it saves "
                           f"({codes.SPECULATION_NOT_PAYING}).", "suffix: ×", span=24)
        .min(0).decimals(2)
        .thresholds(k.steps((None, "red"), (1, "green")))
        .with_target(k.query(promql.series(promql.SPEEDUP_ESTIMATE, MATCHERS), "rank {{rank}}"))
    )
    d = d.with_panel(
        k.timeseries_panel("What k pays", "Speed-up over decoding without drafts at each number of speculative tokens "
                           "k' (0: no speculation), predicted from the run's own per-position acceptance and step times "
                           "(the k in force among them; k' past it extrapolated from the acceptance curve). A worker prices "
                           "it alone (fit): it read 9-43 % high on CPU and ranked a self-drafter's k = 5 first where no "
                           "speculation was best. For advice, trace one run of the target without speculation and read "
                           "spectrace report or the named query speedup_by_k (priced from measured steps: within 15 %; "
                           "spectrace docs, \"What k pays\").", "suffix: ×", span=24)
        .min(0).decimals(2)
        .with_target(k.query(f"max by (k) ({promql.series(promql.SPEEDUP_BY_K, MATCHERS)})", "k = {{k}}"))
    )

    # -- breakdown
    d = d.with_row(k.row("Breakdown"))
    d = d.with_panel(
        k.acceptance_timeseries("Acceptance by worker rank", "Acceptance as each worker rank verified it. Ranks "
                                "disagreeing with each other point at a sharded drafter or tap problem.")
        .with_target(k.query(promql.worker_acceptance(W, ["rank"], MATCHERS), "rank {{rank}}"))
    )
    d = d.with_panel(
        k.acceptance_timeseries("Acceptance by instance", "One line per serving instance: one instance low, the "
                                "others healthy, means a configuration difference on that instance.")
        .with_target(k.query(promql.acceptance(W, ["instance"], MATCHERS), "{{instance}}"))
    )

    # -- requests and the scheduler
    d = d.with_row(k.row("Requests and the scheduler"))
    d = d.with_panel(
        k.table_panel("Acceptance by request slice",
                      "Acceptance over the selected range per request parameter and value (a penalty, logit bias, "
                      "temperature band, top-p/top-k, grammar, LoRA adapter, prefix-cache hit, prompt length). The "
                      "drafter proposes without the request's penalties and logit processors: one value far below the "
                      f"others is {codes.SLICE_ACCEPTANCE_LOW}.", span=16)
        .unit("percentunit").decimals(1).min(0).max(1)
        .color_scheme(db.FieldColor().mode(dm.FieldColorModeId.CONTINUOUS_RD_YL_GR))
        .cell_options(k.cm.TableColoredBackgroundCellOptions())
        .with_target(k.query(promql.slice_acceptance("$__range", matchers=MATCHERS, fn="increase"), instant=True, table=True))
        .with_transformation(k.hide_fields("Time"))
    )
    d = d.with_panel(
        k.timeseries_panel("Drafts never verified", "Share of the draft tokens the worker proposed that no step verified: "
                           "the scheduler trimmed them to max_num_batched_tokens, or their request finished "
                           f"({codes.DRAFTS_UNVERIFIED}, {codes.TOKEN_BUDGET_SHORT}; synchronous scheduling).",
                           "percentunit", span=8)
        .min(0).max(1).decimals(1)
        .with_target(k.query(promql.unverified_share(W, matchers=MATCHERS), "not verified"))
    )
    d = d.with_panel(
        k.timeseries_panel("k switches (dynamic speculation)", "Share of the verified steps that drafted another k than "
                           "the step before: with num_speculative_tokens_per_batch_size, a batch sitting on a threshold "
                           "of the schedule flips k from step to step and throws drafts away "
                           f"({codes.DYNAMIC_K_THRASHING}: ≥ 25 % of steps).", "percentunit")
        .min(0).max(1).decimals(1)
        .thresholds(k.steps((None, "transparent"), (0.25, "orange")))
        .thresholds_style(k.common.GraphThresholdsStyleConfig().mode(k.cm.GraphThresholdsStyleMode.DASHED))
        .with_target(k.query(promql.k_switch_share(W, matchers=MATCHERS), "steps after a k switch"))
    )
    d = d.with_panel(
        k.timeseries_panel("Verified steps by k", "Steps per second that verified drafts, by the k they drafted (the "
                           "most drafts one request got): dynamic speculation moves k with the batch size, the token "
                           "budget trims it.", "ops")
        .min(0).decimals(1)
        .with_target(k.query(promql.steps_by_k(W, MATCHERS), "k = {{k}}"))
    )

    # -- alerts
    d = d.with_row(k.row("Alerts"))
    drop = alerts.rule("SpectraceAcceptanceDrop")
    d = d.with_panel(
        k.statetimeline.Panel().id(k.next_id()).title("Acceptance alert state")
        .description(f"{collapse.name} and {drop.name} per instance, as Prometheus evaluates the spectrace rule file "
                     "(ALERTS). Empty means no alert.")
        .datasource(k.ds).span(12).height(6).show_value(cm.VisibilityMode.NEVER).merge_values(True)
        .mappings([dm.ValueMap(options={"1": dm.ValueMappingResult(text="pending", color="orange"),
                                        "2": dm.ValueMappingResult(text="firing", color="red")})])
        .thresholds(k.steps((None, "green"), (1, "orange"), (2, "red")))
        .with_target(k.query(_firing(collapse.name), "{{alertname}} {{instance}}", ref="A"))
        .with_target(k.query(_firing(drop.name), "{{alertname}} {{instance}}", ref="B"))
    )
    d = d.with_panel(
        db.Panel().type("alertlist").id(k.next_id()).title("Grafana-managed spectrace alerts")
        .description("Alert rules pushed by `spectrace dashboards push` (Grafana-managed), firing or pending.")
        .span(12).height(6)
        .options({
            "viewMode": "list", "groupMode": "default", "groupBy": [], "maxItems": 20, "sortOrder": 1,
            "dashboardAlerts": False, "alertName": "Spectrace", "alertInstanceLabelFilter": "",
            "stateFilter": {"firing": True, "pending": True, "noData": False, "normal": False, "error": True},
        })
    )
    return d.build()


def configuration_dashboard() -> Any:
    """"Speculative decoding — configuration": what vLLM actually runs versus what the checkpoints declare."""
    k = Kit()
    db, dm, cm = k.dashboard, k.dm, k.cm

    d = (
        db.Dashboard("Speculative decoding — configuration")
        .uid(CONFIGURATION_UID)
        .description(
            "spectrace's configuration audit: findings, attention layout declared vs at runtime, hidden-state "
            "taps and the run's method and versions. Red means vLLM runs something other than what the "
            "checkpoint declares."
        )
        .tags(TAGS).time("now-6h", "now").refresh("1m").timezone("browser")
        .variables(k.variables())
        .link(db.DashboardLink("Acceptance").type(dm.DashboardLinkType.DASHBOARDS).tags(["spectrace"])
              .include_vars(True).keep_time(True).as_dropdown(False))
    )

    # -- findings
    d = d.with_row(k.row("Findings"))
    for severity, color in (("error", "red"), ("warning", "orange"), ("info", "blue")):
        d = d.with_panel(
            k.stat_panel(f"{severity.capitalize()} findings", f"Distinct findings of severity {severity} present now.",
                   "none", span=4)
            .thresholds(k.count_steps(color))
            .with_target(k.query(
                f"count({promql.findings([*MATCHERS, _eq('severity', severity)])} > 0) or vector(0)", instant=True))
        )
    d = d.with_panel(
        k.stat_panel("Attention layers declared ≠ runtime", "Layers a LAYOUT_MISMATCH error names: they run another "
               "attention type or window than their config says (the audit's verdict).", "none", span=4)
        .thresholds(k.count_steps("red"))
        .with_target(k.query(f"count({promql.layout_mismatches(MATCHERS)}) or vector(0)", instant=True))
    )
    d = d.with_panel(
        k.stat_panel("Tap findings", "Hidden-state tap findings present now (" + ", ".join(promql.TAP_CODES) + ").",
               "none", span=4)
        .thresholds(k.count_steps("red"))
        .with_target(k.query(
            f"count({promql.findings([*MATCHERS, _TAP_MATCHER])} > 0) or vector(0)", instant=True))
    )
    d = d.with_panel(
        k.stat_panel("Runs", "Engine starts (runs) in view.", "none", span=4)
        .thresholds(k.steps((None, "blue")))
        .color_mode(cm.BigValueColorMode.VALUE)
        .with_target(k.query(f"count(count by (run_id) ({promql.series(promql.RUN_INFO, MATCHERS)})) or vector(0)",
                             instant=True))
    )
    d = d.with_panel(
        k.table_panel("Current findings", "Each finding spectrace reports for the selected runs. Details, evidence "
                      "and the fix: spectrace query --named config_errors (or tap_mismatch).", height=9)
        .sort_by([k.common.TableSortByFieldState().display_name("severity")])
        .with_target(k.query(f"max by (instance, run_id, model_role, severity, code) ({promql.findings(MATCHERS)}) > 0",
                             instant=True, table=True))
        .with_transformation(k.hide_fields("Time", "Value", order=["severity", "code", "model_role", "instance", "run_id"]))
        .override_by_name("severity", k.text_colors(SEVERITY_COLORS))
    )
    d = d.with_panel(
        k.timeseries_panel("Findings over time", "Findings present, by severity: when they appeared and whether they went "
                     "away after a restart.", "none", span=24, height=6)
        .min(0).decimals(0)
        .with_target(k.query(f"count by (severity) ({promql.findings(MATCHERS)} > 0)", "{{severity}}"))
        .override_by_name("error", [k.prop("color", {"mode": "fixed", "fixedColor": "red"})])
        .override_by_name("warning", [k.prop("color", {"mode": "fixed", "fixedColor": "orange"})])
        .override_by_name("info", [k.prop("color", {"mode": "fixed", "fixedColor": "blue"})])
    )

    # -- attention layout
    d = d.with_row(k.row("Attention layout"))
    layout_colors = {status: (status, color) for status, color in zip(audit_layout.LAYOUT_STATUSES, ("red", "orange", "green", "text"))}
    for role, title in (("target", "Target"), ("draft", "Drafter")):
        layout = promql.attention_layout([*MATCHERS, f'model_role="{role}"'])
        d = d.with_panel(
            k.table_panel(f"{title} attention layout: declared vs runtime",
                          f"Per attention layer of the {title.lower()} model: the type the checkpoint declares and "
                          "the one vLLM built, with the runtime window, and the audit's verdict: MISMATCH (a LAYOUT_MISMATCH error) in "
                          "red, explained (caused by another finding, e.g. SWA_DROPPED) in orange.", span=12, height=10)
            .with_target(k.query(
                f"max by (instance, run_id, layer_index, declared_type, runtime_type, runtime_window, status) ({layout})",
                instant=True, table=True))
            .with_transformation(k.hide_fields(
                "Time", "Value",
                order=["layer_index", "declared_type", "runtime_type", "runtime_window", "status", "instance", "run_id"]))
            .with_transformation(k.transform("convertFieldType", {"conversions": [{"targetField": "layer_index", "destinationType": "number"}]}))
            .with_transformation(k.transform("sortBy", {"sort": [{"field": "layer_index", "desc": False}]}))
            .override_by_name("status", k.text_colors(layout_colors))
        )

    # -- taps
    d = d.with_row(k.row("Hidden-state taps"))
    d = d.with_panel(
        k.table_panel("Tap audit: declared vs tapped", "Per hidden-state tap: the target layer the drafter declares "
                      "(expected) and the one vLLM feeds it (tapped). Offset ≠ 0 in red.", span=24, height=8)
        .with_target(k.query(
            f"max by (instance, run_id, tap, expected_id, tapped_id) ({promql.series(promql.HIDDEN_STATES_TAP, MATCHERS)})",
            instant=True, table=True))
        .with_transformation(k.hide_fields("Time", "Value", order=["tap", "expected_id", "tapped_id", "instance", "run_id"]))
        .with_transformation(k.transform("convertFieldType", {"conversions": [
            {"targetField": "tap", "destinationType": "number"},
            {"targetField": "expected_id", "destinationType": "number"},
            {"targetField": "tapped_id", "destinationType": "number"},
        ]}))
        .with_transformation(k.transform("calculateField", {
            "mode": "binary", "alias": "offset",
            "binary": {"left": "tapped_id", "operator": "-", "right": "expected_id"},
            "replaceFields": False,
        }))
        .with_transformation(k.transform("sortBy", {"sort": [{"field": "tap", "desc": False}]}))
        .override_by_name("offset", [
            k.prop("custom.cellOptions", {"type": "color-background"}),
            k.prop("mappings", [{"type": "value", "options": {"0": {"text": "0 (match)", "color": "green", "index": 0}}}]),
            k.prop("thresholds", {"mode": "absolute", "steps": [{"value": None, "color": "red"}]}),
            k.prop("color", {"mode": "thresholds"}),
        ])
    )

    # -- run
    d = d.with_row(k.row("Run"))
    info_labels = ["instance", "run_id", "model", "draft_model", "method", "num_speculative_tokens", "model_runner",
                   "vllm_version", "spectrace_version"]
    d = d.with_panel(
        k.table_panel("Method, k and versions", "One row per run: the speculative method vLLM resolved, the number of "
                      "speculative tokens (k) and the versions involved.", span=16, height=7)
        .with_target(k.query(f"max by ({', '.join(info_labels)}) ({promql.series(promql.RUN_INFO, MATCHERS)})",
                             instant=True, table=True))
        .with_transformation(k.hide_fields("Time", "Value", rename={"num_speculative_tokens": "k"}, order=info_labels))
    )
    d = d.with_panel(
        k.timeseries_panel("spectrace health", "Records spectrace's exporter dropped and exceptions inside its hooks (vLLM "
                     "carried on). Anything above zero means the panels above miss data.", "suffix: /s", span=8, height=7)
        .min(0)
        .with_target(k.query(f"sum(rate({promql.series(promql.EXPORT_DROPPED, PROCESS_MATCHERS)}[$__rate_interval])) or vector(0)",
                             "dropped records", ref="A"))
        .with_target(k.query(f"sum(rate({promql.series(promql.INTERNAL_ERRORS, PROCESS_MATCHERS)}[$__rate_interval])) or vector(0)",
                             "errors in hooks", ref="B"))
    )
    return d.build()


# Panels whose queries return nothing while everything is healthy (no alert, no
# finding, no tap in this method): a live test should not require data from them.
MAY_BE_EMPTY = frozenset({
    "Acceptance alert state [A]", "Acceptance alert state [B]", "annotation: Acceptance collapse",
    "Current findings", "Findings over time", "Tap audit: declared vs tapped",
})

# --------------------------------------------------------------------------- output

DASHBOARDS = {ACCEPTANCE_FILE: acceptance_dashboard, CONFIGURATION_FILE: configuration_dashboard}


def to_json(built: Any) -> dict[str, Any]:
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    return json.loads(json.dumps(built, cls=JSONEncoder))


def dashboards() -> dict[str, dict[str, Any]]:
    """File name -> dashboard JSON, freshly built."""
    return {name: to_json(build()) for name, build in DASHBOARDS.items()}


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def panel_targets(document: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(panel, target) for every query of a dashboard, rows' nested panels included."""
    for panel in document.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets") or []:
                yield inner, target


def substitute(expr: str, *, step: str = "1m", scrape_interval: str = "15s", time_range: str = "1h",
               variables: dict[str, str] | None = None) -> str:
    """``expr`` with Grafana's macros and the dashboard variables replaced, as Grafana would send it.

    ``$__rate_interval`` follows Grafana: max(step + scrape interval, 4 × scrape interval).
    Variables default to ``.*`` (the "All" value).
    """
    step_s, scrape_s = alerts.seconds(step), alerts.seconds(scrape_interval)
    macros = {
        "__rate_interval": f"{max(step_s + scrape_s, 4 * scrape_s)}s",
        "__interval": step,
        "__range": time_range,
    }
    values = {"model": ".*", "draft_model": ".*", "instance": ".*", "run": ".*", **(variables or {})}

    def replace(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name in macros:
            return macros[name]
        if name in values:
            return values[name]
        raise KeyError(f"unknown variable ${name} in {expr!r}")

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, expr)


def panel_queries(step: str = "1m", *, scrape_interval: str = "15s", time_range: str = "1h",
                  variables: dict[str, str] | None = None) -> list[tuple[str, str, str]]:
    """(dashboard title, panel title, PromQL) for every panel query and annotation, macros substituted.

    For live tests (every query returns data against a real Prometheus) and promtool checks.
    """
    out = []
    for document in dashboards().values():
        title = document["title"]
        for panel, target in panel_targets(document):
            suffix = f" [{target['refId']}]" if len(panel.get("targets", [])) > 1 else ""
            out.append((title, panel["title"] + suffix, substitute(target["expr"], step=step, scrape_interval=scrape_interval,
                                                                   time_range=time_range, variables=variables)))
        for annotation in document.get("annotations", {}).get("list", []):
            if annotation.get("expr"):
                out.append((title, f"annotation: {annotation['name']}",
                            substitute(annotation["expr"], step=step, scrape_interval=scrape_interval,
                                       time_range=time_range, variables=variables)))
    return out


def generated_files() -> dict[str, str]:
    """Everything committed under ``generated/``: the dashboards, and the rules with production defaults."""
    from spectrace.dashboards.yaml_text import to_yaml

    files = {name: dumps(document) for name, document in dashboards().items()}
    files["prometheus-rules.yaml"] = to_yaml(alerts.prometheus_rules(alerts.PRODUCTION))
    files["grafana-alert-rules.yaml"] = to_yaml(alerts.grafana_provisioning(alerts.PRODUCTION))
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spectrace.dashboards.build", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed files differ from the code")
    args = parser.parse_args(argv)
    stale = []
    for name, text in generated_files().items():
        path = GENERATED / name
        current = path.read_text() if path.exists() else None
        if current != text:
            stale.append(name)
            if not args.check:
                GENERATED.mkdir(exist_ok=True)
                path.write_text(text)
    if args.check and stale:
        print(f"stale: {', '.join(stale)} (run python -m spectrace.dashboards.build)", file=sys.stderr)
        return 1
    if not args.check:
        print(f"wrote {len(stale)} file(s) under {GENERATED}" if stale else "up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
