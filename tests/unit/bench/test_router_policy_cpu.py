"""bench/router_policy_cpu.py runs every step it times, for a token policy and a plain one."""

from __future__ import annotations

import pytest

from bench.router_policy_cpu import measure

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("policy", ["precise", "cache_aware", "round_robin"])
def test_the_policy_cost_bench_times_parsing_and_choosing(policy: str) -> None:
    figures = measure(policy, requests=40, warm_up=10)
    assert set(figures) == {"parse_us", "choose_us", "total_us"}
    assert all(value > 0 for value in figures.values())


def test_the_cold_figure_times_requests_after_evicting_the_caches() -> None:
    figures = measure("precise", requests=20, warm_up=10, cold_mb=1)
    assert set(figures) == {"parse_us", "choose_us", "total_us", "cold_us"}
    assert figures["cold_us"] > 0
