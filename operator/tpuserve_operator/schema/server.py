"""`TPUModelServerSpec`, the whole spec, and its pod-level sections (rollout, monitoring, pod
template overrides)."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from tpuserve_operator.schema.autoscaling import AutoscalingSpec
from tpuserve_operator.schema.base import DNS_SUBDOMAIN, Schema, free_form, rules, section
from tpuserve_operator.schema.disaggregation import DisaggregationSpec
from tpuserve_operator.schema.engine import EngineSpec
from tpuserve_operator.schema.inference_pool import InferencePoolSpec
from tpuserve_operator.schema.kv_cache import KvCacheSpec
from tpuserve_operator.schema.model import ModelSpec
from tpuserve_operator.schema.router import RouterSpec
from tpuserve_operator.schema.sizing import DemandSpec, SloSpec
from tpuserve_operator.schema.tpu import TPUSpec


class RolloutSpec(Schema):
    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "self.maxUnavailable + self.maxSurge >= 1",
                "rollout.maxUnavailable and rollout.maxSurge cannot both be 0",
            )
        )
    )

    max_unavailable: int = Field(
        default=1,
        ge=0,
        le=1024,
        description=(
            "maxUnavailable is how many replica groups may be down at once while a change "
            "rolls out. With 2 or more replicas the operator always keeps at least one ready "
            "group serving, whatever this says. Default: 1."
        ),
    )
    max_surge: int = Field(
        default=0,
        ge=0,
        le=1024,
        description=(
            "maxSurge is how many extra replica groups (whole slices) may run above replicas "
            "during a rollout. Default: 0, since no spare slice is assumed; set it only when "
            "the node pools have room for an extra slice. With spec.disaggregation it counts "
            "per role, and a role of one group surges one anyway, so a prefill and a decode "
            "that pair keep serving (docs/pd.md)."
        ),
    )


class MonitoringSpec(Schema):
    pod_monitor: bool = Field(
        default=False,
        description=(
            "podMonitor creates a PodMonitor (monitoring.coreos.com/v1) for this server's "
            "engine pods, when that CRD is installed. The tpuserve chart's fleet-wide monitors "
            "already scrape every TPUModelServer; enable this only without them, or series "
            "are scraped twice. Default: false."
        ),
    )
    service_monitor: bool = Field(
        default=False,
        description=(
            "serviceMonitor creates a ServiceMonitor for this server's router (port metrics "
            "of the endpoint Service), when that CRD is installed. Same caveat as podMonitor. "
            "Default: false."
        ),
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "labels added to the monitors so a Prometheus with a monitor selector finds them, "
            "for example {release: kube-prometheus-stack}."
        ),
    )


class PodTemplateOverrides(Schema):
    annotations: dict[str, str] = Field(
        default_factory=dict, description="annotations added to engine and router pods."
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "labels added to engine and router pods; keys the operator sets (app.kubernetes.io/"
            "*, model, tpu-*, serving.tpuserve.dev/*) are rejected with Valid=False."
        ),
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="nodeSelector entries added to the catalog's TPU node selector.",
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=32,
        json_schema_extra={"items": free_form("object")},
        description="tolerations added to the google.com/tpu toleration (core/v1 Toleration).",
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        json_schema_extra=free_form("object"),
        description="affinity of engine pods (core/v1 Affinity).",
    )
    priority_class_name: str | None = Field(
        default=None, max_length=253, description="priorityClassName of engine pods."
    )
    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description=(
            "serviceAccountName of engine pods, e.g. one bound to a Google service account by "
            "Workload Identity for gs:// sources. Default: the namespace's default account."
        ),
    )
    image_pull_secrets: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="imagePullSecrets: names of Secrets for pulling engine and router images.",
    )


class TPUModelServerSpec(Schema):
    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "has(self.tpu) || (has(self.slo) && has(self.demand))",
                "tpu is required unless slo and demand are set (the operator then sizes the "
                "server)",
            ),
            ("has(self.slo) == has(self.demand)", "slo and demand are set together"),
            (
                "!has(self.slo) || !has(self.disaggregation)",
                "slo sizes a colocated server; not with disaggregation",
            ),
        )
    )

    model: ModelSpec = Field(description="model is what to serve.")
    # Unset only with slo and demand: `slo_plan.resolve` fills it in before anything reads it
    # (`validation.validate`), so every validated spec has one and the type says so.
    tpu: TPUSpec = Field(  # type: ignore[assignment]
        default=None,
        description=(
            "tpu is the TPU slice serving one replica. Required unless slo and demand are set: "
            "then the operator chooses the slice (status.plan); set with them, the slice is "
            "yours and the operator sizes only the replicas."
        ),
    )
    replicas: int = Field(
        default=1,
        ge=0,
        le=1024,
        description=(
            "replicas is the number of replica groups; each is one whole slice (hosts of the "
            "topology, one pod per host). 0 keeps the router and Services but no engines. "
            "The scale subresource sets it (kubectl scale, HPA, KEDA). Default: 1."
        ),
    )
    engine: EngineSpec = section(
        EngineSpec, "engine configures the model server (SGLang on TorchTPU or the simulator)."
    )
    router: RouterSpec = section(
        RouterSpec, "router configures the prefix-aware router in front of the replicas."
    )
    kv_cache: KvCacheSpec | None = Field(
        default=None,
        description=(
            "kvCache configures the engines' KV cache beyond HBM: host adds a host-memory "
            "tier. Unset: HBM only."
        ),
    )
    autoscaling: AutoscalingSpec | None = Field(
        default=None,
        description=(
            "autoscaling makes the operator create a HorizontalPodAutoscaler (engine hpa) or a "
            "KEDA ScaledObject (engine keda) that scales this server's replicas (whole slices) "
            "through its scale subresource. It then owns spec.replicas: leave replicas out of "
            "applied manifests. Unset: no autoscaler."
        ),
    )
    rollout: RolloutSpec = section(
        RolloutSpec,
        "rollout controls how spec changes and restarts roll over replica groups: one group "
        "at a time by default, restarting every host of a slice together.",
    )
    monitoring: MonitoringSpec = section(
        MonitoringSpec, "monitoring objects for the Prometheus Operator."
    )
    template: PodTemplateOverrides = section(
        PodTemplateOverrides,
        "template holds pod overrides: annotations, labels, nodeSelector, tolerations, "
        "affinity, priorityClassName, serviceAccountName, imagePullSecrets.",
    )
    inference_pool: InferencePoolSpec | None = Field(
        default=None,
        description=(
            "inferencePool puts the server behind a gateway of the Gateway API Inference "
            "Extension: the operator creates an InferencePool (inference.networking.k8s.io/v1) "
            "named after the server, selecting its serving leaders on the engine port, whose "
            "endpoint picker is the server's router (`tpuserve router --picker-port`, the "
            "Service <name>-picker, port 9002). Route to it with an HTTPRoute backendRef of "
            "kind InferencePool (docs/gateway.md). Needs the router and the InferencePool CRD; "
            "not with spec.disaggregation (docs/pd.md). An InferencePool of that name the "
            "operator did not create is left alone. Default: unset, no pool."
        ),
    )
    disaggregation: DisaggregationSpec | None = Field(
        default=None,
        description=(
            "disaggregation splits the server into a prefill and a decode role, each its own "
            "replica groups (slices) with its own TPU shape, replicas and engine flags, routed "
            "as pairs (docs/pd.md). It then owns the replica count: spec.replicas is ignored "
            "and spec.autoscaling is not allowed (each role has its own autoscaling). Unset: "
            "every replica serves whole requests."
        ),
    )
    slo: SloSpec | None = Field(
        default=None,
        description=(
            "slo sizes the server, with demand: the operator's planner (the performance model, "
            'analytic: docs/capacity-planning.md, "The fit check") chooses the slice among '
            "the operator's --plan-slices (unless tpu is set) and the replicas for the peak, and "
            "writes its choice and operating point to status.plan; it plans again when the spec "
            "changes. Without autoscaling, replicas is the peak's count; with it, "
            "minReplicas and maxReplicas are the plan's bounds (maxReplicas as written stays a "
            "cap; minReplicas 0 stays 0). Needs a model the performance "
            "model knows (a built-in profile's source, or model.architecture). Unset: tpu and "
            "replicas are the size."
        ),
    )
    demand: DemandSpec | None = Field(
        default=None,
        description="demand is the load slo must hold at: the peak rate and the mean lengths.",
    )
