"""Summary statistics (percentiles, hit rate, goodput, imbalance, recovery) on hand-made records."""

from __future__ import annotations

import math

import pytest

from tpuserve.bench.report import (
    LoadSamples,
    RequestRecord,
    percentile,
    recovery_seconds,
    summarize,
)

pytestmark = pytest.mark.unit


def rec(i: int, arrival: float, ttft: float, e2e: float, cached: int, prompt: int = 100,
        worker: str = "a", out: int = 11) -> RequestRecord:  # fmt: skip
    r = RequestRecord(f"r{i}", worker, arrival, prompt, "prefix_hit", ttft, e2e, cached, out, True)
    r.ttft_slo, r.tpot_slo = 0.5, 0.1
    return r


def test_percentile_interpolates_linearly() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert math.isnan(percentile([], 50))


def test_summary_hit_rate_goodput_and_warmup() -> None:
    records = [
        rec(0, 0.0, 9.0, 9.5, 0),  # warm-up, not measured
        rec(1, 1.0, 0.1, 1.1, 50),  # good: tpot 0.1
        rec(2, 2.0, 0.9, 1.5, 100),  # ttft over its SLO
        rec(3, 3.0, 0.2, 2.0, 0),  # tpot 0.18 over its SLO
        rec(4, 4.0, 0.1, 0.6, 90),  # good
    ]
    s = summarize("p", records, None, warmup_fraction=0.2)
    assert s["requests"] == 4
    assert s["hit_rate"] == pytest.approx(240 / 400)
    assert s["ttft_mean"] == pytest.approx(0.325)
    span = 5.0 - 1.0  # first measured arrival to the last finish (r3 at 3.0 + 2.0)
    assert s["throughput_rps"] == pytest.approx(4 / span)
    assert s["goodput_rps"] == pytest.approx(2 / span)
    assert s["output_tokens_per_s"] == pytest.approx(44 / span)


def test_failed_requests_count_as_failed_and_not_good() -> None:
    bad = RequestRecord("x", "a", 0.5, 100, error="worker_restarted")
    s = summarize("p", [rec(0, 0.0, 0.1, 1.0, 0), bad], None, warmup_fraction=0.0)
    assert s["failed"] == 1
    assert s["succeeded"] == 1
    assert s["good_fraction"] == 0.5


def test_imbalance_is_max_over_mean_of_time_averaged_loads() -> None:
    samples = LoadSamples(["a", "b"])
    samples.add(0.0, [4, 0])
    samples.add(0.1, [2, 2])
    ratio, cv = samples.imbalance(0.0, 1.0)
    assert ratio == pytest.approx(3 / 2)  # averages 3 and 1, mean 2
    assert cv == pytest.approx(0.5)  # (1.0 + 0.0) / 2


def test_recovery_is_the_first_time_the_hit_rate_is_back_to_90_percent() -> None:
    records = [rec(i, i * 0.1, 0.1, 1.0, 90) for i in range(100)]  # 0-10 s at 0.9
    records += [rec(100 + i, 10 + i * 0.1, 0.1, 1.0, 0) for i in range(20)]  # 10-12 s cold
    records += [rec(200 + i, 12 + i * 0.1, 0.1, 1.0, 90) for i in range(50)]  # back at 12 s
    result = recovery_seconds(records, 10.0)
    assert result["pre_fault_hit_rate"] == pytest.approx(0.9)
    assert result["recovery_seconds"] == pytest.approx(3.0)  # 1 s trailing window after 12 s
    never = recovery_seconds(records[:120], 10.0)
    assert never["recovery_seconds"] is None
