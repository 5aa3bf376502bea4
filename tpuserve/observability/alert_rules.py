"""The alerts: the TTFT SLO's multi-window burn rates and the engines' health (`sglang_alerts`),
the routers' (`router_alerts`) and the operator's (`operator_alerts`). Each group is one
`rule_basis.Group`; `rules.groups` puts them after the recording rules they read."""

from __future__ import annotations

from tpuserve.observability.rule_basis import (
    FAST_BURN_RATE,
    OPERATOR_RECONCILES,
    ROUTER_DEMAND_SIGNALS,
    ROUTER_KV_EVENT_GAPS,
    ROUTER_REQUESTS,
    ROUTER_UPSTREAM_ERRORS,
    ROUTER_WORKER_HEALTHY,
    SLO_OBJECTIVE,
    SLOW_BURN_RATE,
    TTFT_SLO_SECONDS,
    UNSCHEDULABLE_PODS,
    Alert,
    Group,
    Recording,
    counter_rate,
)


def _burn(window: str, rate: float) -> str:
    return (
        f"(1 - model:sglang_ttft_good:ratio_rate{window}) > {rate} * {round(1 - SLO_OBJECTIVE, 6)}"
    )


def sglang_alerts() -> Group:
    budget = f"{round((1 - SLO_OBJECTIVE) * 100, 4)} %"
    rules: tuple[Recording | Alert, ...] = (
        Alert(
            "TPUServeTTFTBudgetFastBurn",
            f"{_burn('1h', FAST_BURN_RATE)}\nand\n{_burn('5m', FAST_BURN_RATE)}",
            "2m",
            "critical",
            "{{ $labels.model_name }} burns its TTFT error budget 14.4x too fast",
            f"More than {FAST_BURN_RATE} x {budget} of requests to {{{{ $labels.model_name }}}} "
            f"took longer than {TTFT_SLO_SECONDS} s to the first token over both the last hour "
            "and the last 5 minutes: at this rate the 30-day budget is gone in about 2 days. "
            "Check queue backlog and replicas.",
        ),
        Alert(
            "TPUServeTTFTBudgetSlowBurn",
            f"{_burn('6h', SLOW_BURN_RATE)}\nand\n{_burn('30m', SLOW_BURN_RATE)}",
            "15m",
            "warning",
            "{{ $labels.model_name }} burns its TTFT error budget 6x too fast",
            f"More than {SLOW_BURN_RATE} x {budget} of requests to {{{{ $labels.model_name }}}} "
            f"took longer than {TTFT_SLO_SECONDS} s to the first token over the last 6 hours "
            "and the last 30 minutes: the 30-day budget lasts about 5 days at this rate.",
        ),
        Alert(
            "TPUServeQueueBacklog",
            "max by (namespace, pod, model_name) (pod:sglang_queued_requests:max) > 0\n"
            "and on (namespace, pod, model_name)\n"
            "max by (namespace, pod, model_name) (pod:sglang_kv_usage:ratio) > 0.9",
            "10m",
            "warning",
            "{{ $labels.pod }} has a queue while its KV cache is over 90 % full",
            "Requests wait in the scheduler queue of {{ $labels.namespace }}/{{ $labels.pod }} "
            "({{ $labels.model_name }}) while its KV pool is nearly full: the replica is "
            "saturated. Add replicas, or check that the router spreads load.",
        ),
        Alert(
            "TPUServePrefixHitRatioCollapse",
            "model:sglang_prefix_cache_hit:ratio_rate5m\n"
            "  < 0.5 * avg_over_time(model:sglang_prefix_cache_hit:ratio_rate5m[6h] offset 15m)\n"
            "and\navg_over_time(model:sglang_prefix_cache_hit:ratio_rate5m[6h] offset 15m) > 0.2",
            "15m",
            "warning",
            "Prefix-cache hit ratio of {{ $labels.model_name }} fell below half its 6-hour level",
            "The share of prompt tokens of {{ $labels.model_name }} served from the prefix cache "
            "fell below half its average over the 6 hours before. Typical causes: the router "
            "lost its prefix state (restart, KV-event gap), replicas were restarted or "
            "flushed, or the traffic mix changed.",
        ),
        Alert(
            "TPUServeModelServerDown",
            'up{job=~".*model-server"} == 0',
            "5m",
            "critical",
            "Model server {{ $labels.namespace }}/{{ $labels.pod }} cannot be scraped",
            "Prometheus has not reached /metrics of {{ $labels.namespace }}/{{ $labels.pod }} "
            "for 5 minutes: the engine crashed, hangs, or the pod is gone.",
        ),
    )
    return Group("tpuserve.alerts.engine", rules)


ROUTER_ERROR_RATIO = 0.05


