"""bench/plan_ttft_vs_twin.py: the planner's TTFT p99 against the engine twin's. The error
band `slo_sizing.TTFT_P99_ERROR` (what status.plan.errorBand and `tpuserve plan --fit` report)
is the one its committed results give, and every case is measured below, at and past its
operating point."""

from __future__ import annotations

import pytest

from sglang_tpu import slo_sizing
from tests.bench_scripts import load_bench_script

pytestmark = pytest.mark.unit

bench = load_bench_script("plan_ttft_vs_twin", "bench_plan_ttft_vs_twin")


def test_the_reported_band_is_the_committed_validations() -> None:
    table = bench.rows(bench.RESULTS)
    band = bench.band(table)
    assert band["cases"] == len(bench.CASES) == slo_sizing.TTFT_P99_ERROR["cases"]
    assert band["low"] == slo_sizing.TTFT_P99_ERROR["low"]
    assert band["high"] == slo_sizing.TTFT_P99_ERROR["high"]
    assert band["low"] <= band["high"]


def test_every_case_is_measured_below_at_and_past_its_point() -> None:
    for name, case in bench.CASES.items():
        point = bench.sized(case)[3].requests_per_second
        assert min(case.rates) < point * 0.995, name
        assert any(abs(r / point - 1) < 0.005 for r in case.rates), name
        assert max(case.rates) > point * 1.005, name
