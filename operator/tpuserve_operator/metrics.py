"""The operator's Prometheus metrics, declared here and nowhere else.

- `tpuserve_operator_reconciles_total{result}`: reconcile passes by result (`ok`,
  `invalid` for a spec that failed validation, `error` for API failures);
- `tpuserve_operator_reconcile_duration_seconds`: time of one pass;
- `tpuserve_operator_applies_total{kind}`: children (re)applied by server-side apply;
- `tpuserve_operator_servers{ready}`: TPUModelServers by their Ready condition;
- `tpuserve_replica_info{namespace,pod,model_name,tpu_generation,tpu_topology}` = 1 and
  `tpuserve_replica_tpu_chips{namespace,pod,tpu_generation}` = chips of the whole replica
  group, both on leader pods only (observability.md §4.1): recording rules join SGLang's
  per-pod series on (namespace, pod) to get per-generation and per-chip throughput without
  counting multi-host groups more than once;
- `tpuserve_unschedulable_pods{namespace,tpumodelserver,tpu_generation,tpu_topology}`: pods of
  each TPUModelServer the scheduler cannot place (PodScheduled=False, reason Unschedulable),
  0 when none, so the "pods unschedulable for TPU" alert needs no kube-state-metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

RECONCILE_BUCKETS_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RESULTS = ("ok", "invalid", "error")


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    """One replica group's leader pod, for the per-replica series."""

    namespace: str
    pod: str
    model_name: str
    tpu_generation: str
    tpu_topology: str
    chips: int


@dataclass(frozen=True, slots=True)
class ServerPodsRow:
    """One TPUModelServer's count of pods the scheduler cannot place."""

    namespace: str
    tpumodelserver: str
    tpu_generation: str
    tpu_topology: str
    unschedulable_pods: int


@dataclass(frozen=True, slots=True)
class OperatorMetrics:
    reconciles: Counter
    reconcile_duration: Histogram
    applies: Counter


class ReplicaCollector(Collector):
    """Per-replica series, read from the operator's state at scrape time (no stale series)."""

    def __init__(
        self,
        replicas: Callable[[], Iterable[ReplicaRow]],
        servers: Callable[[], Iterable[bool]],
        unschedulable: Callable[[], Iterable[ServerPodsRow]] = tuple,
    ) -> None:
        self._replicas = replicas
        self._servers = servers
        self._unschedulable = unschedulable

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "tpuserve_replica_info",
            "One per replica group, on its leader pod: the model and TPU slice it serves.",
            labels=["namespace", "pod", "model_name", "tpu_generation", "tpu_topology"],
        )
        chips = GaugeMetricFamily(
            "tpuserve_replica_tpu_chips",
            "TPU chips of the whole replica group (all hosts), on its leader pod.",
            labels=["namespace", "pod", "tpu_generation"],
        )
        for row in self._replicas():
            info.add_metric(
                [row.namespace, row.pod, row.model_name, row.tpu_generation, row.tpu_topology], 1
            )
            chips.add_metric([row.namespace, row.pod, row.tpu_generation], row.chips)
        servers = GaugeMetricFamily(
            "tpuserve_operator_servers",
            "TPUModelServers the operator serves, by their Ready condition.",
            labels=["ready"],
        )
        states = list(self._servers())
        servers.add_metric(["true"], sum(1 for s in states if s))
        servers.add_metric(["false"], sum(1 for s in states if not s))
        unschedulable = GaugeMetricFamily(
            "tpuserve_unschedulable_pods",
            "Pods of a TPUModelServer the scheduler cannot place (PodScheduled=False, reason "
            "Unschedulable): no TPU node pool of its generation and topology has room.",
            labels=["namespace", "tpumodelserver", "tpu_generation", "tpu_topology"],
        )
        for server in self._unschedulable():
            unschedulable.add_metric(
                [server.namespace, server.tpumodelserver, server.tpu_generation,
                 server.tpu_topology],
                server.unschedulable_pods,
            )  # fmt: skip
        yield info
        yield chips
        yield servers
        yield unschedulable


def create_operator_metrics(
    registry: CollectorRegistry,
    replicas: Callable[[], Iterable[ReplicaRow]] = tuple,
    servers: Callable[[], Iterable[bool]] = tuple,
    unschedulable: Callable[[], Iterable[ServerPodsRow]] = tuple,
) -> OperatorMetrics:
    """Register every operator series on `registry` (tests pass a fresh one)."""
    metrics = OperatorMetrics(
        reconciles=Counter(
            "tpuserve_operator_reconciles_total",
            "Reconcile passes over TPUModelServers, by result (ok, invalid, error).",
            ["result"],
            registry=registry,
        ),
        reconcile_duration=Histogram(
            "tpuserve_operator_reconcile_duration_seconds",
            "Seconds one reconcile pass of one TPUModelServer took.",
            buckets=RECONCILE_BUCKETS_SECONDS,
            registry=registry,
        ),
        applies=Counter(
            "tpuserve_operator_applies_total",
            "Children created or updated by server-side apply, by kind.",
            ["kind"],
            registry=registry,
        ),
    )
    for result in RESULTS:
        metrics.reconciles.labels(result)  # series exist at zero from the start
    registry.register(ReplicaCollector(replicas, servers, unschedulable))
    return metrics
