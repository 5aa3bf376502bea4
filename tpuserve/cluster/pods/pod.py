"""One pod the runner runs: address, volumes, init containers, containers, status, deletion.

A pod goes through what a kubelet does for it: it gets an address of its own and its volumes,
its init containers run one after the other to completion, then its containers run side by
side (container.py). Every change is written to the pod's status (coalesced, whole status).
When the pod is deleted (a `deletionTimestamp`), every container gets `preStop`, SIGTERM and,
after the grace period, SIGKILL, and the runner then removes the pod object, as the kubelet
does; when the object is gone already, the processes are killed at once.

Files: `PODS_DIR/<namespace>/<pod>/<container>.log` (kept across restarts and pod
incarnations) and `PODS_DIR/<namespace>/<pod>/<uid>/` (volumes, ServiceAccount kubeconfig,
`termination/<container>`, each container's termination message; removed with the pod).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from sglang_tpu.tasks import cancel_and_wait
from tpuserve.cluster.kwok import NODE_IP
from tpuserve.cluster.pods import dns, images, volumes
from tpuserve.cluster.pods.container import TERMINATION_MESSAGE_PATH, Container
from tpuserve.cluster.pods.container_spec import (
    ContainerConfigError,
    Lookup,
    PodContext,
    ProcessSpec,
    pod_link,
    process_spec,
)
from tpuserve.cluster.pods.status import Conditions, now, pod_status

log = logging.getLogger(__name__)

STATUS_DEBOUNCE_SECONDS = 0.05
VOLUME_RETRY_SECONDS = 5.0


class PodHost(Protocol):
    """What a pod needs from the runner."""

    @property
    def reader(self) -> volumes.ClusterReader: ...

    @property
    def pods_dir(self) -> Path: ...

    @property
    def claims_dir(self) -> Path: ...

    @property
    def base_env(self) -> Mapping[str, str]: ...

    @property
    def backoff_base_seconds(self) -> float: ...

    @property
    def hosts_file(self) -> Path | None:
        """The pods' names and addresses (dns.py), or None where the host keeps none."""

    def lookup(self, kind: str, namespace: str, name: str) -> Mapping[str, str] | None: ...

    def allocate_address(self) -> str: ...

    def release_address(self, address: str) -> None: ...

    async def write_status(self, pod: Mapping[str, Any], status: dict[str, Any]) -> bool:
        """False when the pod no longer exists."""

    def event(self, pod: Mapping[str, Any], kind: str, reason: str, message: str) -> None: ...

    async def delete_pod(self, pod: Mapping[str, Any]) -> None: ...

    def pod_changed(self, supervisor: PodSupervisor) -> None:
        """A pod's address or readiness changed (the Service proxy listens)."""


class _ImageError(ContainerConfigError):
    reason = "ErrImagePull"


