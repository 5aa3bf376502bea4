"""Prometheus Operator monitors for one server, when asked for and the CRDs exist.

The chart's fleet-wide PodMonitors already scrape every TPUModelServer, so these default to
off (spec.monitoring); turn them on when the chart's monitoring is not installed.
"""

from __future__ import annotations

from sglang_tpu.metric_names import restore_sglang_colon_relabeling
from tpuserve_operator import labels
from tpuserve_operator.render.context import Manifest, Server

MONITORING_API_VERSION = "monitoring.coreos.com/v1"
POD_TARGET_LABELS = [labels.MODEL, labels.TPU_GENERATION, labels.TPU_TOPOLOGY]


def monitors(server: Server) -> list[Manifest]:
    spec = server.valid.spec
    if not server.config.prometheus_operator:
        return []
    extra = spec.monitoring.labels
    out: list[Manifest] = []
    if spec.monitoring.pod_monitor:
        out.append(
            {
                "apiVersion": MONITORING_API_VERSION,
                "kind": "PodMonitor",
                "metadata": server.metadata(server.name, labels.COMPONENT_MODEL_SERVER, extra),
                "spec": {
                    "selector": {"matchLabels": labels.engine_selector(server.name)},
                    "podTargetLabels": POD_TARGET_LABELS,
                    "podMetricsEndpoints": [
                        {
                            "port": "http",
                            "path": "/metrics",
                            "metricRelabelings": [restore_sglang_colon_relabeling()],
                        }
                    ],
                },
            }
        )
    if spec.monitoring.service_monitor and spec.router.enabled:
        out.append(
            {
                "apiVersion": MONITORING_API_VERSION,
                "kind": "ServiceMonitor",
                "metadata": server.metadata(server.router_name, labels.COMPONENT_ROUTER, extra),
                "spec": {
                    "selector": {
                        "matchLabels": labels.common(server.name, labels.COMPONENT_ROUTER)
                    },
                    "endpoints": [{"port": "metrics", "path": "/metrics"}],
                },
            }
        )
    return out
