"""The HorizontalPodAutoscaler that acts on `spec.autoscaling`.

Kubernetes' own HPA controller does the scaling: it targets the TPUModelServer's scale
subresource (so it changes `spec.replicas`, one replica being one whole slice) and keeps the
count within `minReplicas..maxReplicas` even before any metric is readable. The metric comes
from the cluster's custom- or external-metrics adapter (Prometheus Adapter; on GKE the
Custom Metrics Stackdriver Adapter over Managed Prometheus), which must serve:

- `queue`: the Pods metric `sglang:num_queue_reqs` of the leader pods (the scale selector),
  averaged per replica against `target` waiting requests;
- `tokensInFlight`: the Pods metric `sglang:num_used_tokens`, against `target` × the chips of
  one replica (the target is per chip; one leader reports its whole slice);
- `ttft`: the External metric `model:sglang_ttft_seconds:p90_5m` (the chart's recording rule,
  p90 time to first token over 5 minutes) for `model_name` = the served name, against
  `target` seconds.

Scale-up adds one slice at a time per minute (a slice is costly and slow to start; the next
decision sees the new one); scale-down waits `scaleDownStabilizationSeconds` (default 5
minutes) of lower demand, then removes one slice at a time.
"""

from __future__ import annotations

from sglang_tpu import metric_names
from tpuserve_operator import labels
from tpuserve_operator.render.context import Manifest, Server

QUEUE_METRIC = metric_names.NUM_QUEUE_REQS.name
TOKENS_IN_FLIGHT_METRIC = metric_names.NUM_USED_TOKENS.name
TTFT_METRIC = "model:sglang_ttft_seconds:p90_5m"
"""A recording rule of the chart (tpuserve.observability.rules; a test checks it exists)."""


def quantity(value: float) -> str:
    """A Kubernetes quantity for ``value`` (decimal, exponent form for tiny or huge ones)."""
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return format(value, "g")


def _metric(server: Server) -> Manifest:
    spec = server.valid.spec.autoscaling
    assert spec is not None
    if spec.metric == "queue":
        return {
            "type": "Pods",
            "pods": {
                "metric": {"name": QUEUE_METRIC},
                "target": {"type": "AverageValue", "averageValue": quantity(spec.target)},
            },
        }
    if spec.metric == "tokensInFlight":
        per_replica = spec.target * server.valid.shape.chips
        return {
            "type": "Pods",
            "pods": {
                "metric": {"name": TOKENS_IN_FLIGHT_METRIC},
                "target": {"type": "AverageValue", "averageValue": quantity(per_replica)},
            },
        }
    return {
        "type": "External",
        "external": {
            "metric": {
                "name": TTFT_METRIC,
                "selector": {"matchLabels": {"model_name": server.valid.served_name}},
            },
            "target": {"type": "Value", "value": quantity(spec.target)},
        },
    }


def autoscaler(server: Server) -> list[Manifest]:
    """The server's HPA, or none when `spec.autoscaling` is unset."""
    spec = server.valid.spec.autoscaling
    if spec is None:
        return []
    return [
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": server.metadata(server.name, labels.COMPONENT_MODEL_SERVER),
            "spec": {
                "scaleTargetRef": {
                    "apiVersion": labels.API_VERSION,
                    "kind": labels.KIND,
                    "name": server.name,
                },
                # The HPA never goes below 1 (HPAScaleToZero is alpha); the operator owns
                # 0 <-> 1 (scale_to_zero), and at 0 the HPA stands aside (ScalingDisabled).
                "minReplicas": max(1, spec.min_replicas),
                "maxReplicas": spec.max_replicas,
                "metrics": [_metric(server)],
                "behavior": {
                    "scaleUp": {
                        "stabilizationWindowSeconds": 0,
                        "selectPolicy": "Max",
                        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
                    },
                    "scaleDown": {
                        "stabilizationWindowSeconds": spec.scale_down_stabilization_seconds,
                        "selectPolicy": "Max",
                        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
                    },
                },
            },
        }
    ]
