"""Small builders every tpuserve dashboard uses, so every panel has a description, a unit, the
templated `${datasource}` and a set refId (grafana-foundation-sdk leaves refId empty)."""

from __future__ import annotations

from typing import TypeVar

from grafana_foundation_sdk.builders import common as gc
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.models.common import (
    LegendDisplayMode,
    LegendPlacement,
    StackingMode,
)
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

from sglang_tpu import metric_names as sg

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
# Selector fragment for series carrying the served model's name.
MODEL = 'model_name=~"$model_name"'
REF_IDS = "ABCDEFGH"

Target = tuple[str, str]  # (PromQL, legend format)


def target(expr: str, legend: str = "__auto") -> Target:
    return (expr, legend)


def _queries(targets: tuple[Target, ...]) -> list[prometheus.Dataquery]:
    if not targets:
        raise ValueError("a panel needs at least one query")
    return [
        prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(REF_IDS[i])
        for i, (expr, legend) in enumerate(targets)
    ]


class Ids:
    """Hands out panel ids in order so the generated JSON is stable across runs."""

    def __init__(self) -> None:
        self._next = 1

    def take(self) -> int:
        self._next += 1
        return self._next - 1


# The panel builders these helpers fill (each setter returns the builder itself).
_Panel = TypeVar("_Panel", stat.Panel, timeseries.Panel)


def _framed(
    panel: _Panel,
    ids: Ids,
    title: str,
    description: str,
    unit: str,
    targets: tuple[Target, ...],
    span: int,
    height: int,
) -> _Panel:
    """What every panel has: id, title, description, unit, datasource, size, queries."""
    panel = (
        panel.id(ids.take())
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .span(span)
        .height(height)
        .no_value("No traffic")
    )
    for query in _queries(targets):
        panel = panel.with_target(query)
    return panel


def stat_panel(
    ids: Ids,
    title: str,
    description: str,
    unit: str,
    *targets: Target,
    span: int = 6,
    height: int = 4,
) -> stat.Panel:
    return _framed(stat.Panel(), ids, title, description, unit, targets, span, height)


def timeseries_panel(
    ids: Ids,
    title: str,
    description: str,
    unit: str,
    *targets: Target,
    span: int = 12,
    height: int = 8,
    stacked: bool = False,
    max_value: float | None = None,
) -> timeseries.Panel:
    legend = (
        gc.VizLegendOptions()
        .show_legend(True)
        .display_mode(LegendDisplayMode.TABLE)
        .placement(LegendPlacement.BOTTOM)
        .calcs(["mean", "lastNotNull"])
    )
    panel = timeseries.Panel().min(0).fill_opacity(25 if stacked else 8).legend(legend)
    if max_value is not None:
        panel = panel.max(max_value)
    if stacked:
        panel = panel.stacking(gc.StackingConfig().mode(StackingMode.NORMAL))
    return _framed(panel, ids, title, description, unit, targets, span, height)


def base_dashboard(title: str, uid: str, description: str, *, model_variable: bool) -> gd.Dashboard:
    board = (
        gd.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["tpuserve"])
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
        .with_variable(gd.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    )
    if model_variable:
        board = board.with_variable(
            gd.QueryVariable("model_name")
            .label("Model")
            .datasource(DATASOURCE)
            # Set once at startup, so a server lists its model before its first request.
            .query(f"label_values({sg.MAX_TOTAL_NUM_TOKENS.name}, model_name)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    return board
