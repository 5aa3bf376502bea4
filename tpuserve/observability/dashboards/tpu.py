"""TPU utilisation: GKE's TPU device plugin metrics (TensorCore, HBM bandwidth, duty cycle, HBM
memory) per slice type and node, next to the chips replicas own and what they produce."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from tpuserve.observability import device_metrics as dm
from tpuserve.observability.dashboards.common import (
    Ids,
    base_dashboard,
    stat_panel,
    target,
    timeseries_panel,
)

TPU = f'{{make="{dm.MAKE}"}}'


def build() -> Dashboard:
    ids = Ids()
    return (
        base_dashboard(
            "tpuserve / TPU utilisation",
            "tpuserve-tpu-utilisation",
            "TPU hardware utilisation from GKE's TPU device plugin, and the chips tpuserve "
            "replicas own. Device metrics describe nodes, not replicas.",
            model_variable=False,
        )
        .with_row(Row("Chips"))
        .with_panel(
            stat_panel(
                ids,
                "Device plugin exporters up",
                "TPU device plugin pods Prometheus scrapes successfully; 0 means no TPU "
                "hardware metrics (check the device plugin PodMonitor).",
                "short",
                target('sum(up{job=~".*tpu-device-plugin"})'),
                span=6,
            )
        )
        .with_panel(
            stat_panel(
                ids,
                "TPU chips in replicas",
                "TPU chips owned by tpuserve replicas, per generation.",
                "short",
                target("tpu_generation:tpuserve_replica_tpu_chips:sum", "{{tpu_generation}}"),
                span=18,
            )
        )
        .with_row(Row("Utilisation"))
        .with_panel(
            timeseries_panel(
                ids,
                "TensorCore utilisation",
                "Average TensorCore utilisation per TPU type and slice topology (0-100 %).",
                "percent",
                target(
                    f"avg by (model, tpu_topology) ({dm.TENSORCORE_UTILIZATION}{TPU})",
                    "{{model}} {{tpu_topology}}",
                ),
                max_value=100,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "HBM bandwidth utilisation",
                "Average HBM bandwidth utilisation per TPU type and topology (0-100 %); decode "
                "is memory-bound, so this is the one to watch for decode-heavy traffic.",
                "percent",
                target(
                    f"avg by (model, tpu_topology) ({dm.MEMORY_BANDWIDTH_UTILIZATION}{TPU})",
                    "{{model}} {{tpu_topology}}",
                ),
                max_value=100,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Duty cycle",
                "Average share of time the accelerators were busy, per TPU type and topology.",
                "percent",
                target(
                    f"avg by (model, tpu_topology) ({dm.DUTY_CYCLE}{TPU})",
                    "{{model}} {{tpu_topology}}",
                ),
                max_value=100,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "HBM memory per node",
                "HBM bytes in use and in total on each TPU node.",
                "bytes",
                target(f"sum by (instance) ({dm.MEMORY_USED}{TPU})", "{{instance}} used"),
                target(f"sum by (instance) ({dm.MEMORY_TOTAL}{TPU})", "{{instance}} total"),
            )
        )
        .with_row(Row("Work per chip"))
        .with_panel(
            timeseries_panel(
                ids,
                "Output tokens/s per chip by generation",
                "What the chips produce: decoded tokens per second per chip, per generation.",
                "tokens/s",
                target("tpu_generation:sglang_decode_tokens_per_chip:rate1m", "{{tpu_generation}}"),
                span=24,
            )
        )
    )
