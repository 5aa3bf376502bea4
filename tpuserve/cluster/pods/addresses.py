"""Loopback addresses for pods and Services: the fake cluster ranges with 127 for 10.

kube-apiserver gives Services ClusterIPs from 10.96.0.0/16 and kwok would give pods IPs from
10.244.0.0/16; nothing may dial those. The pod runner gives each pod it runs an address of
its own in 127.244.0.0/16 instead (a process binds it as a pod binds its network namespace's
address) and serves each Service's ClusterIP 10.96.A.B at 127.96.A.B, so the mapping is the
first octet alone. Both ranges are loopback: Linux answers on all of 127.0.0.0/8 with no setup.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from tpuserve.cluster.components import SERVICE_CLUSTER_IP_RANGE

POD_NETWORK = ipaddress.IPv4Network("127.244.0.0/16")
SERVICE_NETWORK = ipaddress.IPv4Network("127.96.0.0/16")
_CLUSTER_IP_NETWORK = ipaddress.IPv4Network(SERVICE_CLUSTER_IP_RANGE)


class AddressesExhausted(RuntimeError):
    """Every address of the pod network is taken."""


def local_service_address(cluster_ip: str) -> str | None:
    """127.96.A.B for ClusterIP 10.96.A.B; None for headless or foreign addresses."""
    try:
        address = ipaddress.IPv4Address(cluster_ip)
    except ValueError:
        return None
    if address not in _CLUSTER_IP_NETWORK:
        return None
    offset = int(address) - int(_CLUSTER_IP_NETWORK.network_address)
    return str(SERVICE_NETWORK.network_address + offset)


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
