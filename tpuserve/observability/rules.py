"""tpuserve's recording rules and every rule group in evaluation order (`groups`): the one
definition of every `level:metric:operation` series. The alerts are `alert_rules`'; the SLO they
encode, the series names and the PromQL both share are `rule_basis`'.

`python -m tpuserve.observability.generate` writes these groups to
`charts/tpuserve/rules/tpuserve.rules.yaml`; the chart puts them into a PrometheusRule or GKE
Managed Prometheus ClusterRules and appends the `tpuserve.prices` group rendered from
`values.pricing` (prices are values, never literals in a rule or a dashboard). The promtool unit
tests for every rule live in `tests/metrics/promtool/rule_tests.py` (the alerts' in
`alert_rule_tests.py`).

Conventions (docs/observability.md explains each):
- names follow `level:metric:operation` (https://prometheus.io/docs/practices/rules/); the levels
  are `pod` (one model-server leader), `model` (`model_name`), `model_role` (`model_name`,
  `engine_type`: prefill, decode or unified), `tpu_generation`, `fleet`.
  Constant series that the chart renders from values use the `tpuserve:` prefix.
- token counters come from SGLang's tokenizer collector (one series per server); scheduler
  series are filtered to `tp_rank="0", pp_rank="0"` so tensor/pipeline-parallel ranks are never
  double counted.
- ratios divide by `(... > 0)` so an idle model has no ratio instead of NaN.
- the prefix-cache hit ratio is `cached_tokens / prompt_tokens` from counters, never the
  `sglang:cache_hit_rate` gauge (it is reset to 0 on every decode log).
- SLO thresholds sit on bucket boundaries of SGLang's default histograms, written as the float
  `le` labels prometheus_client emits.
- an engine without `sglang:` series (SGLang-JAX) is shown from the router's own per-worker
  series: each pod-level rule is `<from sglang:> or <from the router>`, the router's `worker`
  (`http://IP:PORT`) joined to the engine pod whose scrape target is that address (the
  PodMonitor scrapes the port the router dials), taking its pod labels from the engine's
  `up` series (`at_engine_pods`). `or` keeps an engine's own series wherever it has them.
"""

from __future__ import annotations

from sglang_tpu import metric_names as sg
from tpuserve.observability.alert_rules import (
    operator_alerts,
    router_alerts,
    sglang_alerts,
)
from tpuserve.observability.rule_basis import (
    ANSWERED,
    ITL_SLO_SECONDS,
    POD,
    RANK0,
    ROUTER_CACHED_TOKENS,
    ROUTER_COMPLETION_TOKENS,
    ROUTER_ENGINE_REQUESTS,
    ROUTER_KV_USAGE,
    ROUTER_PROMPT_TOKENS,
    ROUTER_REQUESTS,
    TTFT_SLO_SECONDS,
    Alert,
    Group,
    Recording,
    at_engine_pods,
    counter_rate,
    good_ratio,
    model_router,
    pod_rate,
    quantile,
)


