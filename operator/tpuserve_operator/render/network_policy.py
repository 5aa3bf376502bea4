"""The NetworkPolicy that fences a server's engine pods: only its routers, its own engine
pods and Prometheus reach them.

An engine's HTTP port serves generation and its admin routes (``/flush_cache``,
``/abort_request``) to anyone who reaches it, and its KV-event ports carry the token ids of
cached prompts. So, for pods of the server's engines:

- its engine pods reach each other on every port (a multi-host slice's hosts talk to their
  leader: distributed init, the TorchTPU handshake);
- its router pods, and shared routers (pods labelled ``labels.shared_router_selector()``:
  one router in front of several servers, docs/router.md "Many models"), reach the HTTP,
  KV-event and replay ports;
- Prometheus (``--metrics-from``: NetworkPolicy peers; by default `DEFAULT_METRICS_FROM`:
  pods labelled ``app.kubernetes.io/name: prometheus`` in any namespace, and anything in
  ``gmp-system``, GKE Managed Prometheus's collectors) reaches the HTTP port, where SGLang
  serves ``/metrics``, and so do the operator's pods (``app.kubernetes.io/component:
  operator``, the chart's label), which read each Ready leader's cold start from
  ``/server_info`` once (`cold_starts`);
- nothing else. Kubelet probes come from the node, which network policies do not govern on
  common CNIs (GKE Dataplane V2, Calico).

``--network-policy none`` renders none (a cluster that fences engines its own way).
"""

from __future__ import annotations

import copy
from typing import Any

from tpuserve_operator import labels, launch_contract
from tpuserve_operator.render.context import Manifest, Server

# The operator's pods (the chart's labels), which read each Ready leader's cold start once.
OPERATOR_PEER: Manifest = {
    "namespaceSelector": {},
    "podSelector": {"matchLabels": {"app.kubernetes.io/component": "operator"}},
}


def _ports(*numbers: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": n} for n in numbers]


def engine_network_policy(server: Server) -> list[Manifest]:
    """The policy (none with ``--network-policy none``)."""
    config = server.config
    if config.network_policy == "none":
        return []
    engines = labels.engine_selector(server.name)
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
                        ),
                    },
                    {
                        "from": [
                            *(copy.deepcopy(dict(p)) for p in config.metrics_from),
                            OPERATOR_PEER,
                        ],
                        "ports": _ports(launch_contract.HTTP_PORT),
                    },
                ],
            },
        }
    ]
