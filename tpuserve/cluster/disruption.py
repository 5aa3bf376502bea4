"""GKE's node disruptions on the local cluster's fake nodes: maintenance and Spot preemption.

The labels and taint are the ones GKE sets (`tpuserve_operator.node_signals`, one source), so
the operator reacts here as on GKE. What GKE then does to the node is played by hand:

- maintenance: the `scheduled-maintenance-time` label first (start in Unix epoch seconds);
  at the start, the `active-node-maintenance` label and the `impending-node-termination`
  NoSchedule taint, and every pod on the node is deleted with its own grace period (GKE
  terminates TPU VMs' pods gracefully, they cannot live-migrate); after the maintenance the
  labels and taint go and the node takes pods again.
- preemption with notice: the taint, then the node's pods deleted with the grace the kubelet's
  graceful node shutdown leaves them (the notice minus the 5 s kept for system pods); when
  the notice ends the node is deleted and whatever is left of its pods is removed at once.
- preemption without notice: the node and its pods are gone at once (the pod runner kills
  the processes when their pod objects vanish).

A preempted node can come back (`restore`): a Spot node pool recreates its VMs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from sglang_tpu import topology
from tpuserve.cluster import kube
from tpuserve.cluster.cluster import Cluster, default_run_dir
from tpuserve.cluster.node_pools import FAKE_NODE_LABEL
from tpuserve_operator.node_signals import (
    ACTIVE_MAINTENANCE_LABEL,
    ACTIVE_MAINTENANCE_VALUE,
    MAINTENANCE_TIME_LABEL,
    TERMINATION_TAINT,
)

# GKE keeps the last 5 s of a Spot VM's 30 s notice for system pods (docs/operator.md).
SYSTEM_POD_SHARE_SECONDS = 5

Say = Callable[[str], None]


def fake_nodes(core: Any) -> list[Any]:
    return list(core.list_node(label_selector=f"{FAKE_NODE_LABEL}=true").items)


def select_nodes(core: Any, node: str | None, pool: str | None) -> list[str]:
    """The fake nodes named by --node or --pool; ValueError naming the flag, the value and
    what exists."""
    nodes = fake_nodes(core)
    if node is not None:
        names = [n.metadata.name for n in nodes]
        if node not in names:
            raise ValueError(f"--node: {node!r} is not a node of this cluster; nodes: {names}")
        return [node]
    pools = {n.metadata.labels.get(topology.NODE_POOL_LABEL) for n in nodes}
    chosen = [
        n.metadata.name for n in nodes if n.metadata.labels.get(topology.NODE_POOL_LABEL) == pool
    ]
    if not chosen:
        raise ValueError(
            f"--pool: {pool!r} is not a node pool of this cluster; pools: {sorted(map(str, pools))}"
        )
    return sorted(chosen)


def _set_labels(core: Any, name: str, values: dict[str, str | None]) -> None:
    core.patch_node(name, {"metadata": {"labels": values}})


def _set_termination_taint(core: Any, name: str, present: bool) -> None:
    taints = [
        t.to_dict() if hasattr(t, "to_dict") else dict(t)
        for t in core.read_node(name).spec.taints or []
    ]
    kept = [
        {k: v for k, v in t.items() if v is not None}
        for t in taints
        if t.get("key") != TERMINATION_TAINT
    ]
    if present:
        kept.append({"key": TERMINATION_TAINT, "value": "true", "effect": "NoSchedule"})
    core.patch_node(name, {"spec": {"taints": kept}})


def pods_on(core: Any, name: str) -> list[Any]:
    return list(core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items)


def delete_pods(core: Any, name: str, grace_seconds: int | None) -> list[str]:
    """Delete every pod bound to the node (None: each with its own grace period)."""
    deleted = []
    for pod in pods_on(core, name):
        if pod.metadata.deletion_timestamp is not None and grace_seconds is None:
            continue
        try:
            core.delete_namespaced_pod(
                pod.metadata.name, pod.metadata.namespace, grace_period_seconds=grace_seconds
            )
        except kube.api_exception() as err:
            if getattr(err, "status", None) != 404:
                raise
        deleted.append(f"{pod.metadata.namespace}/{pod.metadata.name}")
    return deleted


def schedule_maintenance(core: Any, names: Sequence[str], start_epoch: int) -> None:
    for name in names:
        _set_labels(core, name, {MAINTENANCE_TIME_LABEL: str(start_epoch)})


def start_maintenance(core: Any, names: Sequence[str]) -> list[str]:
    """Maintenance begins: label and taint the nodes, terminate their pods gracefully."""
    deleted: list[str] = []
    for name in names:
        _set_labels(core, name, {ACTIVE_MAINTENANCE_LABEL: ACTIVE_MAINTENANCE_VALUE})
        _set_termination_taint(core, name, True)
        deleted += delete_pods(core, name, None)
    return deleted


def end_maintenance(core: Any, names: Sequence[str]) -> None:
    for name in names:
        _set_labels(core, name, {MAINTENANCE_TIME_LABEL: None, ACTIVE_MAINTENANCE_LABEL: None})
        _set_termination_taint(core, name, False)


def saved_node(core: Any, api: Any, name: str) -> dict[str, Any]:
    """The node as it can be created again: metadata, taints and capacity, no signals."""
    body: dict[str, Any] = api.sanitize_for_serialization(core.read_node(name))
    meta = body["metadata"]
    labels = {
        k: v
        for k, v in (meta.get("labels") or {}).items()
        if k not in (MAINTENANCE_TIME_LABEL, ACTIVE_MAINTENANCE_LABEL)
    }
    taints = [
        t
        for t in (body.get("spec") or {}).get("taints") or []
        if t["key"] == topology.TPU_TAINT_KEY
    ]
    status = body.get("status") or {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": meta.get("annotations") or {},
        },
        "spec": {"taints": taints} if taints else {},
        "status": {"allocatable": status.get("allocatable"), "capacity": status.get("capacity")},
    }


def remove_node(core: Any, name: str) -> list[str]:
    """The VM is gone: delete the node and remove its pods at once (no grace)."""
    core.delete_node(name)
    return delete_pods(core, name, 0)


APISERVER_IDLE_SECONDS = 90
"""kube-apiserver closes a connection idle this long (k8s.io/apiserver v0.35
`pkg/server/secure_serving.go`: `IdleTimeout: 90 * time.Second`)."""


def pause(core: Any, seconds: float) -> None:
    """Sleep, then drop the client's pooled connections: one idle about as long as the
    apiserver's idle timeout may be closed by the server just as it is reused, and a write
    on it fails with `RemoteDisconnected` (a `maintenance --in 90` did, under load)."""
    time.sleep(seconds)
    if seconds >= APISERVER_IDLE_SECONDS / 2:
        core.api_client.rest_client.pool_manager.clear()


def preempt(core: Any, name: str, notice_seconds: int | None, say: Say) -> None:
    """Preempt a node: with notice, taint and drain within it first; then it is gone."""
    if notice_seconds:
        _set_termination_taint(core, name, True)
        grace = max(notice_seconds - SYSTEM_POD_SHARE_SECONDS, 0)
        say(f"node {name}: preemption notice ({notice_seconds} s), taint {TERMINATION_TAINT}")
        for pod in delete_pods(core, name, grace):
            say(f"node {name}: pod {pod} terminating (grace {grace} s)")
        pause(core, notice_seconds)
    for pod in remove_node(core, name):
        say(f"node {name}: pod {pod} gone with its node")
    say(f"node {name}: deleted")


def restore(core: Any, body: dict[str, Any]) -> None:
    core.create_node(body)


# ---- shared by the `tpuserve cluster maintenance|preempt` commands -------------------------


def add_run_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=default_run_dir(),
        help="The run directory given to `cluster up` (default: %(default)s).",
    )


def say(line: str) -> None:
    """One timeline line: UTC time with milliseconds, then what happened."""
    now = datetime.datetime.now(datetime.UTC).strftime("%H:%M:%S.%f")[:-3]
    print(f"{now} {line}", flush=True)


def nodes_or_exit(core: Any, node: str | None, pool: str | None, command: str) -> list[str]:
    """`select_nodes`, or SystemExit(2) with its message (a flag naming nothing)."""
    try:
        return select_nodes(core, node, pool)
    except ValueError as err:
        print(f"tpuserve cluster {command}: {err}", file=sys.stderr)
        raise SystemExit(2) from None


@contextlib.contextmanager
def core_api(run_dir: Path, command: str) -> Iterator[Any]:
    """(cluster, API client, CoreV1Api) of the cluster running from run_dir; SystemExit(1)
    with a message if none runs there."""
    try:
        cluster = Cluster.attach(run_dir)
    except FileNotFoundError as err:
        print(f"tpuserve cluster {command}: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    with contextlib.closing(cluster.api_client()) as api:
        yield cluster, api, kube.client().CoreV1Api(api)