def token_rules() -> Group:
    prompt, cached, generated = (
        sg.PROMPT_TOKENS.name,
        sg.CACHED_TOKENS.name,
        sg.GENERATION_TOKENS.name,
    )
    realtime = sg.REALTIME_TOKENS.name
    decode_rank0 = f'mode="decode", {RANK0}'
    rules: list[Recording | Alert] = [
        Recording(
            "pod:sglang_prompt_tokens:rate1m",
            pod_rate(prompt, ROUTER_PROMPT_TOKENS, "1m"),
            "Prompt (input) tokens/s of each model server, cached ones included (an engine "
            "without SGLang's series: the router's count of its answers' usage).",
        ),
        Recording(
            "pod:sglang_cached_tokens:rate1m",
            pod_rate(cached, ROUTER_CACHED_TOKENS, "1m"),
            "Prompt tokens/s served from the prefix cache, summed over cache tiers.",
        ),
        Recording(
            "pod:sglang_generation_tokens:rate1m",
            pod_rate(generated, ROUTER_COMPLETION_TOKENS, "1m"),
            "Output tokens/s counted when requests finish (lags by the request duration).",
        ),
        Recording(
            "pod:sglang_decode_tokens:rate1m",
            f"sum by ({POD}) ({counter_rate(realtime, '1m', decode_rank0)})\n"
            "or\npod:sglang_generation_tokens:rate1m",
            "Output tokens/s as decoded (SGLang's real-time counter, TP rank 0 only); falls back "
            "to the finish-time counter on servers without it, then to the router's count.",
        ),
    ]
    for what, doc in (
        ("prompt", "Prompt tokens/s"),
        ("cached", "Cached prompt tokens/s"),
        ("decode", "Output tokens/s"),
    ):
        rules.append(
            Recording(
                f"model:sglang_{what}_tokens:rate1m",
                f"sum by (model_name) (pod:sglang_{what}_tokens:rate1m)",
                f"{doc} per served model.",
            )
        )
        rules.append(
            Recording(
                f"tpu_generation:sglang_{what}_tokens:rate1m",
                f"sum by (tpu_generation) (pod:sglang_{what}_tokens:rate1m)",
                f"{doc} per TPU generation.",
            )
        )
        rules.append(
            Recording(
                f"fleet:sglang_{what}_tokens:rate1m",
                f"sum(pod:sglang_{what}_tokens:rate1m)",
                f"{doc} of the whole fleet.",
            )
        )
    rules += [
        Recording(
            "fleet:sglang_tokens:rate1m",
            "fleet:sglang_prompt_tokens:rate1m + fleet:sglang_decode_tokens:rate1m",
            "Input plus output tokens/s of the whole fleet: the headline number.",
        ),
        Recording(
            "model:sglang_requests:rate1m",
            f"sum by (model_name) ({counter_rate(sg.NUM_REQUESTS.name, '1m')})\nor\n"
            "sum by (model_name) ("
            + model_router(f"sum by (model) ({counter_rate(ROUTER_REQUESTS, '1m', ANSWERED)})")
            + ")",
            "Finished requests/s per model (an engine without SGLang's series: the requests "
            "the routers had answered by it).",
        ),
        Recording(
            "fleet:sglang_requests:rate1m",
            "sum(model:sglang_requests:rate1m)",
            "Finished requests/s of the whole fleet.",
        ),
    ]
    # Pod rates over the hit ratio's and the cost rules' windows, recorded once: each joins
    # the router's series to the engine pods for engines without SGLang's (`pod_rate`).
    for what, sglang, router, window, doc in (
        ("prompt", prompt, ROUTER_PROMPT_TOKENS, "5m", "Prompt tokens/s"),
        ("cached", cached, ROUTER_CACHED_TOKENS, "5m", "Cached prompt tokens/s"),
        ("prompt", prompt, ROUTER_PROMPT_TOKENS, "1h", "Prompt tokens/s"),
        ("generation", generated, ROUTER_COMPLETION_TOKENS, "1h", "Output tokens/s"),
    ):
        rules.append(
            Recording(
                f"pod:sglang_{what}_tokens:rate{window}",
                pod_rate(sglang, router, window),
                f"{doc} of each model server over {window} (what the hit ratio and the cost "
                "rules read).",
            )
        )
    pod_cached, pod_prompt = "pod:sglang_cached_tokens:rate5m", "pod:sglang_prompt_tokens:rate5m"
    for level, by in (
        ("pod", f"sum by ({POD})"),
        ("model", "sum by (model_name)"),
        ("fleet", "sum"),
    ):
        rules.append(
            Recording(
                f"{level}:sglang_prefix_cache_hit:ratio_rate5m",
                f"{by} ({pod_cached})\n  / ({by} ({pod_prompt}) > 0)",
                f"Share of prompt tokens served from the prefix cache ({level}), from counters.",
            )
        )
    return Group("tpuserve.tokens", tuple(rules))