class PodSupervisor:
    def __init__(self, host: PodHost, pod: Mapping[str, Any]) -> None:
        self.host = host
        self.pod: Mapping[str, Any] = pod
        metadata = pod["metadata"]
        self.namespace = str(metadata.get("namespace", "default"))
        self.name = str(metadata["name"])
        self.uid = str(metadata["uid"])
        self.pod_ip = ""
        self.start_time = now()
        self.sandbox_ready = False
        self.conditions = Conditions()
        self.pod_dir = host.pods_dir / self.namespace / self.name
        self.work_dir = self.pod_dir / self.uid
        grace = float(pod["spec"].get("terminationGracePeriodSeconds", 30))
        restart_policy = str(pod["spec"].get("restartPolicy", "Always"))
        self.init_containers = [
            self._container(c, "OnFailure" if restart_policy != "Never" else "Never", grace, True)
            for c in pod["spec"].get("initContainers") or []
        ]
        self.containers = [
            self._container(c, restart_policy, grace, False) for c in pod["spec"]["containers"]
        ]
        self._dirty = asyncio.Event()
        self._terminating = asyncio.Event()
        self._grace_seconds = grace
        self._gone = False
        self._volumes: volumes.PodVolumes | None = None

    def _container(
        self, spec: Mapping[str, Any], restart_policy: str, grace: float, init: bool
    ) -> Container:
        name = str(spec["name"])

        async def build() -> ProcessSpec:
            return await asyncio.to_thread(self._process_spec, spec)

        def event(kind: str, reason: str, message: str) -> None:
            self.host.event(self.pod, kind, reason, message)

        return Container(
            spec,
            restart_policy,
            "",
            self.pod_dir / f"{name}.log",
            build,
            self.mark_changed,
            event,
            self.host.backoff_base_seconds,
            grace,
            init,
            termination_file=self._termination_file(name),
        )

    def _termination_file(self, container: str) -> Path:
        """Where a container's termination message lands (its terminationMessagePath)."""
        return self.work_dir / "termination" / container

    # ---- what others read ----------------------------------------------------------------

    @property
    def labels(self) -> Mapping[str, str]:
        labels: Mapping[str, str] = self.pod["metadata"].get("labels") or {}
        return labels

    @property
    def ready(self) -> bool:
        return (
            not self._terminating.is_set()
            and bool(self.containers)
            and all(c.state.ready for c in self.containers)
        )

    def container_port(self, name: str) -> int | None:
        for container in self.containers:
            for port in container.spec.get("ports") or []:
                if port.get("name") == name:
                    return int(port["containerPort"])
        return None

    # ---- running -------------------------------------------------------------------------

    def update(self, pod: Mapping[str, Any]) -> None:
        """The latest object from the watch (labels, annotations, deletion)."""
        self.pod = pod
        deletion = pod["metadata"].get("deletionTimestamp")
        if deletion and not self._terminating.is_set():
            grace = pod["metadata"].get("deletionGracePeriodSeconds")
            self.terminate(float(grace) if grace is not None else self._grace_seconds)

    def mark_changed(self) -> None:
        self._dirty.set()
        self.host.pod_changed(self)

    def _process_spec(self, spec: Mapping[str, Any]) -> ProcessSpec:
        """Runs in a thread: reads ConfigMaps and Secrets."""
        assert self._volumes is not None
        try:
            image = images.local_image(str(spec.get("image", "")))
        except images.UnknownImage as err:
            raise _ImageError(str(err)) from None
        context = PodContext(
            pod=self.pod,
            pod_ip=self.pod_ip,
            host_ip=NODE_IP,
            pod_dir=self.work_dir,
            volumes=self._volumes.directories,
            kubeconfig=self._volumes.kubeconfig,
            base_env=self.host.base_env,
            hosts_file=self.host.hosts_file if dns.needs_hosts(self.pod) else None,
        )
        lookup: Lookup = self.host.lookup
        message_path = str(spec.get("terminationMessagePath") or TERMINATION_MESSAGE_PATH)
        files = [(message_path, self._termination_file(str(spec["name"])))]
        return process_spec(
            context, volumes.service_account_mount(spec, self._volumes), image, lookup, files
        )

    async def run(self) -> None:
        writer = asyncio.create_task(self._write_status_loop())
        try:
            await self._run()
        finally:
            for container in self.init_containers + self.containers:
                container.kill()
            if self._terminating.is_set() and not self._gone:
                self._dirty.set()
                await asyncio.sleep(STATUS_DEBOUNCE_SECONDS * 2)
                with contextlib.suppress(Exception):
                    await self.host.delete_pod(self.pod)
            await cancel_and_wait([writer])
            if self.pod_ip:
                self.host.release_address(self.pod_ip)
            shutil.rmtree(self.work_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                pod_link(self.work_dir).unlink(missing_ok=True)

    async def _run(self) -> None:
        self.pod_ip = self.host.allocate_address()
        for container in self.init_containers + self.containers:
            container.pod_ip = self.pod_ip
        self.mark_changed()
        while self._volumes is None and not self._terminating.is_set():
            try:
                self._volumes = await asyncio.to_thread(
                    volumes.prepare,
                    self.host.reader,
                    self.pod,
                    self.work_dir,
                    self.host.claims_dir,
                    self.pod_ip,
                    NODE_IP,
                )
            except Exception as err:  # ConfigMap missing, TokenRequest refused, ...
                for container in self.init_containers + self.containers:
                    container.state.waiting("ContainerCreating", f"volumes: {err}")
                self.mark_changed()
                self.host.event(self.pod, "Warning", "FailedMount", str(err))
                await self._wait_terminating(VOLUME_RETRY_SECONDS)
        if self._terminating.is_set():
            return
        self.sandbox_ready = True
        for init in self.init_containers:
            self.mark_changed()
            runner = asyncio.create_task(init.run())
            if not await self._until(runner, [init]) or runner.result() != 0:
                return await self._stay_until_deleted()
        self.mark_changed()
        tasks = [asyncio.create_task(c.run()) for c in self.containers]
        together = asyncio.gather(*tasks, return_exceptions=True)
        finished = await self._until(together, self.containers)
        if finished:
            await self._stay_until_deleted()

    async def _until(self, work: asyncio.Future[Any], containers: list[Container]) -> bool:
        """Await `work`; on deletion, stop `containers` gracefully first. True if it finished."""
        stop = asyncio.create_task(self._terminating.wait())
        await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            stop.cancel()
            return True
        await asyncio.gather(*(c.stop(self._grace_seconds) for c in containers))
        try:
            await asyncio.wait_for(asyncio.shield(work), self._grace_seconds + 5.0)
        except (TimeoutError, Exception):
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await work
        return False

    async def _stay_until_deleted(self) -> None:
        """A pod whose containers ended for good keeps its status until it is deleted."""
        self.mark_changed()
        await self._terminating.wait()

    async def _wait_terminating(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._terminating.wait(), seconds)

    def terminate(self, grace_seconds: float) -> None:
        """Graceful stop (the pod object has a deletionTimestamp)."""
        self._grace_seconds = grace_seconds
        self._terminating.set()
        self.mark_changed()

    def gone(self) -> None:
        """The pod object no longer exists: kill at once, write nothing more."""
        self._gone = True
        self._terminating.set()
        for container in self.init_containers + self.containers:
            container.kill()

    # ---- status --------------------------------------------------------------------------

    async def _write_status_loop(self) -> None:
        while not self._gone:
            await self._dirty.wait()
            await asyncio.sleep(STATUS_DEBOUNCE_SECONDS)
            self._dirty.clear()
            status = pod_status(
                self.pod.get("status") or {},
                pod_ip=self.pod_ip,
                host_ip=NODE_IP,
                start_time=self.start_time,
                sandbox_ready=self.sandbox_ready,
                containers=[c.state for c in self.containers],
                init_containers=[c.state for c in self.init_containers],
                conditions=self.conditions,
            )
            try:
                if not await self.host.write_status(self.pod, status):
                    self.gone()
            except Exception as err:  # the API server restarting, ...: the next change retries
                log.warning("pod %s/%s: status not written: %s", self.namespace, self.name, err)
                await asyncio.sleep(1.0)
                self._dirty.set()
