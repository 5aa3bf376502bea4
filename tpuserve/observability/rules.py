"""tpuserve's recording rules and alerts: the one definition of every `level:metric:operation`
series, every alert, and the SLO they encode.

`python -m tpuserve.observability.generate` writes these groups to
`charts/tpuserve/rules/tpuserve.rules.yaml`; the chart puts them into a PrometheusRule or GKE
Managed Prometheus ClusterRules and appends the `tpuserve.prices` group rendered from
`values.pricing` (prices are values, never literals in a rule or a dashboard). The promtool unit
tests for every rule live in `tests/metrics/promtool/rule_tests.py`.

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
  `up` series (`_at_engine_pods`). `or` keeps an engine's own series wherever it has them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_tpu import metric_names as sg

# The latency SLO the burn-rate alerts and good-ratio series encode.
TTFT_SLO_SECONDS = 2.0
ITL_SLO_SECONDS = 0.1
SLO_OBJECTIVE = 0.99  # 99 % of requests (TTFT) / tokens (ITL) within the threshold
# Multi-window, multi-burn-rate alerting (Google SRE workbook, "Alerting on SLOs"): page when
# 2 % of a 30-day budget burns in 1 h (14.4x), ticket when 5 % burns in 6 h (6x).
FAST_BURN_RATE = 14.4
SLOW_BURN_RATE = 6.0

if TTFT_SLO_SECONDS not in sg.TTFT_BUCKETS_SECONDS:
    raise AssertionError("TTFT_SLO_SECONDS must be a bucket boundary of SGLang's TTFT histogram")
if ITL_SLO_SECONDS not in sg.ITL_BUCKETS_SECONDS:
    raise AssertionError("ITL_SLO_SECONDS must be a bucket boundary of SGLang's ITL histogram")

# Labels a pod-level series keeps: where it runs, what it serves, on which slice.
POD = "namespace, pod, model_name, tpu_generation, tpu_topology"
RANK0 = 'tp_rank="0", pp_rank="0"'
# Router series the fallbacks read (declared in router/tpuserve_router/metrics.py).
ROUTER_PROMPT_TOKENS = "tpuserve_router_prompt_tokens_total"
ROUTER_CACHED_TOKENS = "tpuserve_router_cached_tokens_total"
ROUTER_COMPLETION_TOKENS = "tpuserve_router_completion_tokens_total"
ROUTER_TTFT = "tpuserve_router_ttft_seconds"
ROUTER_E2E = "tpuserve_router_e2e_latency_seconds"
ROUTER_ENGINE_REQUESTS = "tpuserve_router_worker_engine_requests"
ROUTER_KV_USAGE = "tpuserve_router_worker_kv_usage"
ANSWERED = 'worker!="none", status=~"2.."'
# Every scraped model-server pod with its labels, by the address Prometheus scraped (1 each).
ENGINE_PODS = (
    "group by (instance, namespace, pod, model, tpu_generation, tpu_topology) "
    '(up{job=~".*model-server"})'
)


def _at_engine_pods(by_worker: str, agg: str = "sum", by: str = POD, role: bool = False) -> str:
    """``by_worker`` (a router vector by ``worker``, every router replica summed or maxed) on
    the engine pods' labels: ``worker`` ``http://IP:PORT`` is the ``instance`` of the engine
    pod's scrape target, whose ``up`` gives namespace, pod, model (as ``model_name``) and
    slice. ``role`` adds ``engine_type="unified"`` (SGLang's label of a colocated engine)."""
    inner = f'label_replace({by_worker}, "instance", "$1", "worker", "https?://(.+)")'
    if role:
        inner = f'label_replace({inner}, "engine_type", "unified", "worker", ".*")'
    return (
        f"{agg} by ({by}) (\n  label_replace(\n    {inner}\n"
        "    * on (instance) group_left (namespace, pod, model, tpu_generation, tpu_topology)\n"
        f'    {ENGINE_PODS},\n    "model_name", "$1", "model", "(.+)"\n  )\n)'
    )


def _pod_rate(
    sglang: str, router: str, window: str, selector: str = "", by: str = POD, role: bool = False
) -> str:
    """An engine's counter rate per pod: its ``sglang:`` series, else the router's."""
    own = f"sum by ({by}) ({_rate(sglang, window, selector)})"
    answered = ANSWERED if router == ROUTER_REQUESTS else ""
    fallback = _at_engine_pods(f"sum by (worker) ({_rate(router, window, answered)})", by=by,
                               role=role)  # fmt: skip
    return f"{own}\nor\n{fallback}"


def _model_router(expr_by_model: str) -> str:
    """A router vector by ``model`` relabelled ``model_name``."""
    return f'label_replace({expr_by_model}, "model_name", "$1", "model", "(.+)")'


@dataclass(frozen=True, slots=True)
class Recording:
    record: str
    expr: str
    doc: str  # one sentence for docs/observability.md
    labels: dict[str, str] = field(default_factory=dict)

    def to_rule(self) -> dict[str, object]:
        rule: dict[str, object] = {"record": self.record, "expr": self.expr}
        if self.labels:
            rule["labels"] = dict(self.labels)
        return rule


@dataclass(frozen=True, slots=True)
class Alert:
    alert: str
    expr: str
    for_: str
    severity: str  # critical pages, warning tickets, info informs
    summary: str
    description: str  # may use {{ $labels.x }} and {{ $value }}

    def to_rule(self) -> dict[str, object]:
        return {
            "alert": self.alert,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary, "description": self.description},
        }


