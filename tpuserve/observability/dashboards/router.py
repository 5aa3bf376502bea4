"""Router dashboard (filled in when the router's metrics module lands)."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from tpuserve.observability.dashboards.common import Ids, base_dashboard, stat_panel, target


def build() -> Dashboard:
    ids = Ids()
    return base_dashboard(
        "tpuserve / Router", "tpuserve-router", "tpuserve router.", model_variable=False
    ).with_panel(
        stat_panel(
            ids, "Targets up", "Scraped router pods.", "short", target('sum(up{job=~".*router"})')
        )
    )