def chip_and_cost_rules() -> Group:
    """Per-chip throughput and cost, from the operator's per-replica chip count.

    `tpuserve_replica_tpu_chips` counts the chips of a whole replica (slice) on its leader, so
    a 4-host 4x4 replica counts 16 once. Prices come from `tpuserve:tpu_chip_hour_price_usd`
    (rendered from values). Idle replicas count: the cost of an idle slice is real.
    """
    chips, info = "tpuserve_replica_tpu_chips", "tpuserve_replica_info"
    model_of = (
        f"on (namespace, pod) group_left (model_name) max by (namespace, pod, model_name) ({info})"
    )
    generated_1h = "pod:sglang_generation_tokens:rate1h"
    prompt_1h = "pod:sglang_prompt_tokens:rate1h"
    # Tokens of the models that own chips now (a model whose replicas are gone has no cost).
    owned = "and on (model_name) model:tpuserve_replica_tpu_chips:sum"
    served_tokens = (
        f"(\n  sum(sum by (model_name) ({generated_1h}) {owned})\n"
        f"  + sum(sum by (model_name) ({prompt_1h}) {owned})\n)"
    )
    price = "tpuserve:tpu_chip_hour_price_usd"
    rules: tuple[Recording | Alert, ...] = (
        Recording(
            "tpu_generation:tpuserve_replica_tpu_chips:sum",
            f"sum by (tpu_generation) ({chips})",
            "TPU chips owned by serving replicas, per generation.",
        ),
        Recording(
            "model:tpuserve_replica_tpu_chips:sum",
            f"sum by (model_name) (\n  {chips}\n    * {model_of}\n)",
            "TPU chips owned by serving replicas, per model.",
        ),
        Recording(
            "tpu_generation:sglang_decode_tokens_per_chip:rate1m",
            "tpu_generation:sglang_decode_tokens:rate1m\n"
            "  / on (tpu_generation) (tpu_generation:tpuserve_replica_tpu_chips:sum > 0)",
            "Output tokens/s per TPU chip, per generation: compares generations.",
        ),
        Recording(
            "model:sglang_decode_tokens_per_chip:rate1m",
            "model:sglang_decode_tokens:rate1m\n"
            "  / on (model_name) (model:tpuserve_replica_tpu_chips:sum > 0)",
            "Output tokens/s per TPU chip, per model.",
        ),
        Recording(
            "fleet:sglang_decode_tokens_per_chip:rate1m",
            f"fleet:sglang_decode_tokens:rate1m / (sum({chips}) > 0)",
            "Output tokens/s per TPU chip over the whole fleet.",
        ),
        Recording(
            "pod:tpuserve_tpu_cost_usd:per_hour",
            f"sum by (namespace, pod, tpu_generation) ({chips})\n"
            f"  * on (tpu_generation) group_left () {price}",
            "Hourly TPU cost of each replica: its chips times the generation's chip-hour price.",
        ),
        Recording(
            "model:tpuserve_tpu_cost_usd:per_hour",
            f"sum by (model_name) (\n  pod:tpuserve_tpu_cost_usd:per_hour\n    * {model_of}\n)",
            "Hourly TPU cost per model.",
        ),
        Recording(
            "tpu_generation:tpuserve_tpu_cost_usd:per_hour",
            "sum by (tpu_generation) (pod:tpuserve_tpu_cost_usd:per_hour)",
            "Hourly TPU cost per generation.",
        ),
        Recording(
            "fleet:tpuserve_tpu_cost_usd:per_hour",
            "sum(pod:tpuserve_tpu_cost_usd:per_hour)",
            "Hourly TPU cost of the whole fleet.",
        ),
        Recording(
            "model:tpuserve_cost_usd_per_1m_output_tokens:rate1h",
            "model:tpuserve_tpu_cost_usd:per_hour / 3600\n"
            f"  / on (model_name) (sum by (model_name) ({generated_1h}) > 0)\n"
            "  * 1e6",
            "US dollars per million output tokens per model, over the last hour.",
        ),
        Recording(
            "model:tpuserve_cost_usd_per_1m_tokens:rate1h",
            "model:tpuserve_tpu_cost_usd:per_hour / 3600\n"
            "  / on (model_name) (\n"
            f"    sum by (model_name) ({generated_1h})\n"
            f"    + sum by (model_name) ({prompt_1h}) > 0\n"
            "  )\n  * 1e6",
            "US dollars per million tokens (input plus output) per model, over the last hour.",
        ),
        Recording(
            "fleet:tpuserve_cost_usd_per_1m_output_tokens:rate1h",
            f"fleet:tpuserve_tpu_cost_usd:per_hour / 3600\n  / (sum({generated_1h}) > 0)\n  * 1e6",
            "US dollars per million output tokens over the whole fleet, over the last hour.",
        ),
        Recording(
            "fleet:tpuserve_cost_usd_per_1m_tokens:rate1h",
            f"fleet:tpuserve_tpu_cost_usd:per_hour / 3600\n  / ({served_tokens} > 0)\n  * 1e6",
            "US dollars per million tokens (input plus output) over the whole fleet, over the "
            "last hour.",
        ),
        Recording(
            "model:tpuserve_tokens_per_day_per_chip:rate1h",
            f"(\n  sum by (model_name) ({generated_1h})\n"
            f"  + sum by (model_name) ({prompt_1h})\n)\n  * 86400\n"
            "  / on (model_name) (model:tpuserve_replica_tpu_chips:sum > 0)",
            "Tokens (input plus output) per day per TPU chip per model, at the last hour's rate "
            "(the fleet figure capacity plans and `tpuserve plan` quote).",
        ),
        Recording(
            "fleet:tpuserve_tokens_per_day_per_chip:rate1h",
            f"{served_tokens} * 86400 / (sum({chips}) > 0)",
            "Tokens (input plus output) per day per TPU chip over the whole fleet, at the last "
            "hour's rate (tokens of the models that own chips now).",
        ),
    )
    return Group("tpuserve.chips", rules)


