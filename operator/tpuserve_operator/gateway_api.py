"""The TPUGateway API: one router in front of many TPUModelServers of a namespace.

The schema source of the `TPUGateway` resource, as `api.py` is the TPUModelServer's: its CRD
(`build/crd.py`, written by `python -m tpuserve_operator.build.generate`) and the operator's
typed view of a spec come from these models. What the operator renders from it is
`render/gateway.py`; docs/gateway.md ("A gateway for a namespace") says why a resource of its
own, and how one model's load is kept from another's.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tpuserve_operator.api import (
    DNS_SUBDOMAIN,
    LABEL_VALUE,
    MAX_REQUEST_SECONDS,
    ApiKeysSecret,
    HoldSpec,
    Schema,
    free_form,
    section,
)

MAX_SELECTOR_LABELS = 16
LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"


class ServerSelector(Schema):
    match_labels: dict[str, str] = Field(
        default_factory=dict,
        json_schema_extra={
            "default": {},
            "maxProperties": MAX_SELECTOR_LABELS,
            "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE},
        },
        description=(
            "matchLabels selects the TPUModelServers of the gateway's namespace whose "
            "metadata.labels include every one of these. Empty (the default): every "
            "TPUModelServer of the namespace."
        ),
    )


class GatewayHoldSpec(HoldSpec):
    model_share: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description=(
            "modelShare is the share of the held requests' byte budget (half of the router's "
            "--max-buffered-bytes) one model's hold queue may take (`tpuserve router "
            "--hold-model-share`), so one model's flood at zero leaves the others room; each "
            "model has its own maxRequests slots already. Default: 0.25."
        ),
    )


class GatewayInferencePoolSpec(Schema):
    gateway_name: str = Field(
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description=(
            "gatewayName names the Gateway (gateway.networking.k8s.io) whose pods may reach the "
            "gateway's picker port; one InferencePool per model is rendered, each naming the "
            "model's serving leaders and this gateway's picker (`<name>-picker`, port 9002)."
        ),
    )
    failure_mode: Literal["FailClose", "FailOpen"] = Field(
        default="FailClose",
        description="failureMode of each pool's endpointPickerRef. Default: FailClose.",
    )


class TPUGatewaySpec(Schema):
    server_selector: ServerSelector = section(
        ServerSelector,
        "serverSelector chooses the TPUModelServers the gateway fronts (by their labels, in "
        "the gateway's namespace). Each selected server's served name is one model of the "
        "gateway: routed among that server's leaders, held while it has none, and woken "
        "through its own demand Lease. A model the selection does not name is refused (404).",
    )
    replicas: int = Field(
        default=2,
        ge=1,
        le=64,
        description=(
            "replicas of the gateway's router Deployment; they peer as a server's router "
            "replicas do (routing decisions, KV index). Default: 2."
        ),
    )
    image: str | None = Field(
        default=None,
        max_length=512,
        description="image of the router container. Default: the operator's --router-image.",
    )
    policy: str | None = Field(
        default=None,
        max_length=63,
        pattern=r"^[a-z][a-z0-9_]*$",
        description=(
            "policy is the routing policy (`tpuserve router --policy`) applied within each "
            "model's leaders. Default: the operator's --router-policy, else the router's."
        ),
    )
    max_request_seconds: int = Field(
        default=600,
        ge=5,
        le=MAX_REQUEST_SECONDS,
        description=(
            "maxRequestSeconds is the longest a request may take (`--request-timeout`); the "
            "router pods drain for as long. Default: 600."
        ),
    )
    max_in_flight_per_model: int = Field(
        default=1024,
        ge=1,
        le=4096,
        description=(
            "maxInFlightPerModel is how many requests of one model the gateway has in flight "
            "at once (`--max-in-flight-per-model`); past it that model's requests get 429 "
            "while the others keep the rest of the router's 4096. Default: 1024."
        ),
    )
    hold: GatewayHoldSpec = section(
        GatewayHoldSpec,
        "hold bounds the requests held per model while that model has no routable replica "
        "(at zero, or starting): maxRequests slots of its own, modelShare of the bytes.",
    )
    api_keys: ApiKeysSecret | None = Field(
        default=None,
        description=(
            "apiKeys: the router's API keys (tenants, priority classes, rate limits; "
            "docs/router.md, Authentication), from this Secret, for every model of the "
            "gateway. Default: unset, no keys."
        ),
    )
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP", description="serviceType of the gateway's Service. Default: ClusterIP."
    )
    resources: dict[str, Any] | None = Field(
        default=None,
        json_schema_extra=free_form("object"),
        description=(
            "resources of the router container. Default: the operator's router resources "
            "(chart value router.resources)."
        ),
    )
    inference_pool: GatewayInferencePoolSpec | None = Field(
        default=None,
        description=(
            "inferencePool turns the gateway mode on: an InferencePool per model "
            "(inference.networking.k8s.io/v1, named <gateway>-<server>) whose endpoint picker "
            "is this gateway's router. Default: unset, no pools."
        ),
    )


class GatewayModelStatus(Schema):
    server: str = Field(description="server is the TPUModelServer's name.")
    model: str = Field(description="model is its served name, as clients send it.")
    scales_to_zero: bool = Field(
        description="scalesToZero: the server has autoscaling.minReplicas 0; the gateway "
        "renews its demand Lease."
    )


class TPUGatewayStatus(Schema):
    observed_generation: int | None = Field(default=None, description="observedGeneration.")
    endpoint: str | None = Field(
        default=None, description="endpoint is the in-cluster URL of the gateway's API."
    )
    models: list[GatewayModelStatus] = Field(
        default_factory=list,
        json_schema_extra={"maxItems": 1000},
        description="models are the models the gateway fronts, one per selected server.",
    )
    message: str | None = Field(default=None, description="message: what the last pass did.")
