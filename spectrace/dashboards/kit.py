"""What both dashboards are built from: grafana-foundation-sdk's builders and models, the ``${datasource}`` data
source, the model/draft_model/instance/run variables and the matchers every panel filters by, queries, panel kinds and
styles. ``spectrace.dashboards.build`` composes the dashboards from a :class:`Kit`."""

from __future__ import annotations

import itertools
from typing import Any, Iterator

from spectrace.dashboards import alerts, promql

# Panel filters: every spectrace series carries these labels. ALERTS carries the
# alert's labels, which do not include run_id.
MATCHERS = ['model=~"$model"', 'draft_model=~"$draft_model"', 'instance=~"$instance"', 'run_id=~"$run"']
ALERT_MATCHERS = MATCHERS[:3]
# spectrace's own health counters carry no model labels, only the scrape target's.
PROCESS_MATCHERS = ['instance=~"$instance"']

COLLAPSE_THRESHOLD = alerts.PRODUCTION.collapse_threshold


class Kit:
    """Shared pieces of both dashboards: SDK modules, data source, variables, queries, styles."""

    def __init__(self) -> None:
        try:
            from grafana_foundation_sdk.builders import (
                common, dashboard, heatmap, prometheus, stat, statetimeline, table, timeseries,
            )
            from grafana_foundation_sdk.models import common as common_model
            from grafana_foundation_sdk.models import dashboard as dashboard_model
            from grafana_foundation_sdk.models import heatmap as heatmap_model
            from grafana_foundation_sdk.models import prometheus as prometheus_model
        except ImportError:
            raise ImportError("spectrace dashboards need grafana-foundation-sdk: pip install 'spectrace[dashboards]'") from None
        # builders
        self.common, self.dashboard, self.heatmap, self.prometheus = common, dashboard, heatmap, prometheus
        self.stat, self.statetimeline, self.table, self.timeseries = stat, statetimeline, table, timeseries
        # models
        self.cm, self.dm, self.hm, self.pm = common_model, dashboard_model, heatmap_model, prometheus_model
        self.ds = self.dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
        self._ids: Iterator[int] = itertools.count(1)

    def next_id(self) -> int:
        return next(self._ids)

    # -- variables

    def variables(self) -> list:
        db, dm = self.dashboard, self.dm

        def label_values(name: str, label: str, text: str, matchers: list[str]):
            query = f"label_values({promql.series(promql.RUN_INFO, matchers)}, {label})"
            return (
                db.QueryVariable(name).label(text).datasource(self.ds).query(query)
                .multi(True).include_all(True).all_value(".*")
                .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
            )

        return [
            db.DatasourceVariable("datasource").label("Data source").type("prometheus"),
            label_values("model", "model", "Target model", []),
            label_values("draft_model", "draft_model", "Draft model", MATCHERS[:1]),
            label_values("instance", "instance", "Instance", MATCHERS[:2]),
            label_values("run", "run_id", "Run", MATCHERS[:3]),
        ]

    # -- queries

    def query(self, expr: str, legend: str | None = None, *, ref: str = "A", instant: bool = False, table: bool = False):
        q = self.prometheus.Dataquery().ref_id(ref).expr(expr).datasource(self.ds)
        if legend is not None:
            q = q.legend_format(legend)
        if instant:
            q = q.instant()
        if table:
            q = q.format(self.pm.PromQueryFormat.TABLE)
        return q

    # -- styles

    def steps(self, *steps: tuple[float | None, str]):
        return (
            self.dashboard.ThresholdsConfig()
            .mode(self.dm.ThresholdsMode.ABSOLUTE)
            .steps([self.dm.Threshold(value=v, color=c) for v, c in steps])
        )

    def acceptance_steps(self):
        """Red below the collapse threshold, orange below 30 %, green above."""
        return self.steps((None, "red"), (COLLAPSE_THRESHOLD, "orange"), (0.3, "green"))

    def count_steps(self, color: str):
        return self.steps((None, "green"), (1, color))

    def legend(self):
        return (
            self.common.VizLegendOptions()
            .display_mode(self.cm.LegendDisplayMode.TABLE)
            .placement(self.cm.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["mean", "min", "lastNotNull"])
        )

    def tooltip(self):
        return self.common.VizTooltipOptions().mode(self.cm.TooltipDisplayMode.MULTI).sort(self.cm.SortOrder.NONE)

    def row(self, title: str):
        return self.dashboard.Row(title).id(self.next_id())

    def timeseries_panel(self, title: str, description: str, unit: str, *, span: int = 12, height: int = 8):
        return (
            self.timeseries.Panel().id(self.next_id()).title(title).description(description)
            .datasource(self.ds).unit(unit).span(span).height(height)
            .legend(self.legend()).tooltip(self.tooltip())
            .line_width(1).fill_opacity(10).show_points(self.cm.VisibilityMode.NEVER)
        )

    def acceptance_timeseries(self, title: str, description: str, *, span: int = 12):
        """Acceptance over time: percent axis 0-100 %, a red band below the collapse threshold."""
        return (
            self.timeseries_panel(title, description, "percentunit", span=span)
            .min(0).max(1)
            .thresholds(self.steps((None, "red"), (COLLAPSE_THRESHOLD, "transparent")))
            .thresholds_style(self.common.GraphThresholdsStyleConfig().mode(self.cm.GraphThresholdsStyleMode.DASHED_AND_AREA))
        )

    def stat_panel(self, title: str, description: str, unit: str, *, span: int = 6, height: int = 5):
        return (
            self.stat.Panel().id(self.next_id()).title(title).description(description)
            .datasource(self.ds).unit(unit).span(span).height(height)
            .graph_mode(self.cm.BigValueGraphMode.NONE)
            .color_mode(self.cm.BigValueColorMode.BACKGROUND)
            .reduce_options(self.common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        )

    def table_panel(self, title: str, description: str, *, span: int = 24, height: int = 8):
        return (
            self.table.Panel().id(self.next_id()).title(title).description(description)
            .datasource(self.ds).span(span).height(height).filterable(True)
        )

    def transform(self, kind: str, options: dict[str, Any]):
        return self.dm.DataTransformerConfig(id_val=kind, options=options)

    def hide_fields(self, *names: str, rename: dict[str, str] | None = None, order: list[str] | None = None):
        options: dict[str, Any] = {"excludeByName": {n: True for n in names}}
        if rename:
            options["renameByName"] = rename
        if order:
            options["indexByName"] = {name: i for i, name in enumerate(order)}
        return self.transform("organize", options)

    def prop(self, key: str, value: Any):
        return self.dm.DynamicConfigValue(id_val=key, value=value)

    def text_colors(self, colors: dict[str, tuple[str, str]]) -> list:
        """Cell background by text value: {value: (display text, color)}."""
        mapping = {
            "type": "value",
            "options": {value: {"text": text, "color": color, "index": i} for i, (value, (text, color)) in enumerate(colors.items())},
        }
        return [self.prop("custom.cellOptions", {"type": "color-background"}), self.prop("mappings", [mapping])]
