"""bench/router_cold_misses.py: its workload runs, and it reads cachegrind's totals."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.router_cold_misses import totals, workload

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("route", [True, False])
def test_the_workload_routes_or_only_evicts(route: bool) -> None:
    workload("precise", requests=5, warm_up=5, evict_mb=1, route=route)


def test_cachegrinds_summary_is_read_by_event(tmp_path: Path) -> None:
    out = tmp_path / "cachegrind.out"
    out.write_text(
        "desc: x\ncmd: python\nevents: Ir ILmr DLmr DLmw\nfl=a\n1 2 3 4 5\nsummary: 10 2 3 4\n"
    )
    assert totals(out) == {"Ir": 10, "ILmr": 2, "DLmr": 3, "DLmw": 4}
    out.write_text("events: Ir\n")
    with pytest.raises(ValueError, match="no summary line"):
        totals(out)