@dataclass(frozen=True, slots=True)
class Group:
    name: str
    rules: tuple[Recording | Alert, ...]

    def to_group(self) -> dict[str, object]:
        return {"name": self.name, "rules": [r.to_rule() for r in self.rules]}


def _rate(metric: str, window: str, selector: str = "") -> str:
    return f"rate({metric}{{{selector}}}[{window}])" if selector else f"rate({metric}[{window}])"


def _good_ratio(histogram: sg.MetricSpec, threshold: float, window: str) -> str:
    bucket, count = f"{histogram.name}_bucket", f"{histogram.name}_count"
    le = f'le="{threshold!r}"'
    own = (
        f"sum by (model_name) ({_rate(bucket, window, le)})\n"
        f"  / (sum by (model_name) ({_rate(count, window)}) > 0)"
    )
    router = ROUTER_HISTOGRAMS.get(histogram.name)
    if router is None:
        return own
    good = _model_router(f"sum by (model) ({_rate(router + '_bucket', window, le)})")
    total = _model_router(f"sum by (model) ({_rate(router + '_count', window)})")
    return f"{own}\nor\n{good}\n  / ({total} > 0)"


def _quantile(q: float, histogram: sg.MetricSpec, window: str, by: str = "model_name") -> str:
    rate = _rate(histogram.name + "_bucket", window)
    own = f"histogram_quantile({q}, sum by (le, {by}) ({rate}))"
    router = ROUTER_HISTOGRAMS.get(histogram.name)
    if router is None:
        return own
    buckets = _model_router(_rate(router + "_bucket", window))
    if "engine_type" in by:
        buckets = f'label_replace({buckets}, "engine_type", "unified", "model", ".*")'
    return f"{own}\nor\nhistogram_quantile({q}, sum by (le, {by}) ({buckets}))"


