"""The cache-sizing rule, on hand-worked traces."""

from __future__ import annotations

import pytest

from tpuserve.bench import sizing
from tpuserve.bench.traces import TraceRequest

pytestmark = pytest.mark.unit


def _req(i: int, ids: list[int], max_tokens: int = 16) -> TraceRequest:
    return TraceRequest(f"r{i}", float(i), max_tokens, prompt_token_ids=ids)


def test_demand_counts_pages_two_requests_share_once() -> None:
    shared = list(range(100, 132))  # two pages of 16
    trace = [
        _req(0, shared + [1] * 16),
        _req(1, shared + [2] * 16),
        _req(2, shared + [3] * 16),
        _req(3, [9] * 48),  # shares nothing
    ]
    demand = sizing.measure_demand(trace, page_size=16)
    assert demand.shared_tokens == 32
    # private: 3 x (48 - 32 + 16) + (48 + 16) = 96 + 64 = 160 over 4 requests
    assert demand.mean_private_tokens == pytest.approx(40.0)
    assert demand.max_request_tokens == 64


def test_per_worker_cache_puts_demand_at_3_to_6_workers_plus_a_working_set() -> None:
    demand = sizing.CacheDemand(shared_tokens=300_000, mean_private_tokens=100.0,
                                max_request_tokens=2000)  # fmt: skip
    assert sizing.workers_of_demand(4) == 3.0  # 0.7 x 4 = 2.8 -> clamped to 3
    assert sizing.workers_of_demand(8) == pytest.approx(5.6)
    assert sizing.workers_of_demand(16) == 6.0
    c = sizing.cache_tokens_for(demand, 4)
    assert c == 99 * 1024  # 300k / 3 + 8 x 100 = 100,800, rounded up to a multiple of 1,024
    assert demand.shared_tokens / (c * 4) == pytest.approx(0.74, abs=0.01)


def test_no_sharing_and_fits_all_controls() -> None:
    none = sizing.CacheDemand(0, 1000.0, 1100)
    assert sizing.cache_tokens_for(none, 4) == sizing.MIN_CACHE_TOKENS * 2  # 8 x 1000 -> 8,192
    some = sizing.CacheDemand(50_000, 100.0, 2000)
    assert sizing.fits_all(some) >= 2 * some.shared_tokens
    with pytest.raises(ValueError, match="--workers"):
        sizing.cache_tokens_for(some, 0)
