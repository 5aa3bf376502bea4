"""Loopback addresses for pods and Services: the fake cluster ranges with 127 for 10.

kube-apiserver gives Services ClusterIPs from 10.96.0.0/16 and kwok would give pods IPs from
10.244.0.0/16; nothing may dial those. The pod runner gives each pod it runs an address of
its own in 127.244.0.0/16 instead (a process binds it as a pod binds its network namespace's
address) and serves each Service's ClusterIP 10.96.A.B at 127.96.A.B, so the mapping is the
first octet alone. Both ranges are loopback: Linux answers on all of 127.0.0.0/8 with no setup.

Clusters whose pods run side by side on one machine take different networks (`Network`):
network N gives Services 10.(96+N).0.0/16 and pods 127.(244+N).0.0/16, so two clusters' pods
never bind the same address and port. Network 0 is the default.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

NETWORKS = 8
"""Networks 0 to 7: Service ranges 10.96/16 to 10.103/16, pod ranges 127.244/16 to 127.251/16."""
_CLUSTER_IPS = ipaddress.IPv4Network("10.96.0.0/13")  # every network's Service range
_LOOPBACK_SERVICES = ipaddress.IPv4Network("127.96.0.0/13")


@dataclass(frozen=True)
class Network:
    """The address ranges of one local cluster: ``index`` from 0 to `NETWORKS` - 1."""

    index: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.index < NETWORKS:
            raise ValueError(
                f"cluster network: {self.index} is not allowed; allowed: 0 to {NETWORKS - 1}"
            )

    @property
    def service_cluster_ip_range(self) -> str:
        """kube-apiserver's ``--service-cluster-ip-range``."""
        return f"10.{96 + self.index}.0.0/16"

    @property
    def pods(self) -> ipaddress.IPv4Network:
        """Where the pod runner gives pods their addresses."""
        return ipaddress.IPv4Network(f"127.{244 + self.index}.0.0/16")


DEFAULT_NETWORK = Network()
POD_NETWORK = DEFAULT_NETWORK.pods


class AddressesExhausted(RuntimeError):
    """Every address of the pod network is taken."""


def local_service_address(cluster_ip: str) -> str | None:
    """127.X.A.B for ClusterIP 10.X.A.B of any network (X from 96 to 103); None for headless
    or foreign addresses."""
    try:
        address = ipaddress.IPv4Address(cluster_ip)
    except ValueError:
        return None
    if address not in _CLUSTER_IPS:
        return None
    offset = int(address) - int(_CLUSTER_IPS.network_address)
    return str(_LOOPBACK_SERVICES.network_address + offset)


class PodAddresses:
    """Hands out pod addresses in order, never one in use, and reuses a freed one last."""

    def __init__(self, network: ipaddress.IPv4Network = POD_NETWORK) -> None:
        self.network = network
        self._hosts = list(network.hosts())
        self._next = 0
        self._used: set[str] = set()

    def claim(self, address: str) -> None:
        """Mark an address already in use (a pod the runner finds running at start)."""
        self._used.add(address)

    def allocate(self) -> str:
        for _ in range(len(self._hosts)):
            candidate = str(self._hosts[self._next])
            self._next = (self._next + 1) % len(self._hosts)
            if candidate not in self._used:
                self._used.add(candidate)
                return candidate
        raise AddressesExhausted(f"every address of {self.network} is in use")

    def release(self, address: str) -> None:
        self._used.discard(address)

    def in_use(self) -> Iterable[str]:
        return frozenset(self._used)

    def owns(self, address: str) -> bool:
        try:
            return ipaddress.IPv4Address(address) in self.network
        except ValueError:
            return False