def latency_rules() -> Group:
    ttft, itl, e2e = sg.TIME_TO_FIRST_TOKEN, sg.INTER_TOKEN_LATENCY, sg.E2E_REQUEST_LATENCY
    rules: list[Recording | Alert] = []
    for short, hist, quantiles in (
        ("ttft", ttft, (0.5, 0.9, 0.99)),
        ("itl", itl, (0.5, 0.99)),
        ("e2e", e2e, (0.5, 0.99)),
        ("queue_time", sg.QUEUE_TIME, (0.99,)),
    ):
        for q in quantiles:
            rules.append(
                Recording(
                    f"model:sglang_{short}_seconds:p{round(q * 100)}_5m",
                    quantile(q, hist, "5m"),
                    f"{round(q * 100)}th percentile of {hist.documentation.lower().rstrip('.')}"
                    " per model, over 5 minutes.",
                )
            )
    # By role: prefill, decode (disaggregated engines) or unified (colocated), SGLang's
    # engine_type label. A decode engine's TTFT includes its wait for the prefill and the KV.
    # The prefill role's p90 TTFT drives its autoscaler (render/autoscaler.py, metric ttft).
    for short, hist, quantiles in (("ttft", ttft, (0.5, 0.9, 0.99)), ("itl", itl, (0.5, 0.99))):
        for q in quantiles:
            rules.append(
                Recording(
                    f"model_role:sglang_{short}_seconds:p{round(q * 100)}_5m",
                    quantile(q, hist, "5m", by="model_name, engine_type"),
                    f"{round(q * 100)}th percentile of {hist.documentation.lower().rstrip('.')}"
                    " per model and engine role (engine_type: prefill, decode, unified), over 5 "
                    "minutes.",
                )
            )
    for window in ("5m", "30m", "1h", "6h"):
        rules.append(
            Recording(
                f"model:sglang_ttft_good:ratio_rate{window}",
                good_ratio(ttft, TTFT_SLO_SECONDS, window),
                f"Share of requests with TTFT <= {TTFT_SLO_SECONDS} s per model, over {window} "
                "(the SLI of the TTFT SLO).",
            )
        )
    for window in ("5m", "1h"):
        rules.append(
            Recording(
                f"model:sglang_itl_good:ratio_rate{window}",
                good_ratio(itl, ITL_SLO_SECONDS, window),
                f"Share of output tokens with inter-token latency <= {ITL_SLO_SECONDS} s per "
                f"model, over {window} (token-weighted, as SGLang's histogram is).",
            )
        )
    return Group("tpuserve.latency", tuple(rules))


