"""The PromQL of generated dashboards' panels, ready to run against a live Prometheus."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from tpuserve.observability import generate

# Grafana's macros and variables, as a dashboard viewer would have them; 1m holds 60 samples of
# the 1 s scrape (`local_prometheus.SCRAPE_INTERVAL`), so every rate has the two it needs.
LIVE_MACROS = {"$__rate_interval": "1m", "$__interval": "1m", "$model_name": ".*"}
OFFSET = re.compile(r"\s+offset\s+[0-9smhdwy]+")
"""A query's look back in time (``x offset 23h55m``: yesterday's rate): a Prometheus that
started minutes ago holds no sample that old, so the query runs without it. That still
checks what can fail (the series exist, the expression parses and selects them); the
history itself is not a property of the dashboard."""


def panel_queries(names: Iterable[str]) -> dict[str, str]:
    """`dashboard / panel / refId` -> PromQL with `LIVE_MACROS` substituted, for every panel
    query of the named dashboards (file names without ``.json``)."""
    out = {}
    for name in names:
        board = json.loads(
            (generate.REPO_ROOT / generate.DASHBOARD_DIR / f"{name}.json").read_text()
        )
        for panel in board["panels"]:
            for t in panel.get("targets") or []:
                expr = t["expr"]
                for macro, value in LIVE_MACROS.items():
                    expr = expr.replace(macro, value)
                expr = OFFSET.sub("", expr)
                out[f"{name} / {panel['title']} / {t['refId']}"] = expr
    return out
