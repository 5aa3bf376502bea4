"""Schemas for the monitoring CRD kinds the chart renders, which kubernetes-validate does not know.

Written from the prometheus-operator API reference (monitoring.coreos.com/v1) and GKE Managed
Prometheus's CRDs (monitoring.googleapis.com/v1, prometheus-engine `charts/operator/crds`):
only the fields the chart uses, with `additionalProperties: false` so a misspelt field fails.
"""

from __future__ import annotations

from typing import Any

STR: dict[str, Any] = {"type": "string"}
DURATION: dict[str, Any] = {"type": "string", "pattern": "^([0-9]+(ms|s|m|h|d|w|y))+$"}
LABELS: dict[str, Any] = {"type": "object", "additionalProperties": STR}
SELECTOR: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"matchLabels": LABELS, "matchExpressions": {"type": "array"}},
}
METADATA: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": STR, "namespace": STR, "labels": LABELS, "annotations": LABELS},
}
NAMESPACE_SELECTOR: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": STR}},
}
RELABELINGS: dict[str, Any] = {"type": "array", "items": {"type": "object"}}
RULE: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["expr"],
    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
    "properties": {
        "record": STR,
        "alert": STR,
        "expr": STR,
        "for": DURATION,
        "labels": LABELS,
        "annotations": LABELS,
    },
}
GROUPS: dict[str, Any] = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "rules"],
        "properties": {
            "name": STR,
            "interval": DURATION,
            "rules": {"type": "array", "items": RULE},
        },
    },
}


def _kind(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {"metadata": METADATA, "spec": spec},
    }


_POD_METRICS_ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "port": STR,
        "portNumber": {"type": "integer", "minimum": 1, "maximum": 65535},
        "path": STR,
        "interval": DURATION,
        "scrapeTimeout": DURATION,
        "honorLabels": {"type": "boolean"},
        "relabelings": RELABELINGS,
        "metricRelabelings": RELABELINGS,
    },
}
_GMP_ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["port"],
    "properties": {
        "port": {"type": ["string", "integer"]},
        "path": STR,
        "interval": DURATION,
        "timeout": DURATION,
    },
}
_PROTECTED = ["project_id", "location", "cluster", "namespace", "job", "instance", "__address__"]
_GMP_MONITORING_SPEC = {
    "type": "object",
    "additionalProperties": False,
    "required": ["selector", "endpoints"],
    "properties": {
        "selector": SELECTOR,
        "endpoints": {"type": "array", "minItems": 1, "items": _GMP_ENDPOINT},
        "targetLabels": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "fromPod": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["from"],
                        "properties": {
                            "from": STR,
                            "to": {
                                "type": "string",
                                "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$",
                                "not": {"enum": _PROTECTED},
                            },
                        },
                    },
                }
            },
        },
    },
}

SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "PodMonitor"): _kind(
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "podMetricsEndpoints"],
            "properties": {
                "selector": SELECTOR,
                "namespaceSelector": NAMESPACE_SELECTOR,
                "podTargetLabels": {"type": "array", "items": STR},
                "jobLabel": STR,
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": _POD_METRICS_ENDPOINT,
                },
            },
        }
    ),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _kind(
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": SELECTOR,
                "namespaceSelector": NAMESPACE_SELECTOR,
                "endpoints": {"type": "array", "minItems": 1, "items": _POD_METRICS_ENDPOINT},
            },
        }
    ),
    ("monitoring.coreos.com/v1", "PrometheusRule"): _kind(
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["groups"],
            "properties": {"groups": GROUPS},
        }
    ),
    ("monitoring.googleapis.com/v1", "PodMonitoring"): _kind(_GMP_MONITORING_SPEC),
    ("monitoring.googleapis.com/v1", "ClusterPodMonitoring"): _kind(_GMP_MONITORING_SPEC),
    ("monitoring.googleapis.com/v1", "ClusterRules"): _kind(
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["groups"],
            "properties": {"groups": GROUPS},
        }
    ),
}
