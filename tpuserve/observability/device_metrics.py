"""Metrics of GKE's TPU device plugin exporter: an external contract tpuserve reads, not exports.

GKE runs the exporter in `kube-system` (pods labelled `k8s-app=tpu-device-plugin`, `/metrics` on
port 2112). Series carry `make="cloud-tpu"`, `model` (the TPU type, not the LLM),
`tpu_topology` and `accelerator_id`; values are per accelerator. They do not name the inference
pod, so the TPU dashboard shows them per node and slice type, never joined to replicas.
Sources: llm-d's GKE TPU metrics guide (github.com/llm-d/llm-d,
`docs/operations/observability/tpu-metrics-gke.md`) and its TPU overview dashboard.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

DEVICE_PLUGIN_PORT = 2112
DEVICE_PLUGIN_LABELS: tuple[str, ...] = ("make", "model", "tpu_topology", "accelerator_id")
MAKE = "cloud-tpu"

TENSORCORE_UTILIZATION = "tensorcore_utilization"
MEMORY_BANDWIDTH_UTILIZATION = "memory_bandwidth_utilization"
DUTY_CYCLE = "duty_cycle"
MEMORY_USED = "memory_used"
MEMORY_TOTAL = "memory_total"

# name -> (unit, meaning); all gauges.
DEVICE_PLUGIN_METRICS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        TENSORCORE_UTILIZATION: ("percent", "TensorCore utilisation, 0-100."),
        MEMORY_BANDWIDTH_UTILIZATION: ("percent", "HBM bandwidth utilisation, 0-100."),
        DUTY_CYCLE: ("percent", "Share of time the accelerator was busy, 0-100."),
        MEMORY_USED: ("bytes", "HBM bytes in use."),
        MEMORY_TOTAL: ("bytes", "HBM bytes in total."),
    }
)
