"""Operator: is the TPUModelServer operator up and converging, how long its passes take, what it
applies, and the fleet it runs (replicas per slice, chips, pods the scheduler cannot place).
Built on the operator's own series (`tpuserve_operator/metrics.py`)."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from tpuserve.observability import rule_basis
from tpuserve.observability.dashboards.common import (
    Ids,
    base_dashboard,
    stat_panel,
    target,
    timeseries_panel,
)

SERVERS = "tpuserve_operator_servers"
DURATION = "tpuserve_operator_reconcile_duration_seconds"
APPLIES = "tpuserve_operator_applies_total"
REPLICA_INFO = "tpuserve_replica_info"
REPLICA_CHIPS = "tpuserve_replica_tpu_chips"
SLICE = "namespace, tpumodelserver, tpu_generation, tpu_topology"


def _duration(q: float) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({DURATION}_bucket[$__rate_interval])))"


def build() -> Dashboard:
    ids = Ids()
    return (
        base_dashboard(
            "tpuserve / Operator",
            "tpuserve-operator",
            "The TPUModelServer operator: pods up, servers ready, reconcile passes and their "
            "errors and duration, children applied, and the replicas, chips and unschedulable "
            "pods of the fleet it runs.",
            model_variable=False,
        )
        .with_row(Row("Now"))
        .with_panel(
            stat_panel(
                ids,
                "Operator pods up",
                "Operator pods Prometheus scrapes successfully. With several replicas one "
                "reconciles and the others stand by (kopf peering); 0 means nothing reconciles.",
                "short",
                target('sum(up{job=~".*operator"})'),
            )
        )
        .with_panel(
            stat_panel(
                ids,
                "TPUModelServers ready",
                "TPUModelServers whose Ready condition is True, and those whose is not.",
                "short",
                target(f'sum({SERVERS}{{ready="true"}})', "ready"),
                target(f'sum({SERVERS}{{ready="false"}})', "not ready"),
            )
        )
        .with_panel(
            stat_panel(
                ids,
                "Reconcile errors (1 h)",
                "Reconcile passes that failed with a Kubernetes API error in the last hour "
                "(the TPUServeOperatorReconcileErrors alert fires when they persist).",
                "short",
                target(f'sum(increase({rule_basis.OPERATOR_RECONCILES}{{result="error"}}[1h]))'),
            )
        )
        .with_panel(
            stat_panel(
                ids,
                "Unschedulable TPU pods",
                "Pods of TPUModelServers the scheduler cannot place: no TPU node pool of their "
                "generation and topology has room.",
                "short",
                target(f"sum({rule_basis.UNSCHEDULABLE_PODS})"),
            )
        )
        .with_row(Row("Reconciling"))
        .with_panel(
            timeseries_panel(
                ids,
                "Reconcile passes by result",
                "Reconcile passes per second: ok, invalid (a spec that failed validation, "
                "reported in its Valid condition) and error (API failures, retried with "
                "back-off).",
                "ops",
                target(
                    f"sum by (result) (rate({rule_basis.OPERATOR_RECONCILES}[$__rate_interval]))",
                    "{{result}}",
                ),
                span=8,
                stacked=True,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Reconcile pass duration",
                "Median and 99th percentile of how long one reconcile pass of one "
                "TPUModelServer took (validate, render, apply, status).",
                "s",
                target(_duration(0.5), "p50"),
                target(_duration(0.99), "p99"),
                span=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Children applied by kind",
                "Children created or updated by server-side apply per second, by kind. A "
                "steady rate with no spec changes means something keeps undoing the "
                "operator's work.",
                "ops",
                target(f"sum by (kind) (rate({APPLIES}[$__rate_interval]))", "{{kind}}"),
                span=8,
            )
        )
        .with_row(Row("Fleet"))
        .with_panel(
            timeseries_panel(
                ids,
                "Replicas by TPU slice",
                "Replica groups the operator runs (one leader each), per TPU generation and "
                "topology.",
                "short",
                target(
                    f"count by (tpu_generation, tpu_topology) ({REPLICA_INFO})",
                    "{{tpu_generation}} {{tpu_topology}}",
                ),
                span=8,
                stacked=True,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "TPU chips by generation",
                "TPU chips owned by the replica groups (every host of each slice), per generation.",
                "short",
                target(f"sum by (tpu_generation) ({REPLICA_CHIPS})", "{{tpu_generation}}"),
                span=8,
                stacked=True,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Unschedulable pods by TPUModelServer",
                "Pods each TPUModelServer has waiting for TPU capacity, with the slice they "
                "need (the TPUServeTPUPodsUnschedulable alert fires after 15 minutes).",
                "short",
                target(
                    f"max by ({SLICE}) ({rule_basis.UNSCHEDULABLE_PODS})",
                    "{{namespace}}/{{tpumodelserver}} {{tpu_generation}} {{tpu_topology}}",
                ),
                span=8,
            )
        )
    )
