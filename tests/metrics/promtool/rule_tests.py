"""promtool unit tests for every recording rule and alert (`tpuserve/observability/rules.py`,
`alert_rules.py`).

`test_rules_promtool.py` renders the chart's rules with `helm template` (prices from `VALUES`,
this folder's values.yaml), writes `promtool_test_file()` beside them and runs `promtool test
rules`; `python -m tests.metrics.promtool.rule_tests` prints the test file. Expected values are
computed here with the same floating-point operations PromQL performs, so promtool's exact
comparison holds. Input series carry the label sets SGLang 0.5.23 exposes
(`sglang_tpu.metric_names`).

The fleet fixture (`fleet_series`; 15 s samples, evaluated at 70 min); the alerts' tests are
`alert_rule_tests`':
- `llama-0` (v6e 2x4, 8 chips): 100 prompt tok/s, 40 cached, 20 finished-output, 30 decoded
  (real-time counter, TP rank 0; a rank-1 copy must not be counted), 1 req/s;
- `qwen-0` (v5e 2x4, 8 chips): 50 prompt, 10 cached, 10 output, no real-time counter (fallback),
  2 req/s with a counter reset (pod restart) inside the last minute;
- `idle-0` (v5e 1x1, 1 chip): counters flat: ratios must be absent, not NaN; its cost counts;
- `gone-0`: a pod whose series vanished 40 minutes ago.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sglang_tpu import metric_names as sg
from tests.metrics.promtool.alert_rule_tests import alert_tests
from tests.metrics.promtool.fleet_series import (
    CHIPS,
    E2E_BUCKETS,
    ITL_BUCKETS,
    NS,
    PER_STEP,
    PODS,
    QUEUE_BUCKETS,
    STEP_SECONDS,
    STEPS,
    TTFT_BUCKETS,
    VALUES,
    _engine,
    _expect,
    _pod_labels,
    _rate,
    _sample,
    _series,
    fleet_series,
    histogram_quantile,
)
from tests.metrics.promtool.jax_rule_tests import sglang_jax_alert_test, sglang_jax_test
from tpuserve.observability import rule_basis


def token_tests() -> list[dict[str, Any]]:
    r1, r5 = 60, 300
    cases: list[dict[str, Any]] = []
    index = {"prompt": 0, "cached": 1, "generation": 2}
    for what, i in index.items():
        name = f"pod:sglang_{what}_tokens:rate1m"
        cases.append(
            _expect(
                name, (_sample(name, _pod_labels(p), _rate(PER_STEP[p][i] or 0, r1)) for p in PODS)
            )
        )

    def decode(pod: str) -> float:
        realtime = PER_STEP[pod][3]
        return _rate(PER_STEP[pod][2] if realtime is None else realtime, r1)

    name = "pod:sglang_decode_tokens:rate1m"
    cases.append(_expect(name, (_sample(name, _pod_labels(p), decode(p)) for p in PODS)))
    per_pod = {
        "prompt": {p: _rate(PER_STEP[p][0], r1) for p in PODS},
        "cached": {p: _rate(PER_STEP[p][1], r1) for p in PODS},
        "decode": {p: decode(p) for p in PODS},
    }
    for what, values in per_pod.items():
        name = f"model:sglang_{what}_tokens:rate1m"
        cases.append(
            _expect(
                name,
                (_sample(name, {"model_name": PODS[p]["model_name"]}, values[p]) for p in PODS),
            )
        )
        name = f"tpu_generation:sglang_{what}_tokens:rate1m"
        by_gen = {
            "v5e": values["idle-0"] + values["qwen-0"],  # series order: idle-0 < qwen-0
            "v6e": values["llama-0"],
        }
        cases.append(
            _expect(name, (_sample(name, {"tpu_generation": g}, v) for g, v in by_gen.items()))
        )
        name = f"fleet:sglang_{what}_tokens:rate1m"
        total = values["idle-0"] + values["llama-0"] + values["qwen-0"]
        cases.append(_expect(name, [_sample(name, {}, total)]))
    fleet_prompt = (
        per_pod["prompt"]["idle-0"] + per_pod["prompt"]["llama-0"] + per_pod["prompt"]["qwen-0"]
    )
    fleet_decode = (
        per_pod["decode"]["idle-0"] + per_pod["decode"]["llama-0"] + per_pod["decode"]["qwen-0"]
    )
    cases.append(
        _expect(
            "fleet:sglang_tokens:rate1m",
            [_sample("fleet:sglang_tokens:rate1m", {}, fleet_prompt + fleet_decode)],
        )
    )
    # qwen's counter restarted at 69m30s: the reset step adds nothing, never a negative rate.
    requests = {"llama-0": 1.0, "qwen-0": (30 * 3) / 60, "idle-0": 0.0}
    name = "model:sglang_requests:rate1m"
    cases.append(
        _expect(
            name,
            (_sample(name, {"model_name": PODS[p]["model_name"]}, v) for p, v in requests.items()),
        )
    )
    name = "fleet:sglang_requests:rate1m"
    cases.append(
        _expect(
            name, [_sample(name, {}, requests["idle-0"] + requests["llama-0"] + requests["qwen-0"])]
        )
    )
    # Hit ratios: idle-0 has no ratio at all (0/0 is dropped by "> 0"), gone-0 vanished.
    active = ("llama-0", "qwen-0")
    name = "pod:sglang_prefix_cache_hit:ratio_rate5m"
    cases.append(
        _expect(
            name,
            (
                _sample(name, _pod_labels(p), _rate(PER_STEP[p][1], r5) / _rate(PER_STEP[p][0], r5))
                for p in active
            ),
        )
    )
    name = "model:sglang_prefix_cache_hit:ratio_rate5m"
    cases.append(
        _expect(
            name,
            (
                _sample(
                    name,
                    {"model_name": PODS[p]["model_name"]},
                    _rate(PER_STEP[p][1], r5) / _rate(PER_STEP[p][0], r5),
                )
                for p in active
            ),
        )
    )
    cached5 = _rate(0, r5) + _rate(600, r5) + _rate(150, r5)
    prompt5 = _rate(0, r5) + _rate(1500, r5) + _rate(750, r5)
    name = "fleet:sglang_prefix_cache_hit:ratio_rate5m"
    cases.append(_expect(name, [_sample(name, {}, cached5 / prompt5)]))
    return cases


def chip_tests(prices: dict[str, float]) -> list[dict[str, Any]]:
    r1, r60 = 60, 3600
    decode = {"llama-0": _rate(450, r1), "qwen-0": _rate(150, r1), "idle-0": _rate(0, r1)}
    chips_gen = {"v5e": float(CHIPS["idle-0"] + CHIPS["qwen-0"]), "v6e": float(CHIPS["llama-0"])}
    model = {p: PODS[p]["model_name"] for p in PODS}
    cost = {p: CHIPS[p] * prices[PODS[p]["tpu_generation"]] for p in PODS}
    gen_1h = {p: _rate(PER_STEP[p][2], r60) for p in PODS}
    prompt_1h = {p: _rate(PER_STEP[p][0], r60) for p in PODS}
    fleet_cost = cost["idle-0"] + cost["llama-0"] + cost["qwen-0"]
    cases = [
        _expect(
            "tpu_generation:tpuserve_replica_tpu_chips:sum",
            (
                _sample("tpu_generation:tpuserve_replica_tpu_chips:sum", {"tpu_generation": g}, v)
                for g, v in chips_gen.items()
            ),
        ),
        _expect(
            "model:tpuserve_replica_tpu_chips:sum",
            (
                _sample(
                    "model:tpuserve_replica_tpu_chips:sum",
                    {"model_name": model[p]},
                    float(CHIPS[p]),
                )
                for p in PODS
            ),
        ),
        _expect(
            "tpu_generation:sglang_decode_tokens_per_chip:rate1m",
            [
                _sample(
                    "tpu_generation:sglang_decode_tokens_per_chip:rate1m",
                    {"tpu_generation": "v5e"},
                    (decode["idle-0"] + decode["qwen-0"]) / chips_gen["v5e"],
                ),
                _sample(
                    "tpu_generation:sglang_decode_tokens_per_chip:rate1m",
                    {"tpu_generation": "v6e"},
                    decode["llama-0"] / chips_gen["v6e"],
                ),
            ],
        ),
        _expect(
            "model:sglang_decode_tokens_per_chip:rate1m",
            (
                _sample(
                    "model:sglang_decode_tokens_per_chip:rate1m",
                    {"model_name": model[p]},
                    decode[p] / CHIPS[p],
                )
                for p in PODS
            ),
        ),
        _expect(
            "fleet:sglang_decode_tokens_per_chip:rate1m",
            [
                _sample(
                    "fleet:sglang_decode_tokens_per_chip:rate1m",
                    {},
                    (decode["idle-0"] + decode["llama-0"] + decode["qwen-0"])
                    / float(sum(CHIPS.values())),
                )
            ],
        ),
        _expect(
            "pod:tpuserve_tpu_cost_usd:per_hour",
            (
                _sample(
                    "pod:tpuserve_tpu_cost_usd:per_hour",
                    {"namespace": NS, "pod": p, "tpu_generation": PODS[p]["tpu_generation"]},
                    cost[p],
                )
                for p in PODS
            ),
        ),
        _expect(
            "model:tpuserve_tpu_cost_usd:per_hour",
            (
                _sample("model:tpuserve_tpu_cost_usd:per_hour", {"model_name": model[p]}, cost[p])
                for p in PODS
            ),
        ),
        _expect(
            "tpu_generation:tpuserve_tpu_cost_usd:per_hour",
            [
                _sample(
                    "tpu_generation:tpuserve_tpu_cost_usd:per_hour",
                    {"tpu_generation": "v5e"},
                    cost["idle-0"] + cost["qwen-0"],
                ),
                _sample(
                    "tpu_generation:tpuserve_tpu_cost_usd:per_hour",
                    {"tpu_generation": "v6e"},
                    cost["llama-0"],
                ),
            ],
        ),
        _expect(
            "fleet:tpuserve_tpu_cost_usd:per_hour",
            [_sample("fleet:tpuserve_tpu_cost_usd:per_hour", {}, fleet_cost)],
        ),
        # The idle model produced no tokens: no cost per token (not +Inf).
        _expect(
            "model:tpuserve_cost_usd_per_1m_output_tokens:rate1h",
            (
                _sample(
                    "model:tpuserve_cost_usd_per_1m_output_tokens:rate1h",
                    {"model_name": model[p]},
                    cost[p] / 3600 / gen_1h[p] * 1e6,
                )
                for p in ("llama-0", "qwen-0")
            ),
        ),
        _expect(
            "model:tpuserve_cost_usd_per_1m_tokens:rate1h",
            (
                _sample(
                    "model:tpuserve_cost_usd_per_1m_tokens:rate1h",
                    {"model_name": model[p]},
                    cost[p] / 3600 / (gen_1h[p] + prompt_1h[p]) * 1e6,
                )
                for p in ("llama-0", "qwen-0")
            ),
        ),
        _expect(
            "fleet:tpuserve_cost_usd_per_1m_output_tokens:rate1h",
            [
                _sample(
                    "fleet:tpuserve_cost_usd_per_1m_output_tokens:rate1h",
                    {},
                    fleet_cost
                    / 3600
                    / (gen_1h["idle-0"] + gen_1h["llama-0"] + gen_1h["qwen-0"])
                    * 1e6,
                )
            ],
        ),
        _expect(
            "fleet:tpuserve_cost_usd_per_1m_tokens:rate1h",
            [
                _sample(
                    "fleet:tpuserve_cost_usd_per_1m_tokens:rate1h",
                    {},
                    fleet_cost
                    / 3600
                    / (
                        (gen_1h["idle-0"] + gen_1h["llama-0"] + gen_1h["qwen-0"])
                        + (prompt_1h["idle-0"] + prompt_1h["llama-0"] + prompt_1h["qwen-0"])
                    )
                    * 1e6,
                )
            ],
        ),
        # The idle model's chips count; its tokens/day per chip is 0, not absent.
        _expect(
            "model:tpuserve_tokens_per_day_per_chip:rate1h",
            (
                _sample(
                    "model:tpuserve_tokens_per_day_per_chip:rate1h",
                    {"model_name": model[p]},
                    (gen_1h[p] + prompt_1h[p]) * 86400 / CHIPS[p],
                )
                for p in PODS
            ),
        ),
        _expect(
            "fleet:tpuserve_tokens_per_day_per_chip:rate1h",
            [
                _sample(
                    "fleet:tpuserve_tokens_per_day_per_chip:rate1h",
                    {},
                    (
                        (gen_1h["idle-0"] + gen_1h["llama-0"] + gen_1h["qwen-0"])
                        + (prompt_1h["idle-0"] + prompt_1h["llama-0"] + prompt_1h["qwen-0"])
                    )
                    * 86400
                    / float(sum(CHIPS.values())),
                )
            ],
        ),
    ]
    return cases


def latency_tests() -> list[dict[str, Any]]:
    r5 = 300
    llama = {"model_name": "llama"}
    cases = []
    for short, buckets, quantiles in (
        ("ttft", TTFT_BUCKETS, (0.5, 0.9, 0.99)),
        ("itl", ITL_BUCKETS, (0.5, 0.99)),
        ("e2e", E2E_BUCKETS, (0.5, 0.99)),
        ("queue_time", QUEUE_BUCKETS, (0.99,)),
    ):
        for q in quantiles:
            name = f"model:sglang_{short}_seconds:p{round(q * 100)}_5m"
            cases.append(_expect(name, [_sample(name, llama, histogram_quantile(q, buckets, r5))]))
    good = TTFT_BUCKETS[repr(rule_basis.TTFT_SLO_SECONDS)]
    windows = {"5m": 300, "30m": 1800, "1h": 3600, "6h": 4200}  # 6h: only 70 min of data yet
    for window, seconds in windows.items():
        name = f"model:sglang_ttft_good:ratio_rate{window}"
        if window == "6h":
            # Data started at 0: extrapolation stops at the counters' zero, both rates share it.
            value = (good * 280 / 21600) / (30 * 280 / 21600)
        else:
            value = _rate(good, seconds) / _rate(30, seconds)
        cases.append(_expect(name, [_sample(name, llama, value)]))
    for window, seconds in (("5m", 300), ("1h", 3600)):
        name = f"model:sglang_itl_good:ratio_rate{window}"
        value = _rate(ITL_BUCKETS[repr(rule_basis.ITL_SLO_SECONDS)], seconds) / _rate(300, seconds)
        cases.append(_expect(name, [_sample(name, llama, value)]))
    return cases


# A disaggregated model's engines: SGLang labels them engine_type prefill and decode; a prefill
# engine makes one token per request, so it has no inter-token latency.
ROLE_TTFT_BUCKETS = {
    "prefill": {"0.5": 15, "1.0": 30, "+Inf": 30},
    "decode": {"1.0": 6, "2.0": 21, "4.0": 30, "+Inf": 30},
}
ROLE_ITL_BUCKETS = {"decode": {"0.05": 240, "0.1": 297, "0.2": 300, "+Inf": 300}}


def role_test() -> dict[str, Any]:
    """model_role rules: TTFT and ITL percentiles split by engine_type (one test of its own,
    so the fleet fixture's model-level expectations stay as they are)."""
    series: list[dict[str, str]] = []
    for spec, by_role in (
        (sg.TIME_TO_FIRST_TOKEN, ROLE_TTFT_BUCKETS),
        (sg.INTER_TOKEN_LATENCY, ROLE_ITL_BUCKETS),
    ):
        for role, buckets in by_role.items():
            target = {"namespace": NS, "pod": f"pd-{role}-0", "model_name": "pd"}
            for le, per_step in buckets.items():
                bucket = {**_engine(spec, target, engine_type=role), "le": le}
                series.append(_series(f"{spec.name}_bucket", bucket, f"0+{per_step}x{STEPS}"))
    cases = []
    for short, by_role in (("ttft", ROLE_TTFT_BUCKETS), ("itl", ROLE_ITL_BUCKETS)):
        for q in (0.5, 0.99):
            name = f"model_role:sglang_{short}_seconds:p{round(q * 100)}_5m"
            samples = [
                _sample(
                    name,
                    {"model_name": "pd", "engine_type": role},
                    histogram_quantile(q, buckets, 300),
                )
                for role, buckets in sorted(by_role.items())  # decode < prefill
            ]
            cases.append(_expect(name, samples))
    # p90 TTFT is what a prefill role's autoscaler reads (its engine_type only: the decode
    # role's value here differs from Prometheus's in the last bit)
    name = "model_role:sglang_ttft_seconds:p90_5m"
    labels = {"model_name": "pd", "engine_type": "prefill"}
    p90 = histogram_quantile(0.9, ROLE_TTFT_BUCKETS["prefill"], 300)
    cases.append(_expect(f'{name}{{engine_type="prefill"}}', [_sample(name, labels, p90)]))
    return {
        "name": "roles: TTFT and ITL percentiles by engine_type (prefill, decode)",
        "interval": f"{STEP_SECONDS}s",
        "input_series": series,
        "promql_expr_test": cases,
    }


# Autoscaling fixture: `busy-0` finishes 15 requests a step with 4500 prompt tokens, 1500 of
# them cached (200 uncached per request), and has 4 waiting (a TP rank-1 copy of the gauge must
# not count); `new-0` has 2 waiting but has finished nothing in 5 minutes (no estimate, not 0).
AUTOSCALING_PODS = {
    "busy-0": {"model_name": "chat", "tpu_generation": "v6e", "tpu_topology": "2x2"},
    "new-0": {"model_name": "chat", "tpu_generation": "v6e", "tpu_topology": "2x2"},
}
AUTOSCALING_STEPS = {"busy-0": (4500, 1500, 15, 4, 0.25), "new-0": (0, 0, 0, 2, 0.5)}


def autoscaling_test() -> dict[str, Any]:
    """The series KEDA's backlogSeconds and kvCacheUsage triggers read."""
    series: list[dict[str, str]] = []
    for pod, (prompt, cached, requests, waiting, usage) in AUTOSCALING_STEPS.items():
        target = {"namespace": NS, "pod": pod, **AUTOSCALING_PODS[pod]}
        for spec, per_step in (
            (sg.PROMPT_TOKENS, prompt), (sg.CACHED_TOKENS, cached), (sg.NUM_REQUESTS, requests)
        ):  # fmt: skip
            series.append(_series(spec.name, _engine(spec, target), f"0+{per_step}x{STEPS}"))
        for rank, scale in (("0", 1), ("1", 3)):
            for spec, value in ((sg.NUM_QUEUE_REQS, waiting), (sg.TOKEN_USAGE, usage)):
                labels = _engine(spec, target, tp_rank=rank)
                series.append(_series(spec.name, labels, f"{value * scale}+0x{STEPS}"))
    busy = {"namespace": NS, "pod": "busy-0", **AUTOSCALING_PODS["busy-0"],
            "engine_type": "unified"}  # fmt: skip
    per_request = (_rate(4500, 300) - _rate(1500, 300)) / _rate(15, 300)
    queued = 4 * per_request
    kv = [{**busy, "pod": pod} for pod in AUTOSCALING_STEPS]
    cases = [
        _expect(
            "pod:sglang_uncached_prompt_tokens_per_request:ratio_rate5m",
            [
                _sample(
                    "pod:sglang_uncached_prompt_tokens_per_request:ratio_rate5m", busy, per_request
                )
            ],
        ),
        _expect(
            "pod:sglang_queued_prefill_tokens:estimate",
            [_sample("pod:sglang_queued_prefill_tokens:estimate", busy, queued)],
        ),
        _expect(
            "model:sglang_queued_prefill_tokens:sum",
            [_sample("model:sglang_queued_prefill_tokens:sum", {"model_name": "chat"}, queued)],
        ),
        _expect(
            "pod:sglang_kv_usage:ratio",
            [
                _sample("pod:sglang_kv_usage:ratio", kv[0], 0.25),
                _sample("pod:sglang_kv_usage:ratio", kv[1], 0.5),
            ],
        ),
        _expect(
            "model:sglang_kv_usage:avg",
            [_sample("model:sglang_kv_usage:avg", {"model_name": "chat"}, 0.375)],
        ),
    ]
    return {
        "name": "autoscaling: queued prefill tokens and KV occupancy (KEDA's triggers)",
        "interval": f"{STEP_SECONDS}s",
        "input_series": series,
        "promql_expr_test": cases,
    }


def load_prices(values_path: Path) -> dict[str, float]:
    values = yaml.safe_load(values_path.read_text())
    return {p["generation"]: float(p["usdPerChipHour"]) for p in values["pricing"]}


def promtool_test_file(values_path: Path = VALUES) -> dict[str, Any]:
    """The promtool test file; `values_path` holds the prices the chart rendered the rules with."""
    prices = load_prices(values_path)
    return {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "15s",
        "tests": [
            {
                "name": "fleet: every recording rule (TP ranks, counter reset, idle, vanished)",
                "interval": f"{STEP_SECONDS}s",
                "input_series": fleet_series(),
                "promql_expr_test": token_tests() + chip_tests(prices) + latency_tests(),
            },
            role_test(),
            autoscaling_test(),
            sglang_jax_test(),
            sglang_jax_alert_test(),
            *alert_tests(),
        ],
    }


def promtool_test_files(values_path: Path = VALUES) -> dict[str, dict[str, Any]]:
    """`promtool_test_file()` split by the cases' sample interval, each part evaluated at its
    cases' interval: the minute-sampled cases (the long burn-rate and hit-ratio windows, up to
    7 h) take a quarter of the steps a 15 s evaluation gives them, and the parts run in parallel."""
    whole = promtool_test_file(values_path)
    parts: dict[str, dict[str, Any]] = {}
    for case in whole["tests"]:
        interval = case.get("interval", "1m")  # promtool's default
        part = parts.setdefault(
            f"every-{interval}", {**whole, "evaluation_interval": interval, "tests": []}
        )
        part["tests"].append(case)
    return parts


def tested_names(test: dict[str, Any]) -> set[str]:
    """Every recording rule and alert name a test file checks."""
    names: set[str] = set()
    for case in test["tests"]:
        names |= {c["expr"].split("{")[0] for c in case.get("promql_expr_test", [])}
        names |= {c["alertname"] for c in case.get("alert_rule_test", [])}
    return names


if __name__ == "__main__":
    print(yaml.safe_dump(promtool_test_file(), sort_keys=False, width=100), end="")