def autoscaling_rules() -> Group:
    """The series KEDA's triggers read (`tpuserve_operator.render.autoscaler`): queued prefill
    tokens for backlogSeconds (SGLang counts waiting requests, not their tokens, so each
    waiting request is taken at the server's mean uncached prompt over 5 minutes; the trigger
    divides by the replica's peak prefill throughput, a per-server figure) and KV-pool
    occupancy for kvCacheUsage. `engine_type` is kept so a prefill role's trigger reads its own
    engines."""
    by = f"{POD}, engine_type"
    prompt, cached, requests = sg.PROMPT_TOKENS.name, sg.CACHED_TOKENS.name, sg.NUM_REQUESTS.name
    router_prompt, router_cached, router_requests = (
        at_engine_pods(f"sum by (worker) ({counter_rate(name, '5m', sel)})", by=by, role=True)
        for name, sel in (
            (ROUTER_PROMPT_TOKENS, ""), (ROUTER_CACHED_TOKENS, ""), (ROUTER_REQUESTS, ANSWERED)
        )
    )  # fmt: skip

    def engine_gauge(spec: sg.MetricSpec, router: str) -> str:
        own = f"max by ({by}) ({spec.name}{{{RANK0}}})"
        fallback = at_engine_pods(f"max by (worker) ({router})", agg="max", by=by, role=True)
        return f"{own}\nor\n{fallback}"

    rules: list[Recording | Alert] = [
        Recording(
            "pod:sglang_uncached_prompt_tokens_per_request:ratio_rate5m",
            f"(sum by ({by}) ({counter_rate(prompt, '5m')}) - "
            f"sum by ({by}) ({counter_rate(cached, '5m')}))\n"
            f"  / (sum by ({by}) ({counter_rate(requests, '5m')}) > 0)\nor\n"
            f"(\n{router_prompt}\n-\n{router_cached}\n)\n  / (\n{router_requests}\n > 0)",
            "Mean prompt tokens per finished request that the prefix cache did not serve "
            "(prefill work per request), over 5 minutes.",
        ),
        Recording(
            "pod:sglang_running_requests:max",
            engine_gauge(sg.NUM_RUNNING_REQS, ROUTER_ENGINE_REQUESTS + '{state="running"}'),
            "Requests a model server is decoding or prefilling (an engine without SGLang's "
            "series: its own count as the router's load poll read it).",
        ),
        Recording(
            "pod:sglang_queued_requests:max",
            engine_gauge(sg.NUM_QUEUE_REQS, ROUTER_ENGINE_REQUESTS + '{state="waiting"}'),
            "Requests waiting in a model server's scheduler queue (likewise).",
        ),
        Recording(
            "pod:sglang_queued_prefill_tokens:estimate",
            "pod:sglang_queued_requests:max\n"
            "  * pod:sglang_uncached_prompt_tokens_per_request:ratio_rate5m",
            "Prefill tokens waiting on a model server: waiting requests x mean uncached prompt "
            "tokens per request (KEDA's backlogSeconds divides it by the replica's throughput).",
        ),
        Recording(
            "model:sglang_queued_prefill_tokens:sum",
            "sum by (model_name) (pod:sglang_queued_prefill_tokens:estimate)",
            "Prefill tokens waiting per model.",
        ),
        Recording(
            "pod:sglang_kv_usage:ratio",
            engine_gauge(sg.TOKEN_USAGE, ROUTER_KV_USAGE),
            "Share of a model server's KV pool in use (KEDA's kvCacheUsage).",
        ),
        Recording(
            "model:sglang_kv_usage:avg",
            "avg by (model_name) (pod:sglang_kv_usage:ratio)",
            "Mean share of the KV pool in use over a model's servers.",
        ),
    ]
    return Group("tpuserve.autoscaling", tuple(rules))


def groups() -> tuple[Group, ...]:
    """Every rule group, in evaluation order (later groups read earlier groups' series)."""
    return (
        token_rules(),
        chip_and_cost_rules(),
        latency_rules(),
        autoscaling_rules(),
        sglang_alerts(),
        router_alerts(),
        operator_alerts(),
    )


def rule_file() -> dict[str, object]:
    return {"groups": [g.to_group() for g in groups()]}


def recording_rules() -> list[Recording]:
    return [r for g in groups() for r in g.rules if isinstance(r, Recording)]


def alerts() -> list[Alert]:
    return [r for g in groups() for r in g.rules if isinstance(r, Alert)]
