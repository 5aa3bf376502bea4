"""`TPUModelServerStatus`, written by the operator: conditions, groups, roles, the plan, the
compile cache, the InferencePool and the predictive floor."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tpuserve_operator.schema.base import Schema


class Condition(Schema):
    type: str = Field(
        max_length=316,
        description="type of the condition: Valid, Progressing, Ready or Degraded.",
    )
    status: Literal["True", "False", "Unknown"] = Field(description="status of the condition.")
    reason: str = Field(
        max_length=1024,
        description="reason is a CamelCase identifier for programs, e.g. Unschedulable.",
    )
    message: str = Field(
        default="",
        max_length=32768,
        description="message is a sentence for humans, naming fields and allowed values.",
    )
    last_transition_time: str = Field(
        json_schema_extra={"format": "date-time"},
        description="lastTransitionTime is when status last changed.",
    )
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="observedGeneration is the metadata.generation the condition was set for.",
    )


class GroupStatus(Schema):
    role: Literal["prefill", "decode"] | None = Field(
        default=None,
        description="role of the group on a disaggregated server (its index is the role's).",
    )
    index: int = Field(ge=0, description="index of the replica group (within its role).")
    name: str = Field(description="name of the group's workload (LeaderWorkerSet/StatefulSet).")
    state: Literal["Pending", "Starting", "Ready", "Degraded", "Terminating"] = Field(
        description=(
            "state: Pending (pods not all scheduled), Starting (all scheduled, loading or "
            "compiling), Ready (every host up, leader serving), Degraded (partly up for too "
            "long, crash-looping or unschedulable), Terminating."
        ),
    )
    hosts: int = Field(ge=0, description="hosts is the pods the group needs.")
    ready_hosts: int = Field(ge=0, description="readyHosts is the group's ready pods.")
    updated: bool = Field(description="updated is true when all pods run the current revision.")
    reason: str = Field(default="", description="reason for the state, CamelCase.")
    message: str = Field(default="", description="message explaining the state.")
    since: str = Field(
        json_schema_extra={"format": "date-time"}, description="since is when state last changed."
    )


class RoleStatus(Schema):
    role: Literal["prefill", "decode"] = Field(description="role of these replica groups.")
    desired: int = Field(
        default=0,
        ge=0,
        description=(
            "desired: the replica groups the role should have: its replicas, or its "
            "TPUModelServerRole's spec.replicas when it autoscales."
        ),
    )
    replicas: int = Field(default=0, ge=0, description="replicas: the role's groups that exist.")
    ready_replicas: int = Field(
        default=0, ge=0, description="readyReplicas: the role's groups ready to serve."
    )
    updated_replicas: int = Field(
        default=0,
        ge=0,
        description="updatedReplicas: the role's wanted groups on the role's revision.",
    )
    revision: str = Field(
        default="",
        description=(
            "revision: the hash of the role's own pod templates; a change to one role's "
            "templates rolls that role's groups only."
        ),
    )
    groups: list[int] = Field(
        default_factory=list, description="groups: indices of the role's replica groups."
    )


class OperatingPointStatus(Schema):
    requests_per_second: float = Field(
        ge=0, description="requestsPerSecond one replica serves within the SLO."
    )
    concurrency: float = Field(
        ge=0, description="concurrency: requests in one replica there (waiting and running)."
    )
    decode_batch: int = Field(ge=0, description="decodeBatch: requests generating at once.")
    ttft_p50_seconds: float = Field(ge=0, description="ttftP50Seconds there.")
    ttft_p99_seconds: float = Field(ge=0, description="ttftP99Seconds there.")
    itl_seconds: float = Field(ge=0, description="itlSeconds: mean inter-token latency there.")
    tokens_per_second_per_chip: float = Field(
        ge=0, description="tokensPerSecondPerChip: prompt + output tokens per chip there."
    )


class ErrorBandStatus(Schema):
    median: float = Field(ge=0, description="median |error| of the performance model.")
    worst: float = Field(ge=0, description="worst |error| of the performance model.")
    figures: int = Field(ge=0, description="figures: published TPU serving figures compared.")
    ttft_p99_low: float | None = Field(
        default=None,
        ge=0,
        description=(
            "ttftP99Low: the engine twin's TTFT p99 over the plan's at the operating point, "
            "lowest over the validated workloads (measured / predicted)."
        ),
    )
    ttft_p99_high: float | None = Field(
        default=None, ge=0, description="ttftP99High: the same ratio, highest."
    )


class PlanStatus(Schema):
    workload: Literal["LeaderWorkerSet", "StatefulSet"] = Field(
        description="workload kind used for each replica group."
    )
    machine_type: str = Field(description="machineType of each host, e.g. ct6e-standard-4t.")
    hosts: int = Field(ge=1, description="hosts (pods) per replica.")
    chips_per_host: int = Field(ge=1, description="chipsPerHost: google.com/tpu per pod.")
    chips: int = Field(ge=1, description="chips per replica.")
    source: Literal["Spec", "Planned"] = Field(
        default="Spec",
        description=(
            "source: Spec when spec.tpu gave the slice, Planned when the operator chose it "
            "from spec.slo and spec.demand."
        ),
    )
    generation: str = Field(default="", description="generation of the slice.")
    topology: str = Field(default="", description="topology of the slice.")
    min_replicas: int | None = Field(
        default=None, ge=0, description="minReplicas: the plan's bound for the trough (slo)."
    )
    max_replicas: int | None = Field(
        default=None, ge=0, description="maxReplicas: the plan's replicas for the peak (slo)."
    )
    operating_point: OperatingPointStatus | None = Field(
        default=None, description="operatingPoint: one replica at the plan's SLO load (slo)."
    )
    error_band: ErrorBandStatus | None = Field(
        default=None,
        description="errorBand: the performance model's error the plan carries (slo).",
    )
    message: str = Field(default="", description="message: the plan in a sentence (slo).")
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="observedGeneration: the metadata.generation the plan was made for (slo).",
    )


class ColdStartStatus(Schema):
    pod: str = Field(description="pod is the leader whose start this was.")
    cache_result: Literal["hit", "miss"] = Field(
        description="cacheResult: hit when the compile cache held the key, else miss."
    )
    pull_seconds: float = Field(ge=0, description="pullSeconds: the image pull.")
    weights_seconds: float = Field(ge=0, description="weightsSeconds: reading the weights.")
    compile_seconds: float = Field(ge=0, description="compileSeconds: XLA compilation.")
    warmup_seconds: float = Field(ge=0, description="warmupSeconds: the warmup request.")


class CompileCacheStatus(Schema):
    key: str = Field(
        description=(
            "key is the compile cache key, <generation>-<topology>/<model>/<engine version>: "
            "replicas with the same key share compiled programs."
        )
    )
    location: str = Field(
        default="",
        description=(
            "location is where the cache is (pvc/<claim>); empty: none, every start compiles."
        ),
    )
    hits: int = Field(default=0, ge=0, description="hits: leader starts that found the key.")
    misses: int = Field(default=0, ge=0, description="misses: leader starts that compiled cold.")
    last_cold_start: ColdStartStatus | None = Field(
        default=None, description="lastColdStart is the last leader start's seconds by phase."
    )


class GatewayParentStatus(Schema):
    gateway: str = Field(description="gateway is the parent Gateway, namespace/name.")
    accepted: bool = Field(description="accepted: the gateway's Accepted condition is True.")
    reason: str = Field(default="", description="reason of the gateway's Accepted condition.")
    message: str = Field(default="", description="message of the gateway's Accepted condition.")


class InferencePoolStatus(Schema):
    name: str = Field(description="name of the InferencePool.")
    managed: bool = Field(
        description=(
            "managed: the operator created the pool and keeps it; false when a pool of that "
            "name existed that the operator did not create (it is left alone)."
        )
    )
    accepted: bool = Field(
        default=False, description="accepted: at least one gateway accepted the pool."
    )
    parents: list[GatewayParentStatus] = Field(
        default_factory=list,
        max_length=32,
        description="parents: the gateways that report on the pool (its status.parents).",
    )


FloorReason = Literal[
    "FloorDecides", "ReactiveDecides", "AtMinReplicas", "AtMaxReplicas", "NotMeasured"
]


class PredictiveFloorStatus(Schema):
    scaled_object: str = Field(
        description="scaledObject is the KEDA ScaledObject whose predictive-floor trigger this is."
    )
    role: str = Field(
        default="", description="role: prefill or decode for a disaggregated server's role."
    )
    replicas: int | None = Field(
        default=None,
        ge=0,
        description=(
            "replicas is the floor now: ceil(forecast / requestsPerReplica), within the "
            "ScaledObject's minReplicaCount..maxReplicaCount; unset until KEDA's "
            "HorizontalPodAutoscaler reports the trigger."
        ),
    )
    forecast_requests_per_second: float | None = Field(
        default=None,
        ge=0,
        description=(
            "forecastRequestsPerSecond is the request rate the floor expects horizonSeconds "
            "ahead (the larger of the trend and yesterday's shape), as KEDA last read it."
        ),
    )
    requests_per_replica: float = Field(
        gt=0, description="requestsPerReplica: the trigger's threshold (the spec's)."
    )
    horizon_seconds: int = Field(ge=0, description="horizonSeconds: how far ahead it looks.")
    reactive_replicas: int | None = Field(
        default=None,
        ge=0,
        description="reactiveReplicas: what the reactive trigger alone asks for now.",
    )
    current_replicas: int | None = Field(
        default=None, ge=0, description="currentReplicas: KEDA's HPA's count now."
    )
    reason: FloorReason = Field(
        description=(
            "reason: which decides the count: the floor (above the reactive trigger), the "
            "reactive trigger, the bounds, or NotMeasured (KEDA has not reported the trigger)."
        )
    )
    message: str = Field(default="", description="message says why, with the figures.")


class TPUModelServerStatus(Schema):
    observed_generation: int | None = Field(
        default=None, description="observedGeneration is the generation last reconciled."
    )
    replicas: int = Field(default=0, description="replicas is the number of replica groups.")
    ready_replicas: int = Field(
        default=0, description="readyReplicas is the number of groups ready to serve."
    )
    updated_replicas: int = Field(
        default=0, description="updatedReplicas is the number of groups on the current revision."
    )
    endpoint: str = Field(
        default="", description="endpoint is the in-cluster URL of the OpenAI-compatible API."
    )
    served_name: str = Field(
        default="", description="servedName is the resolved model name clients send."
    )
    selector: str = Field(
        default="",
        description="selector of the leader pods, for the scale subresource (HPA).",
    )
    revision: str = Field(default="", description="revision is the current pod-template hash.")
    plan: PlanStatus | None = Field(
        default=None, description="plan is the resolved slice: workload, hosts and chips."
    )
    groups: list[GroupStatus] = Field(
        default_factory=list, description="groups is the state of each replica group."
    )
    compile_cache: CompileCacheStatus | None = Field(
        default=None,
        description=(
            "compileCache is the compile cache key and, as the leaders report them once "
            "Ready, its hits and misses and the last cold start by phase."
        ),
    )
    inference_pool: InferencePoolStatus | None = Field(
        default=None,
        description=(
            "inferencePool is the server's InferencePool and whether a gateway accepted it "
            "(spec.inferencePool)."
        ),
    )
    roles: list[RoleStatus] = Field(
        default_factory=list,
        description=(
            "roles: with spec.disaggregation, each role's replica groups and how many are "
            "ready (prefill first, then decode); empty otherwise."
        ),
    )
    predictive_floor: list[PredictiveFloorStatus] = Field(
        default_factory=list,
        max_length=2,
        description=(
            "predictiveFloor: with autoscaling.keda.predictiveFloor, the floor now and why, per "
            "ScaledObject (the server's, or each role's), read from KEDA's "
            "HorizontalPodAutoscaler; empty otherwise."
        ),
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
        description="conditions: Valid, Progressing, Ready, Degraded.",
    )
