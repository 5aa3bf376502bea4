"""The NetworkPolicies that fence a server's pods: only its routers, its own engine pods and
Prometheus reach its engines; only its own router pods reach its routers' peer port.

An engine's HTTP port serves generation and its admin routes (``/flush_cache``,
``/abort_request``) to anyone who reaches it, and its KV-event ports carry the token ids of
cached prompts. So, for pods of the server's engines:

- its engine pods reach each other on every port (a multi-host slice's hosts talk to their
  leader: distributed init, the TorchTPU handshake);
- its router pods, and shared routers (pods labelled ``labels.shared_router_selector()``:
  one router in front of several servers, docs/router.md "Many models"), reach the HTTP,
  KV-event and replay ports;
- Prometheus (``--metrics-from``: NetworkPolicy peers; by default `DEFAULT_METRICS_FROM`:
  pods labelled ``app.kubernetes.io/name: prometheus`` in the ``monitoring`` namespace (a
  label anyone can put on a pod of their own namespace is no credential), and anything in
  ``gmp-system``, GKE Managed Prometheus's collectors) reaches the HTTP port, where SGLang
  serves ``/metrics``, and so do the operator's pods (the chart's labels
  ``app.kubernetes.io/name: tpuserve`` and ``app.kubernetes.io/component: operator``, in
  the operator's own namespace only, `RenderConfig.operator_namespace`), which read each
  Ready leader's cold start from ``/server_info`` once (`cold_starts`); not admitted when
  the operator runs without a namespace (locally) or with ``--skip-cold-start-reports``;
- nothing else. Kubelet probes come from the node, which network policies do not govern on
  common CNIs (GKE Dataplane V2, Calico).

Router pods publish their routing decisions (prompts' block keys, the workers they chose)
on their peer port, and their KV-cache index on the port after it, so the router's policy
admits those two ports from the server's own router pods alone; its HTTP and metrics ports
stay open to anyone, as without a policy (clients, load balancers, Prometheus).

``--network-policy none`` renders none (a cluster that fences pods its own way).
"""

from __future__ import annotations

import copy
from typing import Any

from tpuserve_operator import labels, launch_contract
from tpuserve_operator.render.context import (
    ROUTER_METRICS_PORT,
    ROUTER_PEER_PORT,
    ROUTER_PEER_SNAPSHOT_PORT,
    ROUTER_PORT,
    Manifest,
    Server,
)
from tpuserve_operator.render.inference_pool import engine_ingress, router_ingress


def operator_peer(namespace: str) -> Manifest:
    """The operator's pods (the chart's labels) in its own namespace, which read each Ready
    leader's cold start once."""
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "podSelector": {
            "matchLabels": {
                labels.NAME: labels.PART_OF_VALUE,
                labels.COMPONENT: "operator",
            }
        },
    }


def _ports(*numbers: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": n} for n in numbers]


def _bootstrap_port(server: Server) -> list[int]:
    """A disaggregated server's prefill bootstrap port: the router asks it the DP size."""
    dis = server.valid.spec.disaggregation
    return [] if dis is None else [dis.bootstrap_port]


def engine_network_policy(server: Server) -> list[Manifest]:
    """The policy (none with ``--network-policy none``)."""
    config = server.config
    if config.network_policy == "none":
        return []
    engines = labels.engine_selector(server.name)
    operator_peers = [operator_peer(config.operator_namespace)] if config.operator_namespace else []
    return [
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": server.metadata(f"{server.name}-engines", labels.COMPONENT_MODEL_SERVER),
            "spec": {
                "podSelector": {"matchLabels": engines},
                "policyTypes": ["Ingress"],
                "ingress": [
                    {"from": [{"podSelector": {"matchLabels": engines}}]},
                    {
                        "from": [
                            {"podSelector": {"matchLabels": labels.router_selector(server.name)}},
                            {"podSelector": {"matchLabels": labels.shared_router_selector()}},
                        ],
                        "ports": _ports(
                            launch_contract.HTTP_PORT,
                            launch_contract.KV_EVENTS_PORT,
                            launch_contract.KV_REPLAY_PORT,
                            *_bootstrap_port(server),
                        ),
                    },
                    {
                        "from": [
                            *(copy.deepcopy(dict(p)) for p in config.metrics_from),
                            *operator_peers,
                        ],
                        "ports": _ports(launch_contract.HTTP_PORT),
                    },
                    *engine_ingress(server),
                ],
            },
        }
    ]


def router_network_policy(server: Server) -> list[Manifest]:
    """The router pods' policy (none with ``--network-policy none``)."""
    if server.config.network_policy == "none":
        return []
    routers = labels.router_selector(server.name)
    return [
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": server.metadata(server.router_name, labels.COMPONENT_ROUTER),
            "spec": {
                "podSelector": {"matchLabels": routers},
                "policyTypes": ["Ingress"],
                "ingress": [
                    {"ports": _ports(ROUTER_PORT, ROUTER_METRICS_PORT)},
                    {
                        "from": [{"podSelector": {"matchLabels": routers}}],
                        "ports": _ports(ROUTER_PEER_PORT, ROUTER_PEER_SNAPSHOT_PORT),
                    },
                    *router_ingress(server),
                ],
            },
        }
    ]