ROUTER_HISTOGRAMS = {
    sg.TIME_TO_FIRST_TOKEN.name: ROUTER_TTFT,
    sg.E2E_REQUEST_LATENCY.name: ROUTER_E2E,
}
"""SGLang's histograms the router has its own of (TTFT of streamed requests, end to end), for
an engine without SGLang's series. Inter-token latency and queue time it does not see."""


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
            _pod_rate(prompt, ROUTER_PROMPT_TOKENS, "1m"),
            "Prompt (input) tokens/s of each model server, cached ones included (an engine "
            "without SGLang's series: the router's count of its answers' usage).",
        ),
        Recording(
            "pod:sglang_cached_tokens:rate1m",
            _pod_rate(cached, ROUTER_CACHED_TOKENS, "1m"),
            "Prompt tokens/s served from the prefix cache, summed over cache tiers.",
        ),
        Recording(
            "pod:sglang_generation_tokens:rate1m",
            _pod_rate(generated, ROUTER_COMPLETION_TOKENS, "1m"),
            "Output tokens/s counted when requests finish (lags by the request duration).",
        ),
        Recording(
            "pod:sglang_decode_tokens:rate1m",
            f"sum by ({POD}) ({_rate(realtime, '1m', decode_rank0)})\n"
            f"or\n{_pod_rate(generated, ROUTER_COMPLETION_TOKENS, '1m')}",
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
            f"sum by (model_name) ({_rate(sg.NUM_REQUESTS.name, '1m')})\nor\n"
            + _model_router(f"sum by (model) ({_rate(ROUTER_REQUESTS, '1m', ANSWERED)})"),
            "Finished requests/s per model (an engine without SGLang's series: the requests "
            "the routers had answered by it).",
        ),
        Recording(
            "fleet:sglang_requests:rate1m",
            "sum(model:sglang_requests:rate1m)",
            "Finished requests/s of the whole fleet.",
        ),
    ]
    pod_cached = _pod_rate(cached, ROUTER_CACHED_TOKENS, "5m")
    pod_prompt = _pod_rate(prompt, ROUTER_PROMPT_TOKENS, "5m")
    for level, by in (
        ("pod", f"sum by ({POD})"),
        ("model", "sum by (model_name)"),
        ("fleet", "sum"),
    ):
        rules.append(
            Recording(
                f"{level}:sglang_prefix_cache_hit:ratio_rate5m",
                f"{by} (\n{pod_cached}\n)\n  / ({by} (\n{pod_prompt}\n) > 0)",
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
    generated_1h = f"(\n{_pod_rate(sg.GENERATION_TOKENS.name, ROUTER_COMPLETION_TOKENS, '1h')}\n)"
    prompt_1h = f"(\n{_pod_rate(sg.PROMPT_TOKENS.name, ROUTER_PROMPT_TOKENS, '1h')}\n)"
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
                    _quantile(q, hist, "5m"),
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
                    _quantile(q, hist, "5m", by="model_name, engine_type"),
                    f"{round(q * 100)}th percentile of {hist.documentation.lower().rstrip('.')}"
                    " per model and engine role (engine_type: prefill, decode, unified), over 5 "
                    "minutes.",
                )
            )
    for window in ("5m", "30m", "1h", "6h"):
        rules.append(
            Recording(
                f"model:sglang_ttft_good:ratio_rate{window}",
                _good_ratio(ttft, TTFT_SLO_SECONDS, window),
                f"Share of requests with TTFT <= {TTFT_SLO_SECONDS} s per model, over {window} "
                "(the SLI of the TTFT SLO).",
            )
        )
    for window in ("5m", "1h"):
        rules.append(
            Recording(
                f"model:sglang_itl_good:ratio_rate{window}",
                _good_ratio(itl, ITL_SLO_SECONDS, window),
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
        _at_engine_pods(f"sum by (worker) ({_rate(name, '5m', sel)})", by=by, role=True)
        for name, sel in (
            (ROUTER_PROMPT_TOKENS, ""), (ROUTER_CACHED_TOKENS, ""), (ROUTER_REQUESTS, ANSWERED)
        )
    )  # fmt: skip

    def engine_gauge(spec: sg.MetricSpec, router: str) -> str:
        own = f"max by ({by}) ({spec.name}{{{RANK0}}})"
        fallback = _at_engine_pods(f"max by (worker) ({router})", agg="max", by=by, role=True)
        return f"{own}\nor\n{fallback}"

    rules: list[Recording | Alert] = [
        Recording(
            "pod:sglang_uncached_prompt_tokens_per_request:ratio_rate5m",
            f"(sum by ({by}) ({_rate(prompt, '5m')}) - sum by ({by}) ({_rate(cached, '5m')}))\n"
            f"  / (sum by ({by}) ({_rate(requests, '5m')}) > 0)\nor\n"
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
            f"max by (namespace, pod, model_name) ({sg.NUM_QUEUE_REQS.name}{{{RANK0}}}) > 0\n"
            "and on (namespace, pod, model_name)\n"
            f"max by (namespace, pod, model_name) ({sg.TOKEN_USAGE.name}{{{RANK0}}}) > 0.9",
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


# Router series (declared in router/tpuserve_router/metrics.py).
ROUTER_WORKER_HEALTHY = "tpuserve_router_worker_healthy"
ROUTER_REQUESTS = "tpuserve_router_requests_total"
ROUTER_UPSTREAM_ERRORS = "tpuserve_router_upstream_errors_total"
ROUTER_KV_EVENT_GAPS = "tpuserve_router_kv_event_gaps_total"
ROUTER_DEMAND_SIGNALS = "tpuserve_router_demand_signals_total"
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
            f"sum by (namespace, pod) ({_rate(ROUTER_UPSTREAM_ERRORS, '5m')})\n"
            f"  / (sum by (namespace, pod) ({_rate(ROUTER_REQUESTS, '5m')}) > 0)\n"
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


# Operator series (declared in operator/tpuserve_operator/metrics.py).
OPERATOR_RECONCILES = "tpuserve_operator_reconciles_total"
UNSCHEDULABLE_PODS = "tpuserve_unschedulable_pods"


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
