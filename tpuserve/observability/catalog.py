"""Every metric name a tpuserve dashboard or rule may select, gathered from where each is declared.

- SGLang series: `sglang_tpu.metric_names` (what the engine twin and SGLang export);
- router series: `tpuserve_router.metrics` (built into a throwaway registry and collected);
- GKE TPU device plugin series: `tpuserve.observability.device_metrics`;
- operator series: `tpuserve_replica_info`, `tpuserve_replica_tpu_chips` (observability.md §4.1);
- recording rules and chart-rendered constants; Prometheus's own `up`.
"""

from __future__ import annotations

from collections.abc import Iterable

import promql_parser
from prometheus_client import CollectorRegistry

from sglang_tpu import metric_names as sg
from tpuserve.observability import device_metrics, rules

OPERATOR_SERIES = frozenset({"tpuserve_replica_info", "tpuserve_replica_tpu_chips"})
CHART_CONSTANTS = frozenset({"tpuserve:tpu_chip_hour_price_usd"})
PROMETHEUS_SERIES = frozenset({"up"})
# Grafana macros replaced before parsing a panel query.
MACROS = {"$__rate_interval": "5m", "$__interval": "1m", "$model_name": ".*"}


def router_series() -> frozenset[str]:
    from tpuserve_router.metrics import StateCollector, create_router_metrics

    registry = CollectorRegistry()
    create_router_metrics(registry)
    names: set[str] = set()
    for family in registry.collect():  # labelled families have no samples until used
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
        names |= {family.name + s for s in suffixes.get(family.type, ("",))}
    for family in StateCollector(lambda: (), dict).collect():
        names.add(family.name)
    return frozenset(names)


def known_series() -> frozenset[str]:
    return (
        sg.series_names()
        | router_series()
        | frozenset(device_metrics.DEVICE_PLUGIN_METRICS)
        | OPERATOR_SERIES
        | CHART_CONSTANTS
        | PROMETHEUS_SERIES
        | frozenset(r.record for r in rules.recording_rules())
    )


def selected_names(expr: str) -> set[str]:
    """Metric names of every vector selector in a PromQL expression (Grafana macros allowed)."""
    for macro, value in MACROS.items():
        expr = expr.replace(macro, value)
    names: set[str] = set()
    _walk(promql_parser.parse(expr), names)
    return names


def _walk(node: object, names: set[str]) -> None:
    if isinstance(node, promql_parser.VectorSelector):
        if node.name:
            names.add(node.name)
        return
    for attr in ("expr", "lhs", "rhs", "vector_selector", "param"):
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, str | int | float):
            _walk(child, names)
    args = getattr(node, "args", None)
    if isinstance(args, Iterable):
        for arg in args:
            _walk(arg, names)
