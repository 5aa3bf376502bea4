"""A pod's status as the kubelet reports it, from the states of its containers.

The runner owns a running pod's status (kwok's pod stages are off when it runs), so every
write carries the whole of it: phase, conditions (PodScheduled kept from the scheduler),
addresses, start time and one status per container and init container.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]
OWN_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ContainerState:
    """One container as the runner sees it; `state` is Kubernetes' one-key state object."""

    name: str
    image: str
    state: JSON = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: JSON = field(default_factory=dict)
    restart_count: int = 0
    ready: bool = False
    started: bool = False
    container_id: str = ""
    will_restart: bool = True  # False once a terminated container stays terminated

    @property
    def running(self) -> bool:
        return "running" in self.state

    @property
    def terminated(self) -> JSON | None:
        value = self.state.get("terminated")
        return value if isinstance(value, dict) else None

    def waiting(self, reason: str, message: str = "") -> None:
        self.state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        self.ready = False

    def to_status(self) -> JSON:
        status: JSON = {
            "name": self.name,
            "image": self.image,
            "imageID": f"local://{self.image}",
            "state": self.state,
            "lastState": self.last_state,
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
        }
        if self.container_id:
            status["containerID"] = self.container_id
        return status


def phase(containers: Sequence[ContainerState], init_containers: Sequence[ContainerState]) -> str:
    """Pending, Running, Succeeded or Failed, by the kubelet's rules."""
    for init in init_containers:
        ended = init.terminated
        if ended is None or ended.get("exitCode") != 0:
            if ended is not None and not init.will_restart:
                return "Failed"
            return "Pending"
    if containers and all(c.terminated and not c.will_restart for c in containers):
        codes = [c.terminated.get("exitCode") for c in containers if c.terminated]
        return "Succeeded" if all(code == 0 for code in codes) else "Failed"
    if any(c.running or c.restart_count > 0 or c.terminated for c in containers):
        return "Running"
    return "Pending"


@dataclass
class Conditions:
    """The conditions the runner owns, with their transition times kept across writes."""

    values: dict[str, tuple[str, str, str]] = field(
        default_factory=dict
    )  # type -> status, time, reason

    def set(self, kind: str, status: bool, reason: str = "") -> None:
        value = "True" if status else "False"
        previous = self.values.get(kind)
        if previous is None or previous[0] != value or previous[2] != reason:
            time = previous[1] if previous is not None and previous[0] == value else now()
            self.values[kind] = (value, time, reason)

    def to_list(self) -> list[JSON]:
        out = []
        for kind in OWN_CONDITIONS:
            if kind in self.values:
                value, time, reason = self.values[kind]
                entry: JSON = {"type": kind, "status": value, "lastTransitionTime": time}
                if reason:
                    entry["reason"] = reason
                out.append(entry)
        return out


def pod_status(
    previous: Mapping[str, Any],
    *,
    pod_ip: str,
    host_ip: str,
    start_time: str,
    sandbox_ready: bool,
    containers: Sequence[ContainerState],
    init_containers: Sequence[ContainerState],
    conditions: Conditions,
) -> JSON:
    """The whole status to write. `previous` is the pod's current status (for PodScheduled)."""
    initialized = all((c.terminated or {}).get("exitCode") == 0 for c in init_containers)
    all_ready = bool(containers) and all(c.ready for c in containers)
    not_ready = [c.name for c in containers if not c.ready]
    conditions.set("PodReadyToStartContainers", sandbox_ready)
    conditions.set("Initialized", initialized, "" if initialized else "ContainersNotInitialized")
    conditions.set("ContainersReady", all_ready, "" if all_ready else "ContainersNotReady")
    conditions.set("Ready", all_ready, "" if all_ready else "ContainersNotReady")
    kept = [c for c in previous.get("conditions") or [] if c.get("type") not in OWN_CONDITIONS]
    status: JSON = {
        "phase": phase(containers, init_containers),
        "conditions": kept + conditions.to_list(),
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "containerStatuses": [c.to_status() for c in containers],
        "qosClass": previous.get("qosClass") or "BestEffort",
    }
    if not all_ready and not_ready:
        status["message"] = f"containers with unready status: [{' '.join(not_ready)}]"
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    if init_containers:
        status["initContainerStatuses"] = [c.to_status() for c in init_containers]
    return status
