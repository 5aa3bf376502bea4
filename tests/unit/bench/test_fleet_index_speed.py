"""bench/fleet_index_speed.py: the fleet model's index and the router's agree on every prefix
and holder set of the fleet hour's requests, evictions included."""

from __future__ import annotations

import pytest

from tests.bench_scripts import load_bench_script

pytestmark = pytest.mark.unit

speed = load_bench_script("fleet_index_speed", "bench_fleet_index_speed")


def test_both_indexes_see_the_same_holders_through_evictions() -> None:
    requests, _, _ = speed.workload(3000)
    engines, cap = 8, 200  # small caches: blocks are evicted and re-stored
    _, fleet = speed.run_fleet_index(requests, engines, cap)
    _, router = speed.run_router_index(requests, engines, cap)
    assert fleet == router
    assert sum(1 for seen in fleet if seen[0] > 0) > len(fleet) // 2  # prefixes are found
    assert any(len(seen) > 2 for seen in fleet)  # some prefixes have several holders


def test_a_different_holder_is_told_apart() -> None:
    requests, _, _ = speed.workload(500)
    _, fleet = speed.run_fleet_index(requests, 8, 200)
    _, fewer = speed.run_fleet_index(requests, 4, 200)
    assert fleet != fewer
