"""bench/guidellm_run.py's conversions: GuideLLM's JSON to llm-d's report and the per-chip line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.bench_scripts import load_bench_script

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[3] / "bench"


def _load() -> ModuleType:
    return load_bench_script("guidellm_run", "bench_guidellm_run")


run = _load()


def _stat(mean: float, p50: float, p99: float) -> dict[str, Any]:
    """GuideLLM 0.8's distribution summary, as its JSON output writes it."""
    pct = {"p10": p50 / 2, "p50": p50, "p90": p99, "p99": p99}
    return {
        "successful": {"mean": mean, "median": p50, "std_dev": 1.0, "min": 0.5, "max": p99,
                       "percentiles": pct}
    }  # fmt: skip


BENCHMARK: dict[str, Any] = {
    "duration": 30.0,
    "requests": {
        "successful": [{"prompt_tokens": 4368, "cached_tokens": 4096}] * 3
        + [{"prompt_tokens": 4368, "cached_tokens": 0}],
    },
    "metrics": {
        "request_totals": {"successful": 58, "errored": 2, "incomplete": 0, "total": 60},
        "prompt_token_count": _stat(4368, 4368, 4368),
        "output_token_count": _stat(128, 128, 128),
        "request_latency": _stat(1.9, 1.8, 3.0),
        "time_to_first_token_ms": _stat(70.0, 57.0, 900.0),
        "time_per_output_token_ms": _stat(14.0, 13.0, 20.0),
        "inter_token_latency_ms": _stat(14.0, 13.0, 20.0),
        "output_tokens_per_second": _stat(800.0, 790.0, 900.0),
        "tokens_per_second": _stat(28000.0, 27000.0, 30000.0),
        "requests_per_second": _stat(6.0, 6.0, 7.0),
    },
}


def _args(**over: Any) -> argparse.Namespace:
    base = {"workload": "shared-prefix", "rate": [6.0], "max_seconds": 30.0, "max_requests": 0,
            "prefixes": 32, "prefix_tokens": 4096, "prompt_tokens": 256, "output_tokens": 128,
            "tpu": "v6e", "topology": "1x1", "chips_per_engine": 1, "model": "m",
            "model_profile": "llama-3.1-8b", "time_scale": 1.0, "seed": 0,
            "stream_interval": 1}  # fmt: skip
    return argparse.Namespace(**(base | over))


def test_a_guidellm_benchmark_becomes_an_llmd_report() -> None:
    report = run.llmd_report(BENCHMARK, "router:precise", _args(), engines=4)
    assert report["version"] == "0.1"
    assert set(report) == {"version", "scenario", "metrics"}
    assert report["scenario"]["host"]["type"] == ["replica"] * 4
    assert report["scenario"]["load"]["args"]["data"]["prefix_buckets"][0]["prefix_tokens"] == 4096
    m = report["metrics"]
    assert (m["requests"]["total"], m["requests"]["failures"]) == (60, 2)
    ttft = m["latency"]["time_to_first_token"]
    assert (ttft["units"], ttft["mean"], ttft["p50"], ttft["p99"]) == ("ms", 70.0, 57.0, 900.0)
    assert m["throughput"]["output_tokens_per_sec"] == 800.0
    assert m["metadata"]["prefix_cache_hit_rate"] == pytest.approx(3 * 4096 / (4 * 4368))


@pytest.mark.parametrize(
    ("ttft", "itl", "met"),
    [(1000.0, 50.0, (True, True)), (500.0, 50.0, (False, True)), (1000.0, 10.0, (True, False))],
)
def test_the_summary_is_output_tokens_per_chip_at_the_ttft_and_itl_targets(
    ttft: float, itl: float, met: tuple[bool, bool]
) -> None:
    report = run.llmd_report(BENCHMARK, "router:precise", _args(), engines=4)
    row = run.summary(report, "router:precise", chips=4, ttft_target_ms=ttft, itl_target_ms=itl)
    assert row["output_tokens_per_second_per_chip"] == 200.0
    assert (row["ttft_target_met"], row["itl_target_met"]) == met
    line = "| router:precise | 4 | 60 (58) | 2 | 800 | 200 | 57 / 900 | 13.0 / 20.0 | 0.703 |"
    assert line in run.markdown([row])


def test_a_scaled_clock_is_reported_in_modelled_time() -> None:
    """At --time-scale 0.25 the engines run 4x fast: GuideLLM is asked for 4x the modelled
    rate, and its real latencies (x4) and throughputs (/4) are converted back."""
    args = _args(time_scale=0.25)
    scenario = run.scenario("http://127.0.0.1:1", args, Path("/tok"), Path("/o.json"))
    assert scenario["profile"] == {"kind": "constant", "rate": [24.0]}
    real = run.llmd_report(BENCHMARK, "single", _args(), engines=1)["metrics"]
    modelled = run.llmd_report(BENCHMARK, "single", args, engines=1)["metrics"]
    ttft = modelled["latency"]["time_to_first_token"]
    assert (ttft["p50"], ttft["p99"]) == (4 * 57.0, 4 * 900.0)
    assert modelled["latency"]["inter_token_latency"]["p99"] == 4 * 20.0
    assert modelled["latency"]["request_latency"]["mean"] == 4 * 1.9
    assert modelled["throughput"]["output_tokens_per_sec"] == 800.0 / 4
    assert modelled["time"]["duration"] == 4 * real["time"]["duration"]
    assert modelled["requests"] == real["requests"]  # counts are not times
    back_to_back = run.llmd_report(BENCHMARK, "single", _args(time_scale=0.0), engines=1)
    assert back_to_back["metrics"] == real


