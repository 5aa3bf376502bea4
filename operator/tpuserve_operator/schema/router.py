"""`spec.router`: the prefix-aware router in front of the replicas (policy, replicas, request
time, held requests at zero, API keys)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tpuserve_operator.schema.base import (
    DNS_SUBDOMAIN,
    MAX_REQUEST_SECONDS,
    SECRET_KEY,
    Schema,
    free_form,
    section,
)


class ApiKeysSecret(Schema):
    secret_name: str = Field(
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="secretName is the Secret holding the keys file, in the server's namespace.",
    )
    key: str = Field(
        default="keys.json",
        max_length=253,
        pattern=SECRET_KEY,
        description="key is the Secret's key holding the keys file (JSON). Default: keys.json.",
    )


class HoldSpec(Schema):
    max_requests: int = Field(
        default=256,
        ge=1,
        le=100000,
        description=(
            "maxRequests is how many requests per model the router holds while the server "
            "has no routable replica (scaled to zero, or every replica starting); they are "
            "sent in arrival order once one is Ready. Beyond it a request gets 503 with "
            "Retry-After at once (`tpuserve router --hold-max-requests`). Used when "
            "autoscaling.minReplicas is 0. Default: 256."
        ),
    )
    max_seconds: int = Field(
        default=600,
        ge=1,
        le=3600,
        description=(
            "maxSeconds is how long a request may be held; then it gets 503 with Retry-After "
            "(`--hold-max-seconds`). Set it above the time a slice takes to start from zero "
            "(weights, then compilation). Default: 600."
        ),
    )


class RouterSpec(Schema):
    enabled: bool = Field(
        default=True,
        description=(
            "enabled runs a tpuserve router Deployment in front of the replica leaders. When "
            "false the endpoint Service selects the leaders directly (no prefix awareness). "
            "Default: true."
        ),
    )
    policy: str | None = Field(
        default=None,
        max_length=63,
        pattern=r"^[a-z][a-z0-9_]*$",
        description=(
            "policy is the router's routing policy, as `tpuserve router --policy` spells it "
            "(for example precise, cost, cache_aware, least_load, power_of_two, round_robin, "
            "random). Default: the operator's --router-policy (chart value router.policy); "
            "when that is unset too, the router's own default policy (docs/router.md)."
        ),
    )
    replicas: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description=(
            "replicas of the router Deployment, spread over nodes, with a PodDisruptionBudget "
            "of one. Every replica publishes its routing decisions and request ends to the "
            "others (`tpuserve router --peer-port`, the container port named peers; found "
            "through the headless Service <name>-router-peers), so several replicas route as "
            "one would; a replica that starts takes a peer's KV-cache index first (the "
            "container port named peer-snapshot, the next one). Default: the operator's "
            "--router-replicas (chart value router.replicas)."
        ),
    )
    image: str | None = Field(
        default=None,
        max_length=512,
        description="image of the router container. Default: the operator's --router-image.",
    )
    kv_events: bool | None = Field(
        default=None,
        description=(
            "kvEvents makes the router rebuild each replica's prefix cache from the engines' "
            "KV events (ZMQ, the leaders' kv-events port) instead of learning it from routed "
            "requests: true subscribes (`tpuserve router --kv-events`), false never does "
            "(--no-kv-events). Default: unset, the router decides: it subscribes when its "
            "policy uses KV events (precise, cost)."
        ),
    )
    max_request_seconds: int = Field(
        default=600,
        ge=5,
        le=MAX_REQUEST_SECONDS,
        description=(
            "maxRequestSeconds is the longest a request (a whole stream included) may take. "
            "The router gives up on a request after it (`tpuserve router --request-timeout`), "
            "and engine pods get it to drain after SIGTERM: terminationGracePeriodSeconds is "
            "the preStop pause + maxRequestSeconds + 5 s, so a rollout, scale-down or "
            "maintenance move lets every request in flight finish; router pods get the same "
            "pause and grace and drain for as long (`tpuserve router --drain-seconds`). At "
            "most 3590, so the grace stays within GKE's 1-hour drain. A Spot "
            "preemption cuts the grace to what the node's shutdown leaves (GKE: about 30 s "
            "of notice). Default: 600."
        ),
    )
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP",
        description="serviceType of the endpoint Service. Default: ClusterIP.",
    )
    resources: dict[str, Any] | None = Field(
        default=None,
        json_schema_extra=free_form("object"),
        description=(
            "resources of the router container (core/v1 ResourceRequirements). Default: the "
            "operator's router resources (chart value router.resources)."
        ),
    )
    hold: HoldSpec = section(
        HoldSpec,
        "hold bounds the requests the router holds while the server is at zero replicas "
        "(autoscaling.minReplicas 0): per model, and in time.",
    )
    api_keys: ApiKeysSecret | None = Field(
        default=None,
        description=(
            "apiKeys makes clients authenticate: the router reads its API keys (tenants, "
            "priority classes, rate limits, admin role; docs/router.md, Authentication) from "
            "this Secret, mounted into its pods, and reloads them when the Secret changes. "
            "Rate limits are counted by each router replica on its own: behind router.replicas "
            "N a key may take up to N times its limits (set them to limit / N for a hard "
            "bound). Default: unset, no keys (anyone who reaches the router is served)."
        ),
    )
