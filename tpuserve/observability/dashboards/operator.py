"""Operator dashboard (filled in when the operator's metrics module lands)."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from tpuserve.observability.dashboards.common import Ids, base_dashboard, stat_panel, target


def build() -> Dashboard:
    ids = Ids()
    return base_dashboard(
        "tpuserve / Operator", "tpuserve-operator", "tpuserve operator.", model_variable=False
    ).with_panel(
        stat_panel(
            ids,
            "Targets up",
            "Scraped operator pods.",
            "short",
            target('sum(up{job=~".*operator"})'),
        )
    )
