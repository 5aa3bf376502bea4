"""`spec.autoscaling`: the HPA or KEDA autoscaler, scale to zero, scaling behaviour and the
predictive floor, with the rules tying them together."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from tpuserve_operator import scaling_behavior as sb
from tpuserve_operator.schema.base import Schema, rules, section


class ScaleToZeroSpec(Schema):
    idle_seconds: int = Field(
        default=600,
        ge=30,
        le=86400,
        description=(
            "idleSeconds is how long the server must see no request (none arriving, in "
            "flight or held at the router) before the operator sets replicas to 0; the next "
            "request is held by the router and scales it back to 1. Used when minReplicas "
            "is 0. Default: 600."
        ),
    )


AUTOSCALERS = ("hpa", "keda")
"""`autoscaling.engine` values: who scales the server."""
KEDA_METRICS = ("backlogSeconds", "kvCacheUsage")
"""`autoscaling.metric` values only KEDA's Prometheus triggers read (the HPA path's metrics
adapter does not serve them)."""
KEDA_ONLY_MESSAGE = (
    "autoscaling.metric backlogSeconds and kvCacheUsage need autoscaling.engine keda (the "
    "HPA path's metrics adapter does not serve them); allowed with engine hpa: queue, "
    "tokensInFlight, ttft"
)
KEDA_SETTINGS_MESSAGE = (
    "autoscaling.keda is set with autoscaling.engine hpa: one autoscaler per scale "
    "subresource (KEDA runs an HPA of its own on it, and two would fight); allowed: "
    "autoscaling.engine keda, or no autoscaling.keda"
)

SCALE_UP_MESSAGE = (
    "autoscaling.scaleUpPods and autoscaling.scaleUpPercent are both 0, which would never "
    "scale up; allowed: at least one of them above 0"
)
SCALE_DOWN_MESSAGE = (
    "autoscaling.scaleDownPods and autoscaling.scaleDownPercent are both 0, which would never "
    "scale down; allowed: at least one of them above 0"
)


class PredictiveFloorSpec(Schema):
    requests_per_replica: float = Field(
        gt=0,
        le=1e6,
        description=(
            "requestsPerReplica is the request rate (requests/s) one replica serves within "
            "the SLO, e.g. `tpuserve plan`'s capacity for the model, slice and workload."
        ),
    )
    horizon_seconds: int = Field(
        default=300,
        ge=30,
        le=3600,
        description=(
            "horizonSeconds is how far ahead the floor looks: one cold start of a replica "
            "(node, image, weights, compile). Default: 300."
        ),
    )
    window_seconds: int = Field(
        default=600,
        ge=120,
        le=3600,
        description=(
            "windowSeconds is the recent window the request-rate trend is fitted over. "
            "Default: 600."
        ),
    )
    peak_window_seconds: int | None = Field(
        default=None,
        ge=300,
        le=86400,
        description=(
            "peakWindowSeconds makes the floor hold the recent peak too: the highest one-minute "
            "request rate of the last peakWindowSeconds, carried along yesterday's shape like "
            "the rate now. For bursts shorter than a cold start, which no replica started at "
            "the burst serves; costs idle replicas between bursts. Unset: no peak hold."
        ),
    )


class KedaSpec(Schema):
    predictive_floor: PredictiveFloorSpec | None = Field(
        default=None,
        description=(
            "predictiveFloor adds a second trigger that keeps the replicas the request rate "
            "one horizon ahead needs: the larger of the trend over windowSeconds (the line "
            "through the median rates of the window's two halves, so a burst shorter than a "
            "quarter of the window is not read as a ramp; at most 4x the window's mean) and "
            "the rate now carried along yesterday's shape "
            "(yesterday's rate one horizon later / yesterday's rate now); KEDA scales to the "
            "larger of the two triggers, so the floor only ever adds replicas "
            "(tpuserve_operator.predictive_floor is the same rule). Unset: no floor."
        ),
    )
    polling_interval_seconds: int = Field(
        default=15,
        ge=5,
        le=600,
        description=(
            "pollingIntervalSeconds is how often KEDA runs the trigger's Prometheus query "
            "(the ScaledObject's pollingInterval). Default: 15."
        ),
    )


class AutoscalingSpec(Schema):
    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "self.minReplicas <= self.maxReplicas",
                "autoscaling.minReplicas must be less than or equal to autoscaling.maxReplicas",
            ),
            ("!has(self.keda) || self.engine == 'keda'", KEDA_SETTINGS_MESSAGE),
            (
                "self.engine == 'keda' || !(self.metric in "
                + "["
                + ", ".join(f"'{m}'" for m in KEDA_METRICS)
                + "])",
                KEDA_ONLY_MESSAGE,
            ),
            (
                "self.scaleUpPods > 0 || self.scaleUpPercent > 0",
                SCALE_UP_MESSAGE,
            ),
            (
                "self.scaleDownPods > 0 || self.scaleDownPercent > 0",
                SCALE_DOWN_MESSAGE,
            ),
            (
                "self.metric != 'kvCacheUsage' || self.target <= 1.0",
                "autoscaling.target of metric kvCacheUsage is a share of the KV pool; "
                "allowed: more than 0 and at most 1",
            ),
        )
    )

    engine: Literal["hpa", "keda"] = Field(
        default="hpa",
        description=(
            "engine is the autoscaler: hpa (a HorizontalPodAutoscaler fed by the cluster's "
            "metrics adapter, Prometheus Adapter) or keda (a KEDA ScaledObject whose "
            "Prometheus trigger carries the query; needs KEDA's CRDs, keda.sh/v1alpha1). "
            "Both scale the same scale subresource, so one at a time. Default: hpa."
        ),
    )
    keda: KedaSpec | None = Field(
        default=None,
        description="keda holds KEDA's own settings (engine keda only). Unset: the defaults.",
    )
    prefill_tokens_per_second: float | None = Field(
        default=None,
        gt=0,
        le=1e9,
        description=(
            "prefillTokensPerSecond is one replica's peak prefill throughput (uncached prompt "
            "tokens/s) that metric backlogSeconds divides the queued prefill tokens by. "
            "Unset: the performance model's figure for the model and slice (the model must "
            "be one it knows). Set it from a calibration run to override."
        ),
    )

    min_replicas: int = Field(
        default=1,
        ge=0,
        le=1024,
        description=(
            "minReplicas is the fewest replicas the autoscaler keeps. 0 scales to zero: "
            "after scaleToZero.idleSeconds without requests the operator sets replicas to "
            "0, the router holds the requests that arrive (router.hold) and the first one "
            "makes the operator set replicas to 1; the HorizontalPodAutoscaler (whose own "
            "minimum is then 1) scales from 1 to maxReplicas. With engine keda, KEDA owns "
            "0 <-> 1 instead: its activation on the router's held and answered requests, "
            "its cooldown scaleToZero.idleSeconds. Needs router.enabled. Default: 1."
        ),
    )
    max_replicas: int = Field(
        ge=1,
        le=1024,
        description="maxReplicas is the most replicas (slices) the autoscaler may run.",
    )
    metric: Literal["queue", "ttft", "tokensInFlight", "backlogSeconds", "kvCacheUsage"] = Field(
        default="queue",
        description=(
            "metric drives scaling: queue (requests waiting per replica: the engines' "
            "sglang:num_queue_reqs), tokensInFlight (KV-cache tokens in use per chip: "
            "sglang:num_used_tokens), ttft (p90 time to first token over 5 minutes: "
            "model:sglang_ttft_seconds:p90_5m of the served model; with engine keda the "
            "trigger scales on p90 / target, the SLO mode), and, engine keda only, "
            "backlogSeconds (queued prefill tokens / the replica's peak prefill throughput, "
            "prefillTokensPerSecond: seconds of prefill waiting per replica) or kvCacheUsage "
            "(share of the KV pool in use per replica: sglang:token_usage). Default: queue."
        ),
    )
    target: float = Field(
        default=8,
        gt=0,
        description=(
            "target value of metric: waiting requests per replica (queue), tokens per chip "
            "(tokensInFlight), seconds (ttft: the p90 TTFT SLO; backlogSeconds: seconds of "
            "prefill backlog per replica, e.g. half the TTFT SLO) or a share 0-1 "
            "(kvCacheUsage). Default: 8."
        ),
    )
    scale_to_zero: ScaleToZeroSpec = section(
        ScaleToZeroSpec,
        "scaleToZero says when an idle server goes to zero replicas (minReplicas 0 only).",
    )
    scale_down_stabilization_seconds: int = Field(
        default=sb.DEFAULT_STABILIZATION_SECONDS,
        ge=0,
        le=sb.MAX_STABILIZATION_SECONDS,
        description=(
            "scaleDownStabilizationSeconds is how long demand must stay lower before the "
            "autoscaler removes slices (the HorizontalPodAutoscaler's scale-down "
            "stabilization window: it scales down to the highest count the window asked "
            "for); slices then go at scaleDownPods / scaleDownPercent. Scale-up never waits. "
            f"Default: {sb.DEFAULT_STABILIZATION_SECONDS}."
        ),
    )
    scale_up_pods: int = Field(
        default=sb.DEFAULT_SCALE_UP_PODS,
        ge=0,
        le=1024,
        description=(
            "scaleUpPods is how many slices scale-up may add per "
            f"{sb.SCALE_UP_PERIOD_SECONDS} s whatever the fleet's size (a Pods policy of the "
            "HPA's behavior); scale-up takes the larger of it and scaleUpPercent. 0 leaves "
            f"the policy out. Default: {sb.DEFAULT_SCALE_UP_PODS} (Kubernetes' default)."
        ),
    )
    scale_up_percent: int = Field(
        default=sb.DEFAULT_SCALE_UP_PERCENT,
        ge=0,
        le=1000,
        description=(
            "scaleUpPercent is how much scale-up may grow the fleet per "
            f"{sb.SCALE_UP_PERIOD_SECONDS} s, in percent of its replicas (a Percent policy; "
            "100 doubles it). 0 leaves the policy out. Default: "
            f"{sb.DEFAULT_SCALE_UP_PERCENT} (Kubernetes' default)."
        ),
    )
    scale_down_pods: int = Field(
        default=sb.DEFAULT_SCALE_DOWN_PODS,
        ge=0,
        le=1024,
        description=(
            "scaleDownPods is how many slices scale-down may remove per "
            f"{sb.SCALE_DOWN_PERIOD_SECONDS} s whatever the fleet's size, after "
            "scaleDownStabilizationSeconds; scale-down takes the larger of it and "
            "scaleDownPercent. 0 leaves the policy out. Default: "
            f"{sb.DEFAULT_SCALE_DOWN_PODS}."
        ),
    )
    scale_down_percent: int = Field(
        default=sb.DEFAULT_SCALE_DOWN_PERCENT,
        ge=0,
        le=100,
        description=(
            "scaleDownPercent is how much scale-down may shrink the fleet per "
            f"{sb.SCALE_DOWN_PERIOD_SECONDS} s, in percent of its replicas: a fleet of any "
            "size sheds a burst's excess in minutes (10 halves it in about 7, about one "
            "cold start of a TPU slice), while one low reading costs at most that share. "
            f"0 leaves the policy out. Default: {sb.DEFAULT_SCALE_DOWN_PERCENT}."
        ),
    )
