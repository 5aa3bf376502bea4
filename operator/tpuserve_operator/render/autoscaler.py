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

How fast replicas change is the HPA's `behavior`, `tpuserve_operator.scaling_behavior` (the
object the fleet model applies too): scale-up the most of `scaleUpPods` (4) and
`scaleUpPercent` (100 %) per 15 s, Kubernetes' default, since a slice serves minutes after it
is asked for; scale-down, after `scaleDownStabilizationSeconds` (5 minutes) of lower demand,
the most of `scaleDownPods` (1) and `scaleDownPercent` (10 %) per minute, so a fleet of any
size sheds a burst's excess in minutes. (Until 2026-12-07 it was one slice a minute both
ways, whatever the fleet's size.)

A disaggregated server has no server-wide autoscaler: each role with
`spec.disaggregation.<role>.autoscaling` gets its own HPA, `<name>-<role>`, targeting the
role's TPUModelServerRole (`render.roles.role_scales`), whose scale selector is the role's
leaders, so `queue` and `tokensInFlight` average over that role's leaders (tokensInFlight per
chip of the role's slice); `ttft` (prefill only) reads `model_role:sglang_ttft_seconds:p90_5m`
of the served model's `engine_type="prefill"` engines.

With `autoscaling.engine: keda` the same target gets a KEDA `ScaledObject` (keda.sh/v1alpha1)
instead: KEDA's operator turns it into an HPA of its own (`keda-hpa-<name>`) fed by KEDA's
metrics server, so no metrics adapter is involved, and the trigger is a Prometheus query
rendered here (`keda_query`, against the chart's recording rules, `RenderConfig.
keda_prometheus_url`). Two more metrics are KEDA's only:

- `backlogSeconds`: queued prefill tokens (`pod:sglang_queued_prefill_tokens:estimate`:
  waiting requests x uncached prompt tokens per request over 5 minutes) divided by one
  replica's peak prefill throughput, `autoscaling.prefillTokensPerSecond` or, unset, the
  performance model's figure for the model and slice
  (`sglang_tpu.perf_model.peak_prefill_tokens_per_second`, computed here at render time and
  written on the ScaledObject's annotations with where it came from), against `target`
  seconds per replica (KEDA's AverageValue: replicas = ceil(backlog seconds / target));
- `kvCacheUsage`: the share of each replica's KV pool in use (`sglang:token_usage`), summed
  over the replicas against `target` per replica.

`ttft` under KEDA is the SLO mode: p90 TTFT / target (the SLO), threshold 1, metricType
Value (replicas = ceil(current x ratio)). Scale-up and scale-down behaviour is the HPA's
above (`advanced.horizontalPodAutoscalerConfig.behavior`); KEDA keeps at least one replica
(`minReplicas` 0 is refused with KEDA: the operator owns 0 <-> 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_tpu import disaggregation as pd
from sglang_tpu import metric_names, perf_model
from sglang_tpu.model_source import model_id
from sglang_tpu.topology import SliceShape, lookup
from tpuserve_operator import disaggregation, labels, model_profile, scaling_behavior
from tpuserve_operator.api import AutoscalingSpec, PredictiveFloorSpec, TPUModelServerSpec
from tpuserve_operator.errors import Problem
from tpuserve_operator.render.context import Manifest, RenderConfig, Server
from tpuserve_operator.render.roles import role_scale_name

QUEUE_METRIC = metric_names.NUM_QUEUE_REQS.name
TOKENS_IN_FLIGHT_METRIC = metric_names.NUM_USED_TOKENS.name
TTFT_METRIC = "model:sglang_ttft_seconds:p90_5m"
"""A recording rule of the chart (tpuserve.observability.rules; a test checks it exists)."""
ROLE_TTFT_METRIC = "model_role:sglang_ttft_seconds:p90_5m"
"""The same per engine role (SGLang's engine_type label), for a prefill role's HPA."""
ENGINE_TYPE = "engine_type"
QUEUED_PREFILL_TOKENS = "pod:sglang_queued_prefill_tokens:estimate"
KV_USAGE = "pod:sglang_kv_usage:ratio"
"""Recording rules of the chart (tpuserve.observability.rules `autoscaling_rules`)."""
KEDA_API_VERSION = "keda.sh/v1alpha1"
KEDA_KIND = "ScaledObject"
KEDA_PLURAL = "scaledobjects"
PREFILL_THROUGHPUT_ANNOTATION = f"{labels.GROUP}/prefill-tokens-per-second"
PREFILL_SOURCE_ANNOTATION = f"{labels.GROUP}/prefill-tokens-per-second-source"
NO_KEDA_CRD = (
    f"keda needs KEDA's {KEDA_KIND} API ({KEDA_PLURAL}.keda.sh), which this cluster does not "
    "serve; allowed: KEDA installed (docs/operator.md, Autoscaling with KEDA), or engine hpa"
)
NO_THROUGHPUT = (
    "backlogSeconds needs one replica's peak prefill throughput, and the performance model "
    "does not know {model!r}; allowed: autoscaling.prefillTokensPerSecond set (from a "
    "calibration run), or a model the performance model knows"
)


@dataclass(frozen=True, slots=True)
class Throughput:
    """One replica's peak prefill throughput and where the figure came from."""

    tokens_per_second: float
    source: str


def prefill_throughput(
    spec: TPUModelServerSpec, autoscaling: AutoscalingSpec, shape: SliceShape
) -> Throughput | None:
    """`autoscaling.prefillTokensPerSecond`, else the performance model's figure for the
    served model on ``shape``; None when neither is known."""
    if autoscaling.prefill_tokens_per_second is not None:
        given = autoscaling.prefill_tokens_per_second
        return Throughput(given, "autoscaling.prefillTokensPerSecond")
    profile = model_profile.profile_of(spec)
    if profile is None:
        return None
    quantization, kv_dtype = spec.model.quantization, spec.engine.kv_cache_dtype
    try:
        value = perf_model.peak_prefill_tokens_per_second(shape, profile, quantization, kv_dtype)
    except ValueError:  # a quantization or KV dtype the performance model does not cover
        return None
    return Throughput(
        round(value),
        f"sglang_tpu.perf_model.peak_prefill_tokens_per_second: {profile.name} {quantization} "
        f"on {shape.generation.name} {shape.topology} ({shape.chips} chips), "
        f"{perf_model.BACKLOG_CHUNK_TOKENS}-token prefill steps of "
        f"{perf_model.BACKLOG_PROMPT_TOKENS}-token prompts",
    )


Scaled = tuple[str, AutoscalingSpec, SliceShape, str | None]


def _scaled(spec: TPUModelServerSpec) -> list[Scaled]:
    """(field, autoscaling, slice, role) of every autoscaler the spec asks for."""
    if spec.disaggregation is None:
        if spec.autoscaling is None:
            return []
        shape = lookup(spec.tpu.generation, spec.tpu.topology)
        return [("spec.autoscaling", spec.autoscaling, shape, None)]
    out: list[Scaled] = []
    for role in disaggregation.autoscaled_roles(spec):
        part = disaggregation.role_of(spec, role)
        assert part.autoscaling is not None
        tpu = part.tpu or spec.tpu
        shape = lookup(tpu.generation, tpu.topology)
        out.append((f"spec.disaggregation.{role}.autoscaling", part.autoscaling, shape, role))
    return out


def autoscaler_problems(spec: TPUModelServerSpec, config: RenderConfig) -> list[Problem]:
    """KEDA chosen on a cluster without its CRDs (the ScaledObject would have no API), and
    backlogSeconds with no throughput to divide by."""
    problems = []
    for field, autoscaling, shape, _ in _scaled(spec):
        if autoscaling.engine == "keda" and not config.keda:
            problems.append(Problem(f"{field}.engine", NO_KEDA_CRD))
        if autoscaling.metric == "backlogSeconds" and (
            prefill_throughput(spec, autoscaling, shape) is None
        ):
            model = model_id(spec.model.source)
            problems.append(Problem(f"{field}.metric", NO_THROUGHPUT.format(model=model)))
    return problems


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
    """The server's HPA or ScaledObject (or, disaggregated, each autoscaled role's); none
    when unset."""
    out = []
    for _, autoscaling, shape, role in _scaled(server.valid.spec):
        if role is None:
            name, target = server.name, (labels.KIND, server.name)
        else:
            name = role_scale_name(server.name, role)
            target = (labels.ROLE_KIND, name)
        if autoscaling.engine == "keda":
            out.append(_scaled_object(server, name, target, autoscaling, shape, role))
        else:
            out.append(_hpa(server, name, target, autoscaling, shape.chips, role))
    return out


@dataclass(frozen=True, slots=True)
class FlooredScaledObject:
    """A ScaledObject with a predictive floor: its reactive trigger is the first (KEDA names
    its metric ``s0-prometheus``), the floor the second (``s1-prometheus``)."""

    name: str
    role: str | None
    spec: AutoscalingSpec
    floor: PredictiveFloorSpec
    reactive: KedaTrigger


def floored_scaled_objects(server: Server) -> list[FlooredScaledObject]:
    """Each ScaledObject `autoscaler` renders with a predictive floor."""
    out = []
    for _, autoscaling, shape, role in _scaled(server.valid.spec):
        keda = autoscaling.keda
        if autoscaling.engine != "keda" or keda is None or keda.predictive_floor is None:
            continue
        name = server.name if role is None else role_scale_name(server.name, role)
        reactive = keda_trigger(server, autoscaling, shape, role)
        out.append(FlooredScaledObject(name, role, autoscaling, keda.predictive_floor, reactive))
    return out


def behavior_of(spec: AutoscalingSpec) -> scaling_behavior.Behavior:
    """The `scaling_behavior.Behavior` ``spec`` asks for (the object the fleet model applies)."""
    return scaling_behavior.behavior(
        scale_up_pods=spec.scale_up_pods,
        scale_up_percent=spec.scale_up_percent,
        scale_down_pods=spec.scale_down_pods,
        scale_down_percent=spec.scale_down_percent,
        stabilization_seconds=spec.scale_down_stabilization_seconds,
    )


def _behavior(spec: AutoscalingSpec) -> Manifest:
    return behavior_of(spec).manifest()


def _selector(server: Server, role: str | None) -> str:
    """The PromQL label matchers of the server's (or role's) engines."""
    pairs = [("namespace", server.namespace), ("model_name", server.valid.served_name)]
    if role is not None:
        pairs.append((ENGINE_TYPE, role))
    return ", ".join(f'{k}="{_promql_escape(v)}"' for k, v in pairs)


def _promql_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


@dataclass(frozen=True, slots=True)
class KedaTrigger:
    """One Prometheus trigger: its name, query, threshold and KEDA metric type."""

    name: str
    query: str
    threshold: float
    metric_type: str  # AverageValue: replicas = ceil(value / threshold); Value: x current
    throughput: Throughput | None = None


def keda_trigger(
    server: Server, spec: AutoscalingSpec, shape: SliceShape, role: str | None
) -> KedaTrigger:
    """The trigger for ``spec.metric``; every query sums over the server's (role's) engines."""
    sel = _selector(server, role)
    rank0 = 'tp_rank="0", pp_rank="0"'
    if spec.metric == "queue":
        query = f"sum({QUEUE_METRIC}{{{sel}, {rank0}}})"
        return KedaTrigger("queue", query, spec.target, "AverageValue")
    if spec.metric == "tokensInFlight":
        query = f"sum({TOKENS_IN_FLIGHT_METRIC}{{{sel}, {rank0}}})"
        return KedaTrigger("tokens-in-flight", query, spec.target * shape.chips, "AverageValue")
    if spec.metric == "kvCacheUsage":
        return KedaTrigger("kv-cache-usage", f"sum({KV_USAGE}{{{sel}}})", spec.target,
                           "AverageValue")  # fmt: skip
    if spec.metric == "backlogSeconds":
        throughput = prefill_throughput(server.valid.spec, spec, shape)
        assert throughput is not None  # autoscaler_problems refused the spec otherwise
        tps = quantity(throughput.tokens_per_second)
        query = f"sum({QUEUED_PREFILL_TOKENS}{{{sel}}}) / {tps}"
        return KedaTrigger("backlog-seconds", query, spec.target, "AverageValue", throughput)
    ttft = TTFT_METRIC if role is None else ROLE_TTFT_METRIC
    ttft_sel = f'model_name="{_promql_escape(server.valid.served_name)}"'
    if role is not None:
        ttft_sel += f', {ENGINE_TYPE}="{role}"'
    query = f"max({ttft}{{{ttft_sel}}}) / {quantity(spec.target)}"
    return KedaTrigger("ttft-slo", query, 1.0, "Value")


FLOOR_MAX_GROWTH = 4
"""The trend's forecast is at most this many times the window's mean rate (AIBrix's clamp;
`tpuserve_operator.predictive_floor.FloorParams.max_growth`)."""
DAY_SECONDS = 86_400
FLOOR_STEP_SECONDS = 30
"""The floor's subqueries sample the one-minute request rate this often."""


def floor_trigger(server: Server, floor: PredictiveFloorSpec, role: str | None) -> KedaTrigger:
    """`autoscaling.keda.predictiveFloor` as a Prometheus trigger: the request rate one horizon
    ahead (`tpuserve_operator.predictive_floor`'s rule in PromQL, yesterday's measured rate as
    the daily shape) against requestsPerReplica.

    The trend is `predictive_floor.trend_forecast`'s: the line through the medians of the
    window's two halves (``quantile_over_time(0.5, ...)`` of the one-minute rate every 30 s
    over each half), not ``predict_linear``'s least squares, which read a one-minute burst as a
    ramp. A half's median stands for its median sample time, ``(half - 30 s) / 2`` before the
    half's end (the subquery's steps are regular), so the halves' points are ``half`` apart;
    while the older half has no data yet (a new server) the line is flat, as in the model."""
    sel = _selector(server, role)
    h, w = floor.horizon_seconds, floor.window_seconds
    half = w // 2
    lag = max(0, half - FLOOR_STEP_SECONDS) / 2
    requests = metric_names.NUM_REQUESTS.name
    rate = f"(sum(rate({requests}{{{sel}}}[1m])))"
    window = f"{rate}[{w}s:{FLOOR_STEP_SECONDS}s]"
    recent = f"quantile_over_time(0.5, {rate}[{half}s:{FLOOR_STEP_SECONDS}s])"
    older = f"quantile_over_time(0.5, {rate}[{half}s:{FLOOR_STEP_SECONDS}s] offset {half}s)"
    diff = f"({recent} - ({older} or {recent}))"
    ahead = f"({recent} + {diff} * {h + lag:g} / {half})"
    cap = f"({FLOOR_MAX_GROWTH} * avg_over_time({window}))"
    # the lesser of two one-element vectors: PromQL's clamp_max takes a scalar bound only
    trend = f"clamp_min((({ahead} <= {cap}) or {cap}), 0)"
    level = f"clamp_min(({recent} + {diff} * {lag:g} / {half}), 0)"
    later = f"sum(rate({requests}{{{sel}}}[5m] offset {DAY_SECONDS - h}s))"
    same = f"sum(rate({requests}{{{sel}}}[5m] offset {DAY_SECONDS}s))"
    shaped = f"({level} * {later} / ({same} > 0))"
    query = f"(({trend} >= {shaped}) or {shaped}) or {trend}"
    if floor.peak_window_seconds is not None:
        # the highest one-minute rate of the peak window, along yesterday's shape when known
        peak = (
            f"max_over_time((sum(rate({requests}{{{sel}}}[1m])))[{floor.peak_window_seconds}s:30s])"
        )
        held = f"(({peak} * {later} / ({same} > 0)) or {peak})"
        query = f"((({query}) >= {held}) or {held}) or ({query})"
    return KedaTrigger("predictive-floor", query, floor.requests_per_replica, "AverageValue")


ROUTER_HELD = "tpuserve_router_held_requests"
ROUTER_REQUESTS = "tpuserve_router_requests_total"
DEMAND_THRESHOLD = 1_000_000
"""The router-demand trigger's AverageValue target: far above any request rate, so it asks for
one replica at most and only activates (KEDA scales 0 -> 1 when any trigger is above 0)."""


def demand_trigger(server: Server) -> KedaTrigger:
    """With minReplicas 0, KEDA owns 0 <-> 1: a trigger active while the server's routers hold
    requests (the hold queue at zero) or answered any in the last minute; at zero no engine
    reports, so the other triggers read 0 and this one activates. Idle (every trigger at 0) for
    the ScaledObject's cooldownPeriod (scaleToZero.idleSeconds), KEDA scales to 0."""
    sel = f'namespace="{_promql_escape(server.namespace)}", '
    sel += f'model="{_promql_escape(server.valid.served_name)}"'
    held = f"(sum({ROUTER_HELD}{{{sel}}}) or vector(0))"
    answered = f"(sum(rate({ROUTER_REQUESTS}{{{sel}}}[1m])) or vector(0))"
    return KedaTrigger("router-demand", f"{held} + {answered}", DEMAND_THRESHOLD, "AverageValue")


def _scaled_object(
    server: Server, name: str, target: tuple[str, str], spec: AutoscalingSpec,
    shape: SliceShape, role: str | None,
) -> Manifest:  # fmt: skip
    extra = {} if role is None else {pd.PD_ROLE_LABEL: role}
    trigger = keda_trigger(server, spec, shape, role)
    annotations = {}
    if trigger.throughput is not None:
        annotations = {
            PREFILL_THROUGHPUT_ANNOTATION: quantity(trigger.throughput.tokens_per_second),
            PREFILL_SOURCE_ANNOTATION: trigger.throughput.source,
        }
    keda = spec.keda
    polling = keda.polling_interval_seconds if keda is not None else 15
    triggers = [trigger]
    if keda is not None and keda.predictive_floor is not None:
        triggers.append(floor_trigger(server, keda.predictive_floor, role))
    if spec.min_replicas == 0:
        triggers.append(demand_trigger(server))
    body: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": labels.API_VERSION, "kind": target[0], "name": target[1]},
        "pollingInterval": polling,
        "minReplicaCount": spec.min_replicas,
        **({"cooldownPeriod": spec.scale_to_zero.idle_seconds} if spec.min_replicas == 0 else {}),
        "maxReplicaCount": spec.max_replicas,
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(spec)}},
        "triggers": [
            {
                "type": "prometheus",
                "name": t.name,
                "metricType": t.metric_type,
                "metadata": {
                    "serverAddress": server.config.keda_prometheus_url,
                    "query": t.query,
                    "threshold": quantity(t.threshold),
                },
            }
            for t in triggers
        ],
    }
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": KEDA_KIND,
        "metadata": server.metadata(name, labels.COMPONENT_MODEL_SERVER, extra, annotations),
        "spec": body,
    }


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
            "behavior": _behavior(spec),
        },
    }
