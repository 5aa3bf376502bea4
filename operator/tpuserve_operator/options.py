"""The operator process's settings, from `tpuserve operator`'s flags."""

from __future__ import annotations

from dataclasses import dataclass, field

from tpuserve_operator.reconciler import ReconcilerSettings


@dataclass(frozen=True, slots=True)
class OperatorOptions:
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    kubeconfig: str | None = None
    listen_address: str = "0.0.0.0"
    metrics_port: int = 9090
    liveness_port: int = 8081
    standalone: bool = False
    peering_name: str = "tpuserve"
    peering_priority: int = 0
    peering_lifetime: int = 60
    api_workers: int = 16
    reconciler: ReconcilerSettings = field(default_factory=ReconcilerSettings)

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces
