"""bench/inference_perf_run.py: its config for inference-perf and the per-chip line from its
summary report, in the engine twins' modelled time."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.bench_scripts import load_bench_script

pytestmark = pytest.mark.unit


def _load() -> ModuleType:
    return load_bench_script("inference_perf_run", "bench_inference_perf_run")


run = _load()


def _args(**over: Any) -> argparse.Namespace:
    base = {"workload": "1k1k", "rate": 2.0, "max_seconds": 30, "prefixes": 8,
            "prefix_tokens": 1024, "prompt_tokens": 64, "output_tokens": 32, "model": "m",
            "time_scale": 1.0, "client_workers": 1, "seed": 0, "ttft_target_ms": 1000.0,
            "itl_target_ms": 50.0}  # fmt: skip
    return argparse.Namespace(**(base | over))


def _dist(mean: float, median: float, p99: float) -> dict[str, float]:
    """inference-perf 0.7's summarize(): mean, min, max and its percentiles, in seconds."""
    return {"mean": mean, "min": median / 2, "max": p99, "median": median, "p99": p99}


SUMMARY = {
    "successes": {
        "count": 58,
        "latency": {
            "time_to_first_token": _dist(0.08, 0.06, 0.9),
            "inter_token_latency": _dist(0.014, 0.013, 0.02),
        },
        "throughput": {"output_tokens_per_sec": 800.0},
        "prompt_tokens": {"total": 4000.0, "cached": 1000.0, "uncached": 3000.0},
    },
    "failures": {"count": 2},
}


@pytest.mark.parametrize(
    ("workload", "prompt", "output"),
    [("1k1k", 1024, 1024), ("1k8k", 1024, 8192), ("8k1k", 8192, 1024)],
)
def test_the_fixed_shapes_are_random_data_of_one_length(
    workload: str, prompt: int, output: int
) -> None:
    data = run.data_config(_args(workload=workload))
    assert data["type"] == "random"
    assert data["input_distribution"] == {
        "min": prompt,
        "max": prompt,
        "mean": prompt,
        "std_dev": 0,
    }
    assert data["output_distribution"]["min"] == data["output_distribution"]["max"] == output


def test_the_config_streams_chat_at_the_real_rate_of_a_scaled_clock() -> None:
    cfg = run.config("http://127.0.0.1:1", _args(time_scale=0.5), Path("/tok"), Path("/out"))
    assert cfg["api"] == {"type": "chat", "streaming": True}
    assert cfg["load"]["stages"] == [{"rate": 4.0, "duration": 30}]
    assert cfg["server"]["base_url"] == "http://127.0.0.1:1"
    assert cfg["tokenizer"] == {"pretrained_model_name_or_path": "/tok"}
    prefix = run.data_config(_args(workload="shared-prefix"))["shared_prefix"]
    assert (prefix["num_groups"], prefix["system_prompt_len"]) == (8, 1024)
    assert prefix["num_groups"] * prefix["num_prompts_per_group"] >= 2.0 * 30


def test_the_summary_line_is_per_chip_in_modelled_time() -> None:
    row = run.summary_row(SUMMARY, "router:precise", 4, _args())
    assert (row["requests"], row["completed"], row["failures"]) == (60, 58, 2)
    assert row["output_tokens_per_second_per_chip"] == 200.0
    assert row["ttft_p99_ms"] == pytest.approx(900.0)
    assert row["hit_rate"] == 0.25
    assert (row["ttft_target_met"], row["itl_target_met"]) == (True, True)
    fast = run.summary_row(SUMMARY, "router:precise", 4, _args(time_scale=0.25))
    assert fast["ttft_p99_ms"] == pytest.approx(3600.0)
    assert fast["itl_p50_ms"] == pytest.approx(52.0)
    assert fast["output_tokens_per_second"] == 200.0
    assert (fast["ttft_target_met"], fast["itl_target_met"]) == (False, False)


def test_a_summary_without_cache_figures_has_no_hit_rate() -> None:
    assert run.hit_rate({"prompt_tokens": {"total": 0.0, "cached": 0.0}}) is None
    assert run.hit_rate({}) is None
