"""`spec.inferencePool`: the InferencePool behind a Gateway API Inference Extension gateway,
and how the picker and engines admit that gateway alone."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from tpuserve_operator.schema.base import DNS_LABEL, Schema, SecretKeyRef, free_form, rules

PEER_FIELDS = ("ipBlock", "namespaceSelector", "podSelector")
"""A NetworkPolicyPeer's fields: declared, so CEL can see them (an object that only keeps
unknown fields hides them from CEL: `size()` of it does not compile on the apiserver)."""
GATEWAY_FROM_RULE = (
    "!has(self.gatewayFrom) || (size(self.gatewayFrom) > 0 && self.gatewayFrom.all(p, "
    "has(p.ipBlock) || has(p.podSelector)))",
    "inferencePool.gatewayFrom: an empty list, an empty peer or a peer without podSelector or "
    "ipBlock admits any source, or every pod of whole namespaces, to the engines' HTTP port and "
    "the picker; allowed: NetworkPolicy peers of the gateway's own pods (a podSelector of "
    "their labels, with a namespaceSelector for another namespace) or of its data plane's "
    "addresses (ipBlock), or unset (then gatewayName)",
)
GATEWAY_NAMED_RULE = (
    "has(self.gatewayName) != has(self.gatewayFrom)",
    "inferencePool: name the gateway with exactly one of gatewayName (the Gateway whose pods, "
    "labelled gateway.networking.k8s.io/gateway-name, are admitted) and gatewayFrom (its "
    "NetworkPolicy peers); the engines' HTTP port and the picker are open to that gateway alone",
)
GATEWAY_ONE_WAY_RULE = (
    "!has(self.gatewayNamespace) || has(self.gatewayName)",
    "inferencePool: gatewayNamespace is the namespace of gatewayName's pods; allowed with "
    "gatewayName only (gatewayFrom names its own namespaces)",
)
TOKEN_AUTH_RULE = (
    "!has(self.tokenSecretRef) || !has(self.pickerAuth) || self.pickerAuth == 'Token'",
    "inferencePool: tokenSecretRef with pickerAuth NetworkPolicyOnly; allowed: pickerAuth "
    "Token with or without tokenSecretRef, or NetworkPolicyOnly without it",
)
GATEWAY_POD_LABEL = "gateway.networking.k8s.io/gateway-name"
"""The label Gateway API implementations put on the pods they deploy for a Gateway (GEP-1762:
Istio, kgateway, NGINX Gateway Fabric, agentgateway)."""


class InferencePoolSpec(Schema):
    model_config = ConfigDict(
        json_schema_extra=rules(
            GATEWAY_FROM_RULE, GATEWAY_NAMED_RULE, GATEWAY_ONE_WAY_RULE, TOKEN_AUTH_RULE
        )
    )

    failure_mode: Literal["FailClose", "FailOpen"] = Field(
        default="FailClose",
        description=(
            "failureMode is what the gateway does when the endpoint picker (the router) does "
            "not answer: FailClose refuses the request, FailOpen sends it to any endpoint of "
            "the pool (the InferencePool's endpointPickerRef.failureMode). Default: FailClose."
        ),
    )
    gateway_name: str | None = Field(
        default=None,
        max_length=63,
        pattern=DNS_LABEL,
        description=(
            "gatewayName is the Gateway (gateway.networking.k8s.io) whose HTTPRoute sends to "
            "this pool: the pods its implementation deploys for it, labelled "
            f"{GATEWAY_POD_LABEL}: <gatewayName> (GEP-1762: Istio, kgateway, NGINX Gateway "
            "Fabric, agentgateway), in gatewayNamespace, are admitted to the leaders' HTTP "
            "port (the gateway sends requests to the endpoints the router picks) and to the "
            "router's picker port; nothing else is. One of gatewayName and gatewayFrom is "
            "required."
        ),
    )
    gateway_from: list[dict[str, Any]] | None = Field(
        default=None,
        max_length=16,
        json_schema_extra={
            "items": free_form(
                "object",
                properties={
                    field: free_form(
                        "object",
                        description=f"{field} of a networking/v1 NetworkPolicyPeer, as written.",
                    )
                    for field in PEER_FIELDS
                },
            )
        },
        description=(
            "gatewayFrom are the NetworkPolicy peers (networking/v1 NetworkPolicyPeer) of the "
            "gateway's data plane, admitted to the leaders' HTTP port and to the router's "
            "picker port, for a gateway whose pods gatewayName does not select (other labels; "
            "GKE's managed gateways, outside the cluster: an ipBlock of the proxy-only "
            "subnet). Each peer has a podSelector (the gateway's own pods) or an ipBlock: a "
            "namespaceSelector alone would admit every pod of those namespaces. One of "
            "gatewayName and gatewayFrom is required."
        ),
    )
    gateway_namespace: str | None = Field(
        default=None,
        max_length=63,
        pattern=DNS_LABEL,
        description=(
            "gatewayNamespace is the namespace of gatewayName's pods (where the Gateway is). "
            "Default: the server's own namespace."
        ),
    )
    picker_auth: Literal["Token", "NetworkPolicyOnly"] = Field(
        default="Token",
        description=(
            "pickerAuth is how the router's picker knows its gateway. Token (the default): "
            "every ext_proc stream must carry the gRPC metadata 'authorization: Bearer "
            "<token>' (UNAUTHENTICATED otherwise), the token from tokenSecretRef, else from "
            "the Secret <name>-router-picker (key token) the operator creates with a random "
            "value; the gateway sends it (Envoy: the ext_proc filter's "
            "grpc_service.initial_metadata, from the same Secret). NetworkPolicyOnly: no "
            "token, for the gateways that build their ext_proc configuration from the "
            "InferencePool (GKE, Istio, kgateway, NGINX Gateway Fabric offer no way to add "
            "metadata); the NetworkPolicy admitting only gatewayName's pods (or gatewayFrom) "
            "is then the picker's only fence (docs/gateway.md)."
        ),
    )
    token_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description=(
            "tokenSecretRef names the Secret key holding the gateway's token (16 to 4096 "
            "printable characters) when pickerAuth is Token: mounted read-only into the "
            "router's pods (--picker-token-file). The picker then counts the gateway's answer "
            "statuses for outlier ejection. A router restart reads a new token. Default: the "
            "Secret <name>-router-picker the operator creates (key token)."
        ),
    )
