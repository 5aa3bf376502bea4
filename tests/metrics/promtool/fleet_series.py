"""The fleet fixture of the promtool unit tests (`rule_tests` describes it): its pods, their
engine and router series sampled every `STEP_SECONDS`, the histograms' buckets, and the helpers
that build series, expected samples and an alert's expected labels the way PromQL computes them."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sglang_tpu import metric_names as sg
from tpuserve.observability import rules

# Prices the tests render the chart with: binary fractions keep expected costs exact.
VALUES = Path(__file__).parent / "values.yaml"
STEP_SECONDS = 15
EVAL = "70m"
NS = "team"
PODS: dict[str, dict[str, str]] = {
    "llama-0": {"model_name": "llama", "tpu_generation": "v6e", "tpu_topology": "2x4"},
    "qwen-0": {"model_name": "qwen", "tpu_generation": "v5e", "tpu_topology": "2x4"},
    "idle-0": {"model_name": "idle", "tpu_generation": "v5e", "tpu_topology": "1x1"},
}
CHIPS = {"llama-0": 8, "qwen-0": 8, "idle-0": 1}
# Tokens per 15 s step: prompt, cached, generation (finish-time), realtime decode, requests.
PER_STEP = {
    "llama-0": (1500, 600, 300, 450, 15),
    "qwen-0": (750, 150, 150, None, 30),
    "idle-0": (0, 0, 0, None, 0),
}
STEPS = 400  # 100 minutes of samples


def _labels(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    return {"series": f"{name}{_labels(labels)}", "values": values}


def _pod_labels(pod: str) -> dict[str, str]:
    return {"namespace": NS, "pod": pod, **PODS[pod]}


# Values of SGLang's own labels on a single-rank, non-disaggregated server.
ENGINE_LABEL_VALUES = {
    "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0",
    "is_streaming": "false", "cache_source": "device",
}  # fmt: skip


def _engine(spec: sg.MetricSpec, target: dict[str, str], **values: str) -> dict[str, str]:
    """`target`'s labels (what the scrape adds, and `model_name`) plus every label SGLang puts
    on `spec`, so the fixture's series look like a real server's."""
    own = {k: values.get(k, ENGINE_LABEL_VALUES.get(k, "")) for k in spec.labels if k not in target}
    missing = [k for k, v in own.items() if not v]
    if missing:
        raise ValueError(f"{spec.name}: give values for {missing}")
    return {**target, **own}


def _rate(per_step: float, window_seconds: int) -> float:
    """rate() over a window fully covered by samples (no extrapolation), as PromQL computes it."""
    return (per_step * (window_seconds // STEP_SECONDS)) * 1.0 / window_seconds


def _sample(name: str, labels: dict[str, str], value: float) -> dict[str, Any]:
    return {"labels": f"{name}{_labels(labels)}", "value": value}


def fleet_series() -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for pod, (prompt, cached, generated, decode, requests) in PER_STEP.items():
        labels = _pod_labels(pod)
        if pod == "llama-0":  # streaming and non-streaming requests: two series to add up
            for streaming, share in (("false", 900), ("true", prompt - 900)):
                tagged = _engine(sg.PROMPT_TOKENS, labels, is_streaming=streaming)
                out.append(_series(sg.PROMPT_TOKENS.name, tagged, f"0+{share}x{STEPS}"))
        else:
            out.append(
                _series(sg.PROMPT_TOKENS.name, _engine(sg.PROMPT_TOKENS, labels),
                        f"0+{prompt}x{STEPS}")
            )  # fmt: skip
        out.append(
            _series(sg.CACHED_TOKENS.name, _engine(sg.CACHED_TOKENS, labels), f"0+{cached}x{STEPS}")
        )
        out.append(
            _series(sg.GENERATION_TOKENS.name, _engine(sg.GENERATION_TOKENS, labels),
                    f"0+{generated}x{STEPS}")
        )  # fmt: skip
        if decode is not None:
            for rank in ("0", "1"):
                rank_labels = _engine(sg.REALTIME_TOKENS, labels, mode="decode", tp_rank=rank)
                out.append(_series(sg.REALTIME_TOKENS.name, rank_labels, f"0+{decode}x{STEPS}"))
        if pod == "qwen-0":  # restarts 30 s before the evaluation time
            before = 277
            values = f"0+{requests}x{before} 0+{requests}x{STEPS - before - 1}"
        else:
            values = f"0+{requests}x{STEPS}"
        out.append(_series(sg.NUM_REQUESTS.name, _engine(sg.NUM_REQUESTS, labels), values))
        owner = {"namespace": NS, "pod": pod, "tpu_generation": PODS[pod]["tpu_generation"]}
        out.append(_series("tpuserve_replica_tpu_chips", owner, f"{CHIPS[pod]}+0x{STEPS}"))
        info = {"namespace": NS, "pod": pod, **PODS[pod]}
        out.append(_series("tpuserve_replica_info", info, f"1+0x{STEPS}"))
    gone = {"namespace": NS, "pod": "gone-0", "model_name": "gone", "tpu_generation": "v6e"}
    out.append(_series(sg.PROMPT_TOKENS.name, _engine(sg.PROMPT_TOKENS, gone), "0+1500x120"))
    # TTFT of llama: per step 15 requests <= 1 s, 24 <= 2 s, all 30 <= 4 s.
    llama = {"namespace": NS, "pod": "llama-0", "model_name": "llama"}
    for spec, buckets, count in (
        (sg.TIME_TO_FIRST_TOKEN, TTFT_BUCKETS, 30),
        (sg.INTER_TOKEN_LATENCY, ITL_BUCKETS, 300),
        (sg.E2E_REQUEST_LATENCY, E2E_BUCKETS, None),
        (sg.QUEUE_TIME, QUEUE_BUCKETS, None),
    ):
        for le, per_step in buckets.items():
            bucket = {**_engine(spec, llama), "le": le}
            out.append(_series(f"{spec.name}_bucket", bucket, f"0+{per_step}x{STEPS}"))
        if count is not None:
            out.append(_series(f"{spec.name}_count", _engine(spec, llama), f"0+{count}x{STEPS}"))
    return out


TTFT_BUCKETS = {"1.0": 15, "2.0": 24, "4.0": 30, "+Inf": 30}
ITL_BUCKETS = {"0.05": 150, "0.1": 285, "0.2": 300, "+Inf": 300}
E2E_BUCKETS = {"2.0": 6, "4.0": 15, "8.0": 30, "+Inf": 30}
QUEUE_BUCKETS = {"0.1": 24, "0.5": 30, "+Inf": 30}


def histogram_quantile(q: float, buckets: dict[str, int], window_seconds: int) -> float:
    """Prometheus 2.x bucketQuantile over rates of the given per-step bucket increments."""
    bounds = [(float(le), _rate(n, window_seconds)) for le, n in buckets.items()]
    rank = q * bounds[-1][1]
    b = next((i for i, (_, count) in enumerate(bounds[:-1]) if count >= rank), len(bounds) - 1)
    if b == len(bounds) - 1:
        return bounds[-2][0]
    start, end, count = 0.0, bounds[b][0], bounds[b][1]
    if b > 0:
        start = bounds[b - 1][0]
        count -= bounds[b - 1][1]
        rank -= bounds[b - 1][1]
    return start + (end - start) * (rank / count)


def _expect(expr: str, samples: Iterable[dict[str, Any]]) -> dict[str, Any]:
    return {"expr": expr, "eval_time": EVAL, "exp_samples": list(samples)}


def _alert(name: str, labels: dict[str, str]) -> dict[str, Any]:
    alert = next(a for a in rules.alerts() if a.alert == name)
    annotations = {"summary": alert.summary, "description": alert.description}
    for key, text in annotations.items():
        for label, value in labels.items():
            text = text.replace(f"{{{{ $labels.{label} }}}}", value)
        annotations[key] = text
    return {"exp_labels": {**labels, "severity": alert.severity}, "exp_annotations": annotations}
