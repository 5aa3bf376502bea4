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

A disaggregated server has no server-wide autoscaler: each role with
`spec.disaggregation.<role>.autoscaling` gets its own HPA, `<name>-<role>`, targeting the
role's TPUModelServerRole (`render.roles.role_scales`), whose scale selector is the role's
leaders, so `queue` and `tokensInFlight` average over that role's leaders (tokensInFlight per
chip of the role's slice); `ttft` (prefill only) reads `model_role:sglang_ttft_seconds:p90_5m`
of the served model's `engine_type="prefill"` engines.
"""

from __future__ import annotations

from sglang_tpu import disaggregation as pd
from sglang_tpu import metric_names
from sglang_tpu.topology import lookup
from tpuserve_operator import disaggregation, labels
from tpuserve_operator.api import AutoscalingSpec
from tpuserve_operator.render.context import Manifest, Server
from tpuserve_operator.render.roles import role_scale_name

QUEUE_METRIC = metric_names.NUM_QUEUE_REQS.name
TOKENS_IN_FLIGHT_METRIC = metric_names.NUM_USED_TOKENS.name
TTFT_METRIC = "model:sglang_ttft_seconds:p90_5m"
"""A recording rule of the chart (tpuserve.observability.rules; a test checks it exists)."""
ROLE_TTFT_METRIC = "model_role:sglang_ttft_seconds:p90_5m"
"""The same per engine role (SGLang's engine_type label), for a prefill role's HPA."""
ENGINE_TYPE = "engine_type"


def quantity(value: float) -> str:
    """A Kubernetes quantity for ``value`` (decimal, exponent form for tiny or huge ones)."""
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return format(value, "g")


def _metric(server: Server, spec: AutoscalingSpec, chips: int, role: str | None) -> Manifest:
    if spec.metric == "queue":
        return {
            "type": "Pods",
            "pods": {
                "metric": {"name": QUEUE_METRIC},
                "target": {"type": "AverageValue", "averageValue": quantity(spec.target)},
            },
        }
    if spec.metric == "tokensInFlight":
        per_replica = spec.target * chips
        return {
            "type": "Pods",
            "pods": {
                "metric": {"name": TOKENS_IN_FLIGHT_METRIC},
                "target": {"type": "AverageValue", "averageValue": quantity(per_replica)},
            },
        }
    match = {"model_name": server.valid.served_name}
    if role is not None:
        match[ENGINE_TYPE] = role
    return {
        "type": "External",
        "external": {
            "metric": {
                "name": TTFT_METRIC if role is None else ROLE_TTFT_METRIC,
                "selector": {"matchLabels": match},
            },
            "target": {"type": "Value", "value": quantity(spec.target)},
        },
    }


def autoscaler(server: Server) -> list[Manifest]:
    """The server's HPA (or, disaggregated, each autoscaled role's); none when unset."""
    spec = server.valid.spec
    if spec.disaggregation is not None:
        out = []
        for role in disaggregation.autoscaled_roles(spec):
            part = disaggregation.role_of(spec, role)
            assert part.autoscaling is not None
            tpu = part.tpu or spec.tpu
            chips = lookup(tpu.generation, tpu.topology).chips
            name = role_scale_name(server.name, role)
            target = (labels.ROLE_KIND, name)
            out.append(_hpa(server, name, target, part.autoscaling, chips, role))
        return out
    if spec.autoscaling is None:
        return []
    target = (labels.KIND, server.name)
    return [_hpa(server, server.name, target, spec.autoscaling, server.valid.shape.chips, None)]


def _hpa(
    server: Server, name: str, target: tuple[str, str], spec: AutoscalingSpec, chips: int,
    role: str | None,
) -> Manifest:  # fmt: skip
    extra = {} if role is None else {pd.PD_ROLE_LABEL: role}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": server.metadata(name, labels.COMPONENT_MODEL_SERVER, extra),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": labels.API_VERSION,
                "kind": target[0],
                "name": target[1],
            },
            # The HPA never goes below 1 (HPAScaleToZero is alpha); the operator owns
            # 0 <-> 1 (scale_to_zero), and at 0 the HPA stands aside (ScalingDisabled).
            "minReplicas": max(1, spec.min_replicas),
            "maxReplicas": spec.max_replicas,
            "metrics": [_metric(server, spec, chips, role)],
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
