"""GKE's node disruption signals (maintenance, preemption) and which replica groups they hit.

GKE marks a TPU VM that is about to go away on its Node object (docs/operator.md, "Maintenance
and spot", lists the sources and what is still [verify]):

- `cloud.google.com/scheduled-maintenance-time` label: upcoming host maintenance, its value
  the start as Unix epoch seconds. TPU VMs cannot live-migrate, and a host event on one VM
  of a multi-host slice interrupts the whole slice.
- `cloud.google.com/active-node-maintenance` label: the maintenance has started.
- `cloud.google.com/impending-node-termination:NoSchedule` taint: GKE is terminating the
  node gracefully (maintenance starting, or the 30 s Spot preemption notice).

A group is *affected* when one of its pods runs on a signalled node and was created before
the operator first saw the signal: a pod placed there afterwards was placed knowingly (no
other capacity), so replacing it again would only loop. A node that vanishes without notice
needs no signal: its pods disappear and the group is recreated like any missing group; the
operator only reports it (`vanished_recently`: a pod deleted just after its node counts).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tpuserve_operator.conditions import Reason

MAINTENANCE_TIME_LABEL = "cloud.google.com/scheduled-maintenance-time"
ACTIVE_MAINTENANCE_LABEL = "cloud.google.com/active-node-maintenance"
TERMINATION_TAINT = "cloud.google.com/impending-node-termination"
# The simulated pools and GKE alike: the value GKE puts on the active-maintenance label.
ACTIVE_MAINTENANCE_VALUE = "true"


@dataclass(frozen=True, slots=True)
class NodeSignal:
    """A disruption announced on one node."""

    node: str
    reason: Reason  # NodeMaintenanceScheduled or NodeTerminating
    message: str


def _epoch_text(value: str) -> str:
    if value.isdigit():
        start = datetime.datetime.fromtimestamp(int(value), datetime.UTC)
        return start.strftime("%Y-%m-%dT%H:%M:%SZ")
    return repr(value)


def signal_of(node: Mapping[str, Any]) -> NodeSignal | None:
    """The disruption a Node object announces, the most urgent first; None if none."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    node_labels = meta.get("labels") or {}
    taints = (node.get("spec") or {}).get("taints") or ()
    if any(t.get("key") == TERMINATION_TAINT for t in taints):
        return NodeSignal(
            name, Reason.NODE_TERMINATING, f"node {name} has the {TERMINATION_TAINT} taint"
        )
    if ACTIVE_MAINTENANCE_LABEL in node_labels:
        return NodeSignal(name, Reason.NODE_TERMINATING, f"node {name} is in maintenance")
    when = node_labels.get(MAINTENANCE_TIME_LABEL)
    if when is not None:
        return NodeSignal(
            name,
            Reason.NODE_MAINTENANCE_SCHEDULED,
            f"node {name} has maintenance scheduled at {_epoch_text(str(when))}",
        )
    return None


@dataclass(frozen=True, slots=True)
class SeenSignal:
    signal: NodeSignal
    since: datetime.datetime  # when the operator first saw it


# How long after a node's deletion its pods' deletions are blamed on it.
VANISHED_MEMORY = datetime.timedelta(minutes=2)


class NodeSignals:
    """The signals on every node, as the node watch last reported them, and the nodes
    deleted lately."""

    def __init__(self) -> None:
        self._nodes: dict[str, SeenSignal] = {}
        self._vanished: dict[str, datetime.datetime] = {}

    def update(self, node: Mapping[str, Any], now: datetime.datetime, deleted: bool) -> bool:
        """Take one node event; True if what the node signals changed."""
        name = str((node.get("metadata") or {}).get("name", ""))
        self._vanished = {n: t for n, t in self._vanished.items() if now - t < VANISHED_MEMORY}
        if deleted:
            self._vanished[name] = now
        signal = None if deleted else signal_of(node)
        previous = self._nodes.get(name)
        if signal is None:
            return self._nodes.pop(name, None) is not None
        if previous is not None and previous.signal == signal:
            return False
        since = previous.since if previous is not None else now
        self._nodes[name] = SeenSignal(signal, since)
        return True

    def get(self, node: str) -> SeenSignal | None:
        return self._nodes.get(node)

    def vanished_recently(self, node: str, now: datetime.datetime) -> bool:
        gone = self._vanished.get(node)
        return gone is not None and now - gone < VANISHED_MEMORY


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """What the decision needs of a pod: its group, node and creation time."""

    replica: int | None
    node: str
    created: datetime.datetime | None


def parse_time(value: str) -> datetime.datetime | None:
    """A Kubernetes timestamp (RFC 3339, `Z`), or None when empty or malformed."""
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def affected_groups(pods: Iterable[PodPlacement], signals: NodeSignals) -> dict[int, NodeSignal]:
    """Replica groups to move off signalled nodes, each with the (first) signal that hit it.
    A pod already terminating there still counts: its group is on its way off the node."""
    out: dict[int, NodeSignal] = {}
    for pod in pods:
        if pod.replica is None or not pod.node or pod.replica in out:
            continue
        seen = signals.get(pod.node)
        if seen is None:
            continue
        if pod.created is not None and pod.created >= seen.since:
            continue  # placed there after the signal: nowhere better to go
        out[pod.replica] = seen.signal
    return out


def by_urgency(displaced: Mapping[int, NodeSignal]) -> tuple[frozenset[int], frozenset[int]]:
    """(moving, urgent): groups facing scheduled maintenance, and groups on nodes being
    terminated now, as `rollout.plan` takes them."""
    urgent = frozenset(k for k, s in displaced.items() if s.reason == Reason.NODE_TERMINATING)
    return frozenset(displaced) - urgent, urgent