def _demand_writes(result: str) -> str:
    """Routers with demand-Lease writes of `result` in the last 5 minutes."""
    return (
        f'sum by (namespace, pod) (increase({ROUTER_DEMAND_SIGNALS}{{result="{result}"}}[5m])) > 0'
    )


def router_alerts() -> Group:
    rules: tuple[Recording | Alert, ...] = (
        Alert(
            "TPUServeNoReadyReplicas",
            f"sum by (namespace, model) ({ROUTER_WORKER_HEALTHY}) == 0",
            "2m",
            "critical",
            "No ready replica serves {{ $labels.model }} in {{ $labels.namespace }}",
            "The router of {{ $labels.model }} in {{ $labels.namespace }} has had no healthy "
            "worker for 2 minutes: every request fails. Check the TPUModelServer's status "
            "conditions and its pods (unschedulable, crash-looping, still compiling).",
        ),
        Alert(
            "TPUServeRouterUpstreamErrors",
            f"sum by (namespace, pod) ({counter_rate(ROUTER_UPSTREAM_ERRORS, '5m')})\n"
            f"  / (sum by (namespace, pod) ({counter_rate(ROUTER_REQUESTS, '5m')}) > 0)\n"
            f"> {ROUTER_ERROR_RATIO}",
            "5m",
            "warning",
            "Router {{ $labels.pod }} sees upstream errors on over 5 % of requests",
            "More than 5 % of the requests router {{ $labels.namespace }}/{{ $labels.pod }} "
            "forwarded hit an upstream error (connect, reset, timeout, broken stream) over 5 "
            "minutes. Check the model servers' health and logs.",
        ),
        Alert(
            "TPUServeKVEventGaps",
            f"sum by (namespace, pod, worker) (increase({ROUTER_KV_EVENT_GAPS}[10m])) > 0",
            "1m",
            "warning",
            "Router {{ $labels.pod }} misses KV events from {{ $labels.worker }}",
            "Router {{ $labels.namespace }}/{{ $labels.pod }} saw gaps in the KV-event sequence "
            "of worker {{ $labels.worker }} in the last 10 minutes: its prefix index for that "
            "worker is stale until a replay or resync, so prefix hits drop.",
        ),
        Alert(
            "TPUServeDemandSignalFailing",
            f"{_demand_writes('failed')}\nunless on (namespace, pod)\n{_demand_writes('ok')}",
            "5m",
            "critical",
            "Router {{ $labels.pod }} cannot renew its demand Lease",
            "Every write of the demand Lease by router {{ $labels.namespace }}/{{ $labels.pod }} "
            "has failed for 5 minutes: the operator does not see this router's traffic, so a "
            "server with minReplicas 0 is not activated by requests held at zero, and a busy "
            "one is scaled to zero after its idle period. Check the router's Role (get and "
            "patch on the Lease `<server>-demand`) and the router's log.",
        ),
    )
    return Group("tpuserve.alerts.router", rules)


def operator_alerts() -> Group:
    rules: tuple[Recording | Alert, ...] = (
        Alert(
            "TPUServeOperatorReconcileErrors",
            f'sum by (namespace, pod) (increase({OPERATOR_RECONCILES}{{result="error"}}[10m])) > 0',
            "15m",
            "warning",
            "Operator {{ $labels.pod }} keeps failing to reconcile TPUModelServers",
            "Reconcile passes of operator {{ $labels.namespace }}/{{ $labels.pod }} have failed "
            "with Kubernetes API errors in every 10-minute window for 15 minutes: changes to "
            "TPUModelServers are not being applied. Its log names the server and the error "
            "(RBAC, quota, admission webhook, apiserver availability).",
        ),
        Alert(
            "TPUServeTPUPodsUnschedulable",
            "max by (namespace, tpumodelserver, tpu_generation, tpu_topology) "
            f"({UNSCHEDULABLE_PODS}) > 0",
            "15m",
            "warning",
            "Pods of {{ $labels.namespace }}/{{ $labels.tpumodelserver }} cannot be scheduled "
            "on TPU {{ $labels.tpu_generation }} {{ $labels.tpu_topology }}",
            "Pods of TPUModelServer {{ $labels.namespace }}/{{ $labels.tpumodelserver }} have "
            "been unschedulable for 15 minutes: no node pool of TPU "
            "{{ $labels.tpu_generation }} with topology {{ $labels.tpu_topology }} has room "
            "(longer than a cluster-autoscaler scale-up takes). Add or resize a matching node "
            "pool, check TPU quota and reservations, or lower replicas. The server's Degraded "
            "condition carries the scheduler's message.",
        ),
    )
    return Group("tpuserve.alerts.operator", rules)
