"""The TPUModelServer CustomResourceDefinition, built from the API models in `api.py`."""

from __future__ import annotations

from typing import Any

from tpuserve_operator import labels
from tpuserve_operator.api import (
    MAX_NAME_LENGTH,
    NAME_RULE,
    TPUModelServerRoleSpec,
    TPUModelServerRoleStatus,
    TPUModelServerSpec,
    TPUModelServerStatus,
)
from tpuserve_operator.build.openapi import JSON, structural_schema

RESOURCE_DESCRIPTION = (
    "TPUModelServer serves one model on Google Cloud TPU slices: per replica a whole slice "
    "(a LeaderWorkerSet group, or StatefulSets when LeaderWorkerSet is not installed) running "
    "SGLang on TorchTPU, a prefix-aware router in front of the replica leaders, Services, a "
    "PodDisruptionBudget and Prometheus monitors. The operator derives node selectors, "
    "tolerations, google.com/tpu requests and the multi-host launch environment from the "
    "TPU topology catalog."
)

PRINTER_COLUMNS: list[JSON] = [
    {"name": "Model", "type": "string", "jsonPath": ".status.servedName"},
    {"name": "TPU", "type": "string", "jsonPath": ".spec.tpu.generation"},
    {"name": "Topology", "type": "string", "jsonPath": ".spec.tpu.topology"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _object_schema(
    description: str, kind: str, spec: type[Any], spec_description: str, status: type[Any]
) -> JSON:
    """A resource's whole schema: apiVersion, kind, metadata, spec, status."""
    return {
        "description": description,
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "description": f"apiVersion is {labels.API_VERSION}.",
                "type": "string",
            },
            "kind": {"description": f"kind is {kind}.", "type": "string"},
            "metadata": {"type": "object"},
            "spec": {**structural_schema(spec), "description": spec_description},
            "status": {
                **_without_defaults(structural_schema(status)),
                "description": "status is written by the operator.",
            },
        },
    }


def openapi_schema() -> JSON:
    """The TPUModelServer's schema, with the rule on its name."""
    schema = _object_schema(
        RESOURCE_DESCRIPTION, labels.KIND, TPUModelServerSpec,
        "spec is the desired state: what to serve, on which TPU slices.", TPUModelServerStatus,
    )  # fmt: skip
    schema["x-kubernetes-validations"] = [
        {
            "rule": NAME_RULE,
            "message": (
                f"metadata.name must be at most {MAX_NAME_LENGTH} characters of lower-case "
                "letters, digits and '-', starting with a letter and ending with a letter or "
                "digit (children include Services; child objects and pod host names append "
                "suffixes)"
            ),
        }
    ]
    return schema


def _without_defaults(node: JSON) -> JSON:
    """Status is the operator's to write; the apiserver should not invent values there."""
    out = {k: v for k, v in node.items() if k != "default"}
    if "properties" in out:
        out["properties"] = {k: _without_defaults(v) for k, v in out["properties"].items()}
    if isinstance(out.get("items"), dict):
        out["items"] = _without_defaults(out["items"])
    return out


def _definition(
    kind: str, plural: str, singular: str, short_names: tuple[str, ...], schema: JSON,
    columns: list[JSON], scale: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """A namespaced CRD of the group, with status and (``scale``) scale subresources."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{labels.GROUP}",
            "labels": {labels.NAME: labels.PART_OF_VALUE},
        },
        "spec": {
            "group": labels.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": list(short_names),
                "categories": ["tpuserve"],
            },
            "versions": [
                {
                    "name": labels.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {
                        "status": {},
                        **(
                            {
                                "scale": {
                                    "specReplicasPath": ".spec.replicas",
                                    "statusReplicasPath": ".status.replicas",
                                    "labelSelectorPath": ".status.selector",
                                }
                            }
                            if scale
                            else {}
                        ),
                    },
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def custom_resource_definition() -> dict[str, Any]:
    return _definition(
        labels.KIND, labels.PLURAL, labels.SINGULAR, labels.SHORT_NAMES, openapi_schema(),
        PRINTER_COLUMNS,
    )  # fmt: skip


ROLE_DESCRIPTION = (
    "TPUModelServerRole is one autoscaled role (prefill or decode) of a disaggregated "
    "TPUModelServer, made and owned by the operator, named <server>-<role>: its scale "
    "subresource is the role's replica count, which the role's HorizontalPodAutoscaler (or "
    "kubectl scale) sets and the operator renders as that many replica groups of the role."
)

ROLE_PRINTER_COLUMNS: list[JSON] = [
    {"name": "Role", "type": "string", "jsonPath": ".spec.role"},
    {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"},
    {"name": "Current", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def role_openapi_schema() -> JSON:
    return _object_schema(
        ROLE_DESCRIPTION, labels.ROLE_KIND, TPUModelServerRoleSpec,
        "spec is the role and its replica count.", TPUModelServerRoleStatus,
    )  # fmt: skip


def role_custom_resource_definition() -> dict[str, Any]:
    return _definition(
        labels.ROLE_KIND, labels.ROLE_PLURAL, labels.ROLE_SINGULAR, labels.ROLE_SHORT_NAMES,
        role_openapi_schema(), ROLE_PRINTER_COLUMNS,
    )  # fmt: skip


GATEWAY_DESCRIPTION = (
    "TPUGateway is one router Deployment in front of every TPUModelServer of its namespace "
    "that its serverSelector selects: requests are routed by their model among that "
    "model's leaders, with the per-server router's peering, keys, quotas, priorities, hold "
    "queue and metrics, per model; a model at zero replicas is held and woken through its "
    "own demand Lease; per-model shares keep one model's flood from another's room."
)

GATEWAY_PRINTER_COLUMNS: list[JSON] = [
    {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
    {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def gateway_openapi_schema() -> JSON:
    from tpuserve_operator.gateway_api import TPUGatewaySpec, TPUGatewayStatus

    schema = _object_schema(
        GATEWAY_DESCRIPTION, labels.GATEWAY_KIND, TPUGatewaySpec,
        "spec: which servers, and the router in front of them.", TPUGatewayStatus,
    )  # fmt: skip
    schema["x-kubernetes-validations"] = openapi_schema()["x-kubernetes-validations"]
    return schema


def gateway_custom_resource_definition() -> dict[str, Any]:
    return _definition(
        labels.GATEWAY_KIND, labels.GATEWAY_PLURAL, labels.GATEWAY_SINGULAR,
        labels.GATEWAY_SHORT_NAMES, gateway_openapi_schema(), GATEWAY_PRINTER_COLUMNS,
        scale=False,
    )  # fmt: skip
