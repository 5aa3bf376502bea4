"""Every metric name a tpuserve dashboard or rule may select, gathered from where each is declared.

- SGLang series and tpuserve's own engine series: `sglang_tpu.metric_names` (what the engine
  twin and SGLang export);
- router series: `tpuserve_router.metrics` (built into a throwaway registry and collected);
- GKE TPU device plugin series: `tpuserve.observability.device_metrics`;
- operator series: `tpuserve_operator.metrics` (built into a throwaway registry and collected);
- recording rules and chart-rendered constants; Prometheus's own `up`.
"""

from __future__ import annotations

from collections.abc import Iterable

import promql_parser
from prometheus_client import CollectorRegistry

from sglang_tpu import metric_names as sg
from tpuserve.observability import device_metrics, rules

CHART_CONSTANTS = frozenset({"tpuserve:tpu_chip_hour_price_usd"})
PROMETHEUS_SERIES = frozenset({"up"})
# Grafana macros replaced before parsing a panel query.
MACROS = {"$__rate_interval": "5m", "$__interval": "1m", "$model_name": ".*"}


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def _series_of(registry: CollectorRegistry) -> set[str]:
    # Families are listed even before a labelled child has a sample.
    return {
        family.name + suffix
        for family in registry.collect()
        for suffix in SUFFIXES.get(family.type, ("",))
    }


def router_series() -> frozenset[str]:
    from tpuserve_router.metrics import StateCollector, create_router_metrics

    registry = CollectorRegistry()
    create_router_metrics(registry)
    names = _series_of(registry)
    for family in StateCollector(lambda: (), dict).collect():
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return frozenset(names)


def operator_series() -> frozenset[str]:
    from tpuserve_operator.metrics import create_operator_metrics

    registry = CollectorRegistry()
    create_operator_metrics(registry)
    return frozenset(_series_of(registry))


def known_series() -> frozenset[str]:
    return (
        sg.series_names()
        | sg.TPUSERVE_ENGINE_SERIES
        | router_series()
        | frozenset(device_metrics.DEVICE_PLUGIN_METRICS)
        | operator_series()
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
