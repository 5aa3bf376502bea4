"""promtool unit tests of the rules' fallback for engines without `sglang:` series (SGLang-JAX):
the router's per-worker series, summed over router replicas, on the engine pod's labels.

Fixture (15 s samples, evaluated at 10 min):
- `jax-0` (SGLang-JAX, v5e 2x2, scraped at 10.0.0.7:30000): no `sglang:` series, only its
  `up`; two router replicas count its answers: prompt 300 + 150 tokens a step, cached 120 + 60,
  completion 60 + 30, 6 + 3 answered requests (a 503 and the router's own `worker="none"` must
  not count); the routers' load polls read 3 running, 2 waiting, KV 0.25 (the same from both);
  its streamed TTFT histogram (router-0's) has 45 of 60 requests within the 2 s SLO;
- `sg-0` (SGLang, v5e 2x2, 10.0.0.8:30000): its own `sglang:` series (100 prompt tokens a step,
  5 running) and the routers' counts of it, which must not be added (`or` keeps its own).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sglang_tpu import metric_names as sg
from tests.metrics.promtool.fleet_series import (
    NS,
    STEP_SECONDS,
    _alert,
    _engine,
    _rate,
    _sample,
    _series,
    histogram_quantile,
)
from tpuserve.observability import rule_basis

JAX_POD = {"namespace": NS, "pod": "jax-0", "model_name": "jx", "tpu_generation": "v5e",
           "tpu_topology": "2x2"}  # fmt: skip
SG_POD = {**JAX_POD, "pod": "sg-0", "model_name": "sg"}
ADDRESSES = {"jax-0": "10.0.0.7:30000", "sg-0": "10.0.0.8:30000"}
ROUTERS = {"router-0": 2, "router-1": 1}  # each replica's share: 2/3 and 1/3 of the traffic
TTFT = {"0.5": 15, "1.0": 30, "2.0": 45, "2.5": 60, "+Inf": 60}
STEPS = 60  # 15 minutes of samples, evaluated at 10 (a short fixture: promtool's time is CI's)
EVAL = "10m"


def _expect(expr: str, samples: Iterable[dict[str, Any]]) -> dict[str, Any]:
    return {"expr": expr, "eval_time": EVAL, "exp_samples": list(samples)}


def _up(pod: dict[str, str]) -> dict[str, str]:
    """The engine pod's `up`, labelled as the chart's PodMonitor labels its targets."""
    labels = {k: v for k, v in pod.items() if k != "model_name"}
    return _series(
        "up",
        {"job": f"{NS}/x-model-server", "instance": ADDRESSES[pod["pod"]], **labels,
         "model": pod["model_name"]},
        f"1+0x{STEPS}",
    )  # fmt: skip


def _router(name: str, pod: dict[str, str], router: str, **labels: str) -> dict[str, str]:
    return {"namespace": NS, "pod": router, "model": pod["model_name"],
            "worker": f"http://{ADDRESSES[pod['pod']]}", **labels}  # fmt: skip


def _hour(per_step: int) -> float:
    """rate() over 1 h at `EVAL` of a counter from 0 at time 0: no extrapolation to before its
    zero, so its increase over the hour's seconds."""
    return (per_step * (600 // STEP_SECONDS) * 1.0) / 3600


def sglang_jax_test() -> dict[str, Any]:
    series = [_up(JAX_POD), _up(SG_POD)]
    for pod in (JAX_POD, SG_POD):
        for router, share in ROUTERS.items():
            for name, per_step in (
                (rule_basis.ROUTER_PROMPT_TOKENS, 150), (rule_basis.ROUTER_CACHED_TOKENS, 60),
                (rule_basis.ROUTER_COMPLETION_TOKENS, 30),
            ):  # fmt: skip
                values = f"0+{per_step * share}x{STEPS}"
                series.append(_series(name, _router(name, pod, router), values))
            for status, per_step in (("200", 3), ("503", 1)):
                labels = _router(rule_basis.ROUTER_REQUESTS, pod, router, route="/v1/completions",
                                 status=status)  # fmt: skip
                values = f"0+{per_step * share}x{STEPS}"
                series.append(_series(rule_basis.ROUTER_REQUESTS, labels, values))
            worker = {"namespace": NS, "pod": router, "worker": f"http://{ADDRESSES[pod['pod']]}"}
            for state, value in (("running", 3), ("waiting", 2)):
                series.append(_series(rule_basis.ROUTER_ENGINE_REQUESTS, {**worker, "state": state},
                                      f"{value}+0x{STEPS}"))  # fmt: skip
            series.append(_series(rule_basis.ROUTER_KV_USAGE, worker, f"0.25+0x{STEPS}"))
        none = {"namespace": NS, "pod": "router-0", "model": pod["model_name"], "worker": "none",
                "route": "/v1/completions", "status": "200"}  # fmt: skip
        series.append(_series(rule_basis.ROUTER_REQUESTS, none, f"0+7x{STEPS}"))
    for le, per_step in TTFT.items():
        labels = {"namespace": NS, "pod": "router-0", "model": "jx", "le": le}
        series.append(_series(f"{rule_basis.ROUTER_TTFT}_bucket", labels, f"0+{per_step}x{STEPS}"))
    ttft_count = {"namespace": NS, "pod": "router-0", "model": "jx"}
    series.append(_series(f"{rule_basis.ROUTER_TTFT}_count", ttft_count, f"0+60x{STEPS}"))
    # SGLang's own series for sg-0
    for spec, per_step in ((sg.PROMPT_TOKENS, 100),):
        series.append(_series(spec.name, _engine(spec, SG_POD), f"0+{per_step}x{STEPS}"))
    series.append(_series(sg.NUM_RUNNING_REQS.name, _engine(sg.NUM_RUNNING_REQS, SG_POD),
                          f"5+0x{STEPS}"))  # fmt: skip

    role = {"engine_type": "unified"}
    prompt = _rate(300, 60) + _rate(150, 60)
    prompt5, cached5 = _rate(300, 300) + _rate(150, 300), _rate(120, 300) + _rate(60, 300)
    jax_uncached = (prompt5 - cached5) / (_rate(6, 300) + _rate(3, 300))
    good = _rate(TTFT["2.0"], 300) / _rate(TTFT["+Inf"], 300)
    cases = [
        _expect(
            "pod:sglang_prompt_tokens:rate1m",
            [
                _sample("pod:sglang_prompt_tokens:rate1m", JAX_POD, prompt),
                _sample("pod:sglang_prompt_tokens:rate1m", SG_POD, _rate(100, 60)),
            ],
        ),
        *(
            _expect(
                f'pod:sglang_{what}_tokens:{window}{{pod="{JAX_POD["pod"]}"}}',
                [_sample(f"pod:sglang_{what}_tokens:{window}", JAX_POD, value)],
            )
            for what, window, value in (
                ("prompt", "rate5m", prompt5),
                ("cached", "rate5m", cached5),
                ("prompt", "rate1h", _hour(300) + _hour(150)),
                ("generation", "rate1h", _hour(60) + _hour(30)),
            )
        ),
        _expect(
            f'pod:sglang_decode_tokens:rate1m{{pod="{JAX_POD["pod"]}"}}',
            [_sample("pod:sglang_decode_tokens:rate1m", JAX_POD, _rate(60, 60) + _rate(30, 60))],
        ),
        _expect(
            f'model:sglang_requests:rate1m{{model_name="{JAX_POD["model_name"]}"}}',
            [
                _sample(
                    "model:sglang_requests:rate1m",
                    {"model_name": "jx"},
                    _rate(6, 60) + _rate(3, 60),
                )
            ],
        ),
        _expect(
            f'pod:sglang_prefix_cache_hit:ratio_rate5m{{pod="{JAX_POD["pod"]}"}}',
            [_sample("pod:sglang_prefix_cache_hit:ratio_rate5m", JAX_POD, cached5 / prompt5)],
        ),
        _expect(
            "pod:sglang_running_requests:max",
            [
                _sample("pod:sglang_running_requests:max", {**JAX_POD, **role}, 3),
                _sample("pod:sglang_running_requests:max", {**SG_POD, **role}, 5),
            ],
        ),
        _expect(
            f'pod:sglang_queued_requests:max{{pod="{JAX_POD["pod"]}"}}',
            [_sample("pod:sglang_queued_requests:max", {**JAX_POD, **role}, 2)],
        ),
        _expect(
            f'pod:sglang_kv_usage:ratio{{pod="{JAX_POD["pod"]}"}}',
            [_sample("pod:sglang_kv_usage:ratio", {**JAX_POD, **role}, 0.25)],
        ),
        _expect(
            f'pod:sglang_uncached_prompt_tokens_per_request:ratio_rate5m{{pod="{JAX_POD["pod"]}"}}',
            [
                _sample(
                    "pod:sglang_uncached_prompt_tokens_per_request:ratio_rate5m",
                    {**JAX_POD, **role},
                    jax_uncached,
                )
            ],
        ),
        _expect(
            f'model:sglang_ttft_good:ratio_rate5m{{model_name="{JAX_POD["model_name"]}"}}',
            [_sample("model:sglang_ttft_good:ratio_rate5m", {"model_name": "jx"}, good)],
        ),
        _expect(
            f'model:sglang_ttft_seconds:p50_5m{{model_name="{JAX_POD["model_name"]}"}}',
            [
                _sample(
                    "model:sglang_ttft_seconds:p50_5m",
                    {"model_name": "jx"},
                    histogram_quantile(0.5, TTFT, 300),
                )
            ],
        ),
    ]
    return {
        "name": "SGLang-JAX: pod and model series from the routers' per-worker series",
        "interval": f"{STEP_SECONDS}s",
        "input_series": series,
        "promql_expr_test": cases,
    }


def sglang_jax_alert_test() -> dict[str, Any]:
    """TPUServeQueueBacklog for an SGLang-JAX replica: its queue and KV pool as the router's
    load poll read them (`jax-0` full with a queue; `sg-0`, also polled full, has its own
    gauges, which say it has room: no alert for it)."""
    worker = {"namespace": NS, "pod": "router-0"}
    series = [_up(JAX_POD), _up(SG_POD)]
    for pod in (JAX_POD, SG_POD):
        at = {**worker, "worker": f"http://{ADDRESSES[pod['pod']]}"}
        series.append(
            _series(rule_basis.ROUTER_ENGINE_REQUESTS, {**at, "state": "waiting"}, "5+0x30")
        )
        series.append(_series(rule_basis.ROUTER_KV_USAGE, at, "0.95+0x30"))
    for spec, value in ((sg.NUM_QUEUE_REQS, "5+0x30"), (sg.TOKEN_USAGE, "0.5+0x30")):
        series.append(_series(spec.name, _engine(spec, SG_POD), value))
    full = {"namespace": NS, "pod": "jax-0", "model_name": "jx"}
    return {
        "name": "SGLang-JAX: the queue-backlog alert from the router's polls of the engine",
        "interval": "1m",
        "input_series": series,
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "TPUServeQueueBacklog", "exp_alerts": []},
            {
                "eval_time": "15m",
                "alertname": "TPUServeQueueBacklog",
                "exp_alerts": [_alert("TPUServeQueueBacklog", full)],
            },
        ],
    }
