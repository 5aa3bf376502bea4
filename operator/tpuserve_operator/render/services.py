"""The Services of a server: the endpoint clients use, the leaders' Service, and the one its
router replicas find each other by."""

from __future__ import annotations

from tpuserve_operator import labels, launch_contract
from tpuserve_operator.render.context import (
    ROUTER_METRICS_PORT,
    ROUTER_PEER_PORT,
    ROUTER_PEER_PORT_NAME,
    ROUTER_PEER_SNAPSHOT_PORT,
    ROUTER_PEER_SNAPSHOT_PORT_NAME,
    ROUTER_PORT,
    Manifest,
    Server,
)


def endpoint_service(server: Server) -> Manifest:
    """`<name>`: the OpenAI-compatible endpoint; the router's pods, or the leaders directly
    when the router is disabled."""
    spec = server.valid.spec
    ports = [{"name": "http", "port": ROUTER_PORT, "targetPort": "http", "protocol": "TCP"}]
    if spec.router.enabled:
        selector = labels.router_selector(server.name)
        component = labels.COMPONENT_ROUTER
        ports.append(
            {
                "name": "metrics",
                "port": ROUTER_METRICS_PORT,
                "targetPort": "metrics",
                "protocol": "TCP",
            }
        )
    else:
        selector = labels.leader_selector(server.name)
        component = labels.COMPONENT_MODEL_SERVER
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": server.metadata(server.endpoint_service_name, component),
        "spec": {"type": spec.router.service_type, "selector": selector, "ports": ports},
    }


def leaders_service(server: Server) -> Manifest:
    """`<name>-leaders`: headless, ready leaders only; its EndpointSlices list routable workers."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": server.metadata(server.leaders_service_name, labels.COMPONENT_MODEL_SERVER),
        "spec": {
            "clusterIP": "None",
            "selector": labels.leader_selector(server.name),
            "ports": [
                {"name": "http", "port": launch_contract.HTTP_PORT, "targetPort": "http"},
                {
                    "name": "kv-events",
                    "port": launch_contract.KV_EVENTS_PORT,
                    "targetPort": "kv-events",
                },
                {
                    "name": "kv-replay",
                    "port": launch_contract.KV_REPLAY_PORT,
                    "targetPort": "kv-replay",
                },
            ],
        },
    }


def router_peers_service(server: Server) -> Manifest:
    """`<name>-router-peers`: headless, every router pod of the server, ready or not, so a
    starting replica is in the DNS answer its peers resolve (`--peers-from-dns`) and hears
    their decisions before it takes traffic."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": server.metadata(server.router_peers_service_name, labels.COMPONENT_ROUTER),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": labels.router_selector(server.name),
            "ports": [
                {
                    "name": ROUTER_PEER_PORT_NAME,
                    "port": ROUTER_PEER_PORT,
                    "targetPort": ROUTER_PEER_PORT_NAME,
                    "protocol": "TCP",
                },
                {
                    "name": ROUTER_PEER_SNAPSHOT_PORT_NAME,
                    "port": ROUTER_PEER_SNAPSHOT_PORT,
                    "targetPort": ROUTER_PEER_SNAPSHOT_PORT_NAME,
                    "protocol": "TCP",
                },
            ],
        },
    }
