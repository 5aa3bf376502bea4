"""The pod runner: a kubelet and kube-proxy for every fake node of the local cluster.

`python -m tpuserve.cluster.pods` (started by `Cluster` when it runs pods, as the component
`pod-runner`) watches every pod bound to a node and runs it as local processes
(`pod.PodSupervisor`), and every Service, which it serves at a loopback address
(`services.ServiceProxy`). kwok keeps the nodes Ready; its pod stages are off, so the runner
alone writes pod status. On SIGTERM it stops every pod's containers (SIGTERM, then SIGKILL
after `--stop-grace-seconds`) and exits; the pod objects stay, as a node's pods stay when its
kubelet stops. A pod process also dies with the runner if the runner is killed.

API calls go through the official client in worker threads; watches re-list on 410 Gone and
after a dropped connection.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tpuserve.cluster import kube, kubeconfig
from tpuserve.cluster.components import POD_LOGS_DIR as PODS_DIR
from tpuserve.cluster.components import POD_RUNNER_READY_FILE as READY_FILE
from tpuserve.cluster.pods.addresses import DEFAULT_NETWORK, Network, PodAddresses
from tpuserve.cluster.pods.dns import HOSTS_FILE, HostsFile
from tpuserve.cluster.pods.pod import PodSupervisor
from tpuserve.cluster.pods.services import LOCAL_ADDRESS_ANNOTATION, ServiceProxy
from tpuserve.cluster.pods.status import now
from tpuserve.cluster.pods.volumes import TokenRequest

log = logging.getLogger(__name__)

CLAIMS_DIR = "volumes"
DEFAULT_BACKOFF_SECONDS = 10.0
DEFAULT_STOP_GRACE_SECONDS = 10.0
WATCH_TIMEOUT_SECONDS = 300
RETRY_SECONDS = 1.0
# Passed on to every pod process, so a pod runs the code the runner runs.
INHERITED_ENV = ("PYTHONPATH", "TZ", "LANG")
TERMINAL_PHASES = ("Succeeded", "Failed")


class _Reader:
    """ConfigMaps, Secrets and tokens, read with the admin's client (a kubelet's node access)."""

    def __init__(self, api: Any, server: str, ca_cert: Path) -> None:
        self.core = kube.client().CoreV1Api(api)
        self.server = server
        self.ca_cert = ca_cert

    def data(self, kind: str, namespace: str, name: str) -> Mapping[str, str] | None:
        try:
            if kind == "ConfigMap":
                found = self.core.read_namespaced_config_map(name, namespace)
                return dict(found.data or {})
            secret = self.core.read_namespaced_secret(name, namespace)
        except kube.api_exception() as err:
            if getattr(err, "status", None) == 404:
                return None
            raise
        return {
            k: base64.b64decode(v).decode(errors="replace") for k, v in (secret.data or {}).items()
        }

    def token(self, request: TokenRequest) -> str:
        spec: dict[str, Any] = {
            "expirationSeconds": request.expiration_seconds,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": request.pod_name,
                "uid": request.pod_uid,
            },
        }
        if request.audiences:
            spec["audiences"] = list(request.audiences)
        response = self.core.create_namespaced_service_account_token(
            request.service_account, request.namespace, {"spec": spec}
        )
        return str(response.status.token)


class PodRunner:
    def __init__(
        self,
        kubeconfig_path: Path,
        run_dir: Path,
        server: str,
        ca_cert: Path,
        *,
        backoff_base_seconds: float = DEFAULT_BACKOFF_SECONDS,
        stop_grace_seconds: float = DEFAULT_STOP_GRACE_SECONDS,
        network: Network = DEFAULT_NETWORK,
    ) -> None:
        self.api = kubeconfig.api_client(kubeconfig_path)
        self.core = kube.client().CoreV1Api(self.api)
        self.reader = _Reader(self.api, server, ca_cert)
        self.run_dir = run_dir
        self.pods_dir = run_dir / PODS_DIR
        self.claims_dir = run_dir / CLAIMS_DIR
        self.base_env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
        self.backoff_base_seconds = backoff_base_seconds
        self.stop_grace_seconds = stop_grace_seconds
        self.addresses = PodAddresses(network.pods)
        self.supervisors: dict[str, PodSupervisor] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.dns = HostsFile(run_dir / HOSTS_FILE)
        self.proxy = ServiceProxy(lambda: list(self.supervisors.values()))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: asyncio.Queue[tuple[str, str, dict[str, Any]]] = asyncio.Queue()
        self._stop = threading.Event()
        self._listed: set[str] = set()

    # ---- PodHost -------------------------------------------------------------------------

    def lookup(self, kind: str, namespace: str, name: str) -> Mapping[str, str] | None:
        return self.reader.data(kind, namespace, name)

    def allocate_address(self) -> str:
        return self.addresses.allocate()

    def release_address(self, address: str) -> None:
        self.addresses.release(address)

    async def write_status(self, pod: Mapping[str, Any], status: dict[str, Any]) -> bool:
        metadata = pod["metadata"]
        body = {"metadata": {"uid": metadata["uid"]}, "status": status}
        try:
            await asyncio.to_thread(
                self.core.patch_namespaced_pod_status,
                metadata["name"],
                metadata.get("namespace", "default"),
                body,
                _content_type="application/merge-patch+json",
            )
        except kube.api_exception() as err:
            if getattr(err, "status", None) in (404, 409, 422):
                return False
            raise
        return True

    def event(self, pod: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        metadata = pod["metadata"]
        namespace = metadata.get("namespace", "default")
        body = {
            "metadata": {"generateName": f"{metadata['name']}.", "namespace": namespace},
            "involvedObject": {
                "kind": "Pod",
                "apiVersion": "v1",
                "name": metadata["name"],
                "namespace": namespace,
                "uid": metadata["uid"],
            },
            "type": kind,
            "reason": reason,
            "message": message,
            "source": {"component": "tpuserve-pod-runner", "host": pod["spec"].get("nodeName")},
            "firstTimestamp": now(),
            "lastTimestamp": now(),
            "count": 1,
        }

        def create() -> None:
            with contextlib.suppress(Exception):
                self.core.create_namespaced_event(namespace, body)

        threading.Thread(target=create, daemon=True).start()

    async def delete_pod(self, pod: Mapping[str, Any]) -> None:
        metadata = pod["metadata"]
        with contextlib.suppress(kube.api_exception()):
            await asyncio.to_thread(
                self.core.delete_namespaced_pod,
                metadata["name"],
                metadata.get("namespace", "default"),
                grace_period_seconds=0,
                body={"preconditions": {"uid": metadata["uid"]}, "gracePeriodSeconds": 0},
            )

    @property
    def hosts_file(self) -> Path:
        return self.dns.path

    def pod_changed(self, supervisor: PodSupervisor) -> None:
        """Pods' names follow their addresses (the proxy reads pods at connect time)."""
        self._refresh_names()

    def _refresh_names(self) -> None:
        self.dns.refresh((s.pod, s.pod_ip) for s in self.supervisors.values() if s.pod_ip)

    # ---- watches -------------------------------------------------------------------------

    def _watch(self, kind: str, list_call: Callable[..., Any], **filters: Any) -> None:
        """List, then watch, forever (in a thread); every object goes to the event queue."""
        assert self._loop is not None
        sanitize = self.api.sanitize_for_serialization
        while not self._stop.is_set():
            try:
                listing = list_call(**filters)
                version = listing.metadata.resource_version
                names = set()
                for item in listing.items:
                    obj = sanitize(item)
                    names.add(obj["metadata"]["uid"])
                    self._put(kind, "LISTED", obj)
                self._put(kind, "SYNCED", {"uids": sorted(names)})
                stream = (
                    kube.watch()
                    .Watch()
                    .stream(
                        list_call,
                        resource_version=version,
                        timeout_seconds=WATCH_TIMEOUT_SECONDS,
                        **filters,
                    )
                )
                for event in stream:
                    if self._stop.is_set():
                        return
                    self._put(kind, str(event["type"]), sanitize(event["object"]))
            except Exception as err:  # 410 Gone, a dropped connection: list again
                if not self._stop.is_set():
                    log.info("%s watch: %s; listing again", kind, err)
                    time.sleep(RETRY_SECONDS)

    def _put(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._events.put_nowait, (kind, event, obj))

    # ---- dispatch ------------------------------------------------------------------------

    async def _on_pod(self, event: str, pod: dict[str, Any]) -> None:
        if event == "SYNCED":
            live = set(pod["uids"])
            for uid, vanished in list(self.supervisors.items()):
                if uid not in live:
                    vanished.gone()
            self._listed.add("pods")
            return
        if event == "BOOKMARK" or event == "ERROR":
            return
        uid = pod["metadata"]["uid"]
        supervisor = self.supervisors.get(uid)
        if event == "DELETED":
            if supervisor is not None:
                supervisor.gone()
            return
        if supervisor is not None:
            supervisor.update(pod)
            return
        if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            return
        if pod["metadata"].get("deletionTimestamp"):
            await self.delete_pod(pod)  # never started here: nothing to stop
            return
        if uid in self.tasks:  # finishing: its task removes it
            return
        started = PodSupervisor(self, pod)
        self.supervisors[uid] = started
        task = asyncio.create_task(started.run())
        self.tasks[uid] = task
        task.add_done_callback(lambda _: self._forget(uid))
        log.info("pod %s/%s: starting", started.namespace, started.name)

    def _forget(self, uid: str) -> None:
        self.supervisors.pop(uid, None)
        self._refresh_names()
        task = self.tasks.pop(uid, None)
        if task is not None and not task.cancelled() and task.exception() is not None:
            log.error("pod %s failed in the runner", uid, exc_info=task.exception())

    async def _on_service(self, event: str, service: dict[str, Any]) -> None:
        if event == "SYNCED":
            self._listed.add("services")
            return
        if event in ("BOOKMARK", "ERROR"):
            return
        uid = str(service["metadata"]["uid"])
        if event == "DELETED":
            await self.proxy.remove(uid)
            return
        address = await self.proxy.update(service)
        annotations = service["metadata"].get("annotations") or {}
        if address is not None and annotations.get(LOCAL_ADDRESS_ANNOTATION) != address:
            patch = {"metadata": {"annotations": {LOCAL_ADDRESS_ANNOTATION: address}}}
            with contextlib.suppress(kube.api_exception()):
                await asyncio.to_thread(
                    self.core.patch_namespaced_service,
                    service["metadata"]["name"],
                    service["metadata"].get("namespace", "default"),
                    patch,
                )

    # ---- main ----------------------------------------------------------------------------

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, stop.set)
        watches = [
            threading.Thread(
                target=self._watch,
                args=("pod", self.core.list_pod_for_all_namespaces),
                kwargs={"field_selector": "spec.nodeName!="},
                daemon=True,
            ),
            threading.Thread(
                target=self._watch,
                args=("service", self.core.list_service_for_all_namespaces),
                daemon=True,
            ),
        ]
        for thread in watches:
            thread.start()
        ready_file = self.run_dir / READY_FILE
        stopping = asyncio.create_task(stop.wait())
        while not stop.is_set():
            getting = asyncio.create_task(self._events.get())
            await asyncio.wait({getting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not getting.done():
                getting.cancel()
                break
            kind, event, obj = getting.result()
            try:
                if kind == "pod":
                    await self._on_pod(event, obj)
                else:
                    await self._on_service(event, obj)
            except Exception:
                log.exception("%s %s event not handled", kind, event)
            if not ready_file.exists() and self._listed >= {"pods", "services"}:
                ready_file.write_text(f"{os.getpid()}\n")
                log.info("pod runner ready")
        log.info("stopping %d pods", len(self.supervisors))
        self._stop.set()
        ready_file.unlink(missing_ok=True)
        await self._shutdown()

    async def _shutdown(self) -> None:
        """Stop every container (SIGTERM, SIGKILL after the grace); leave the pod objects."""
        await self.proxy.close()
        containers = [
            c for s in self.supervisors.values() for c in s.init_containers + s.containers
        ]
        for supervisor in self.supervisors.values():
            supervisor._gone = True  # write no more status: the node is going away
        await asyncio.gather(
            *(c.stop(self.stop_grace_seconds) for c in containers), return_exceptions=True
        )
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpuserve.cluster.pods", description=__doc__)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--ca-cert", type=Path, required=True)
    parser.add_argument("--backoff-seconds", type=float, default=DEFAULT_BACKOFF_SECONDS)
    parser.add_argument("--stop-grace-seconds", type=float, default=DEFAULT_STOP_GRACE_SECONDS)
    parser.add_argument("--network", type=int, default=0, help="the cluster's network index")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    runner = PodRunner(
        args.kubeconfig,
        args.run_dir.resolve(),
        args.server,
        args.ca_cert,
        backoff_base_seconds=args.backoff_seconds,
        stop_grace_seconds=args.stop_grace_seconds,
        network=Network(args.network),
    )
    asyncio.run(runner.run())
    return 0