@pytest.mark.parametrize(
    ("workload", "prompt", "output"),
    [("1k1k", 1024, 1024), ("1k8k", 1024, 8192), ("8k1k", 8192, 1024)],
)
def test_the_fixed_profiles_share_nothing(workload: str, prompt: int, output: int) -> None:
    spec = run.data_spec(_args(workload=workload))
    assert spec == {"kind": "synthetic_text", "prompt_tokens": prompt, "output_tokens": output}
    scenario = run.scenario("http://127.0.0.1:1", _args(), Path("/tok"), Path("/o.json"))
    assert scenario["tokenizer"] == {"kind": "huggingface_auto", "model": "/tok"}
    assert scenario["profile"] == {"kind": "constant", "rate": [6.0]}


def test_the_engines_get_the_stream_interval() -> None:
    flags = run.engine_args(_args(stream_interval=8), Path("/tok"))
    assert flags[flags.index("--stream-interval") + 1] == "8"


def test_engine_flags_join_for_tpuserve_up() -> None:
    assert run._joined(["--tpu", "v6e", "--enable-cache-report", "--topology", "1x1"]) == [
        "--tpu=v6e",
        "--enable-cache-report",
        "--topology=1x1",
    ]


def test_the_router_hit_rate_is_read_off_its_own_counters() -> None:
    """What the router counted from each response's usage, summed over workers, between two
    reads of /metrics (HELP and TYPE lines and other series ignored)."""
    text = """# HELP tpuserve_router_prompt_tokens_total Prompt tokens of finished requests.
# TYPE tpuserve_router_prompt_tokens_total counter
tpuserve_router_prompt_tokens_total{model="m",worker="http://a"} 3000.0
tpuserve_router_prompt_tokens_total{model="m",worker="http://b"} 1000.0
tpuserve_router_prompt_tokens_created{model="m",worker="http://a"} 1.7e9
tpuserve_router_cached_tokens_total{model="m",worker="http://a"} 2048.0
tpuserve_router_cached_tokens_total 952
tpuserve_router_predicted_cached_tokens_total{model="m",worker="http://a"} 9999.0
"""
    after = run.router_token_counts(text)
    assert after == {"tpuserve_router_prompt_tokens_total": 4000.0,
                     "tpuserve_router_cached_tokens_total": 3000.0}  # fmt: skip
    before = {"tpuserve_router_prompt_tokens_total": 2000.0,
              "tpuserve_router_cached_tokens_total": 1000.0}  # fmt: skip
    assert run.router_hit_rate(before, after) == 1.0
    assert run.router_hit_rate(after, after) is None


def test_several_rates_run_in_one_scenario_and_the_figure_is_the_best_that_met_the_targets(
    tmp_path: Path,
) -> None:
    args = _args(rate=[2.0, 4.0, 8.0], time_scale=0.5, out=tmp_path, ttft_target_ms=1000.0,
                 itl_target_ms=50.0)  # fmt: skip
    scenario = run.scenario("http://127.0.0.1:1", args, Path("/tok"), Path("/o.json"))
    assert scenario["profile"] == {"kind": "constant", "rate": [4.0, 8.0, 16.0]}

    def bench(tokens_per_s: float, ttft_p99_ms: float) -> dict[str, Any]:
        metrics = dict(BENCHMARK["metrics"])
        metrics["output_tokens_per_second"] = _stat(tokens_per_s, tokens_per_s, tokens_per_s)
        metrics["time_to_first_token_ms"] = _stat(ttft_p99_ms / 2, ttft_p99_ms / 2, ttft_p99_ms)
        return {**BENCHMARK, "metrics": metrics}

    # real seconds at --time-scale 0.5: TTFT p99 200, 400 and 800 ms are 400, 800, 1600 modelled
    data = {"benchmarks": [bench(400.0, 200.0), bench(800.0, 400.0), bench(1600.0, 800.0)]}
    run.write_reports(args, [("single", data, 1), ("router:precise", data, 4)])
    best = json.loads((tmp_path / "at_target.json").read_text())
    assert best == [
        {"setup": "single", "rate": 4.0, "output_tokens_per_second_per_chip": 400.0,
         "ttft_p99_ms": 800.0, "itl_p99_ms": 40.0},
        {"setup": "router:precise", "rate": 4.0, "output_tokens_per_second_per_chip": 100.0,
         "ttft_p99_ms": 800.0, "itl_p99_ms": 40.0},
    ]  # fmt: skip
    assert (tmp_path / "single-8.llmd-report.json").exists()
    rows = json.loads((tmp_path / "summary.json").read_text())
    assert [r["label"] for r in rows[:3]] == ["single @ 2", "single @ 4", "single @ 8"]
    none_met = run.at_target([{**rows[2], "setup": "x"}])
    assert none_met == [{"setup": "x"}]
    assert "none met both" in run.markdown_at_target(none_met, 1000.0, 50.0)
