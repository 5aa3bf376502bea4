"""Services without kube-proxy: each ClusterIP Service answers at a stable loopback address.

A Service with ClusterIP 10.96.A.B listens at 127.96.A.B on each of its TCP ports
(`addresses.local_service_address`) and forwards every connection to one of its endpoints:
a ready, not terminating pod the runner runs, in the Service's namespace, matching its
selector (round robin), on the `targetPort` (a number, or a container port's name). This is
what kube-proxy does with the ClusterIP, read from the runner's own pods rather than from
EndpointSlices (which refuse loopback addresses). With no ready endpoint a connection is
closed at once. Headless Services (no ClusterIP) have no address, as in a cluster, and nor
have Services without a selector (`default/kubernetes`: use the kubeconfig's address).
The Service gets the annotation `tpuserve.dev/local-address` so `kubectl` shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tpuserve.cluster.pods.addresses import local_service_address

log = logging.getLogger(__name__)

LOCAL_ADDRESS_ANNOTATION = "tpuserve.dev/local-address"
COPY_CHUNK_BYTES = 64 * 1024


class Endpoint(Protocol):
    namespace: str
    pod_ip: str

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def ready(self) -> bool: ...

    def container_port(self, name: str) -> int | None: ...


@dataclass
class _Listener:
    server: asyncio.Server
    port: Mapping[str, Any]


def local_address(service: Mapping[str, Any]) -> str | None:
    """Where the Service answers: None when headless or without a selector (no endpoints the
    runner could know, such as `default/kubernetes`)."""
    spec = service.get("spec") or {}
    if not spec.get("selector"):
        return None
    return local_service_address(str(spec.get("clusterIP") or ""))


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def target_port(port: Mapping[str, Any], endpoint: Endpoint) -> int | None:
    target = port.get("targetPort", port["port"])
    if isinstance(target, int) or str(target).isdigit():
        return int(target)
    return endpoint.container_port(str(target))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(COPY_CHUNK_BYTES):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()


class ServiceProxy:
    """Listeners for every ClusterIP Service, forwarding to the runner's ready pods."""

    def __init__(self, endpoints: Callable[[], Sequence[Endpoint]]) -> None:
        self.endpoints = endpoints
        self._listeners: dict[str, list[_Listener]] = {}  # service uid -> listeners
        self._specs: dict[str, tuple[str, tuple[Any, ...]]] = {}
        self._turn = itertools.count()

    async def update(self, service: Mapping[str, Any]) -> str | None:
        """Serve the Service (again, if its ports changed); its local address, or None."""
        uid = str(service["metadata"]["uid"])
        spec = service.get("spec") or {}
        address = local_address(service)
        ports = tuple(
            (p.get("name"), p["port"], p.get("targetPort"), p.get("protocol", "TCP"))
            for p in spec.get("ports") or []
        )
        key = (address or "", (ports, tuple(sorted((spec.get("selector") or {}).items()))))
        if self._specs.get(uid) == key:
            return address
        await self.remove(uid)
        self._specs[uid] = key
        if address is None:
            return None
        namespace = str(service["metadata"].get("namespace", "default"))
        selector: Mapping[str, str] = spec.get("selector") or {}
        listeners = []
        for port in spec.get("ports") or []:
            if port.get("protocol", "TCP") != "TCP":
                continue

            async def handle(
                reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter,
                port: Mapping[str, Any] = port,
            ) -> None:
                await self._forward(reader, writer, namespace, selector, port)

            try:
                server = await asyncio.start_server(handle, address, int(port["port"]))
            except OSError as err:
                log.warning(
                    "service %s/%s port %s: %s",
                    namespace,
                    service["metadata"]["name"],
                    port["port"],
                    err,
                )
                continue
            listeners.append(_Listener(server, port))
        self._listeners[uid] = listeners
        log.info(
            "service %s/%s at %s ports %s",
            namespace,
            service["metadata"]["name"],
            address,
            [p["port"] for p in spec.get("ports") or []],
        )
        return address

    async def remove(self, uid: str) -> None:
        self._specs.pop(uid, None)
        for listener in self._listeners.pop(uid, []):
            listener.server.close()
            with contextlib.suppress(Exception):
                await listener.server.wait_closed()

    async def close(self) -> None:
        for uid in list(self._listeners):
            await self.remove(uid)

    def ready_endpoints(self, namespace: str, selector: Mapping[str, str]) -> list[Endpoint]:
        return [
            e
            for e in self.endpoints()
            if e.namespace == namespace and e.ready and e.pod_ip and selects(selector, e.labels)
        ]

    async def _forward(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        namespace: str,
        selector: Mapping[str, str],
        port: Mapping[str, Any],
    ) -> None:
        candidates = self.ready_endpoints(namespace, selector)
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        start = next(self._turn)
        for i in range(len(candidates)):
            endpoint = candidates[(start + i) % len(candidates)]
            target = target_port(port, endpoint)
            if target is None:
                continue
            with contextlib.suppress(OSError):
                upstream = await asyncio.open_connection(endpoint.pod_ip, target)
                break
        if upstream is None:
            writer.close()
            return
        up_reader, up_writer = upstream
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()
