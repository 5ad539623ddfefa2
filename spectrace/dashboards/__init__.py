"""Grafana dashboards and alert rules (generated from Python, shipped as JSON/YAML).

- ``build``: the two dashboards (grafana-foundation-sdk), ``python -m spectrace.dashboards.build``
  rewrites the committed files under ``generated/``;
- ``alerts``: the alert rules, defined once, emitted for Grafana and for Prometheus;
- ``export`` / ``push``: ``spectrace dashboards export DIR`` and ``spectrace dashboards push --url URL``.

Importing this package stays cheap: the SDK is imported only when something is built.
"""

from __future__ import annotations

from typing import Any


def panel_queries(step: str = "1m", **kwargs: Any) -> list[tuple[str, str, str]]:
    """(dashboard title, panel title, PromQL) for every panel query, Grafana macros and variables substituted.

    See ``spectrace.dashboards.build.panel_queries`` for the keyword arguments
    (``scrape_interval``, ``time_range``, ``variables``).
    """
    from spectrace.dashboards.build import panel_queries as build_panel_queries

    return build_panel_queries(step, **kwargs)
