"""Fake node pools on a running control plane: create a pool's Nodes, delete them, wait for Ready.

`node_pools` says what a pool's Nodes look like; this module puts them into (and takes them
out of) the API server. kwok then keeps the created Nodes Ready.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from sglang_tpu import topology
from tpuserve.cluster import kube
from tpuserve.cluster.node_pools import FAKE_NODE_LABEL, NodePool
from tpuserve.cluster.process import ManagedProcess, wait_for

# Taints the node-lifecycle controller puts on nodes that are not (yet) Ready.
NODE_HEALTH_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")

ApiFactory = Callable[[], Any]
"""Returns a new `kubernetes.client.ApiClient`; the caller closes it."""


def create_pool(new_api: ApiFactory, pool: NodePool) -> list[str]:
    """Create the pool's Nodes; returns their names. ValueError if the pool exists."""
    with contextlib.closing(new_api()) as api:
        core = kube.client().CoreV1Api(api)
        existing = core.list_node(label_selector=f"{topology.NODE_POOL_LABEL}={pool.name}")
        if existing.items:
            raise ValueError(f"pool: a node pool named {pool.name!r} already exists")
        for manifest in pool.node_manifests():
            core.create_node(manifest)
    return pool.node_names()


def delete_pool(new_api: ApiFactory, name: str, *, wait_timeout_seconds: float | None) -> list[str]:
    """Delete the pool's Nodes; returns their names. Pods bound to them are orphaned and
    garbage-collected by kube-controller-manager, as when GKE deletes a node pool.

    With `wait_timeout_seconds`, waits until the Nodes are gone.
    """
    selector = f"{topology.NODE_POOL_LABEL}={name},{FAKE_NODE_LABEL}=true"
    with contextlib.closing(new_api()) as api:
        core = kube.client().CoreV1Api(api)
        nodes = [n.metadata.name for n in core.list_node(label_selector=selector).items]
        if not nodes:
            raise ValueError(f"pool: no node pool named {name!r}")
        for node in nodes:
            core.delete_node(node)
        if wait_timeout_seconds is not None:
            wait_for(
                f"nodes of pool {name} to be deleted",
                lambda: not core.list_node(label_selector=selector).items,
                wait_timeout_seconds,
            )
    return nodes


def wait_ready(
    new_api: ApiFactory,
    names: Sequence[str],
    timeout_seconds: float,
    kwok: ManagedProcess | None = None,
) -> None:
    """Wait until the nodes are Ready and free of the not-ready taint (pods can land);
    StartupError at once if `kwok`, which makes them Ready, exits."""
    wanted = set(names)

    def all_ready() -> bool:
        with contextlib.closing(new_api()) as api:
            nodes = kube.client().CoreV1Api(api).list_node(label_selector=f"{FAKE_NODE_LABEL}=true")
        ready = {n.metadata.name for n in nodes.items if schedulable(n)}
        return wanted <= ready

    wait_for(f"{len(wanted)} nodes Ready", all_ready, timeout_seconds, kwok)


def schedulable(node: Any) -> bool:
    """Ready, and the node-lifecycle controller has lifted its not-ready taint."""
    ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
    return ready and not any(t.key in NODE_HEALTH_TAINTS for t in node.spec.taints or [])
