"""`--max-rate-at-slo`: goodput as the highest rate whose requests meet the SLO, and the live
working set that sizes a multi-turn workload's HBM."""

from __future__ import annotations

from typing import Any

import pytest

from tpuserve.bench import sizing
from tpuserve.bench.slo_search import search_max_rate
from tpuserve.bench.traces import TraceRequest

pytestmark = pytest.mark.unit


def capacity(limit: float) -> Any:
    """A fleet every request of which meets the SLO up to ``limit`` requests/s, and a falling
    share of which does beyond it."""

    def run_at(rate: float) -> dict[str, Any]:
        good = 1.0 if rate <= limit else limit / rate
        return {"good_fraction": good, "goodput_rps": good * rate, "ttft_p50": 0.1,
                "ttft_p99": 0.2}  # fmt: skip

    return run_at


@pytest.mark.parametrize("start", [1.0, 7.0, 40.0])
def test_the_search_finds_the_highest_rate_meeting_the_attainment(start: float) -> None:
    # attainment 0.9 holds up to limit / 0.9 = 11.11 requests/s
    found = search_max_rate(capacity(10.0), start, attainment=0.9, tolerance=0.01)
    assert 11.11 / 1.011 <= found.max_rate <= 11.112
    assert found.best is not None
    assert found.best["good_fraction"] >= 0.9
    assert any(not t["meets"] for t in found.tried)  # it bracketed the limit
    assert all(t["meets"] == (t["good_fraction"] >= 0.9) for t in found.tried)


def test_a_fleet_that_meets_it_nowhere_has_no_rate() -> None:
    def never(rate: float) -> dict[str, Any]:
        return {"good_fraction": 0.5, "goodput_rps": rate / 2, "ttft_p50": 1, "ttft_p99": 9}

    found = search_max_rate(never, 1.0, max_runs=6)
    assert found.max_rate == 0.0
    assert found.best is None
    assert len(found.tried) == 6
    record = found.record(5.0, 1.0)
    assert (record["max_rate"], record["goodput_rps"], record["start_rate"]) == (0.0, 0.0, 1.0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"attainment": 0.0}, "attainment"),
        ({"attainment": 1.5}, "attainment"),
        ({"growth": 1.0}, "growth"),
    ],
)
def test_bad_search_parameters_are_refused_naming_them(
    kwargs: dict[str, float], field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        search_max_rate(capacity(1.0), 1.0, **kwargs)  # type: ignore[arg-type]


def _chat(t: float, session: str, ids: list[int]) -> TraceRequest:
    return TraceRequest(f"{session}-{t}", t, 8, None, None, ids, session, ids)


def test_the_live_working_set_counts_only_prefixes_alive_at_once() -> None:
    """Two conversations one after the other: each shares 32 tokens between its turns; the
    trace shares 64 tokens in all, but at most 32 are live at any time."""
    a, b = list(range(32)), list(range(1000, 1032))
    trace = [_chat(0.0, "a", [*a, 1]), _chat(1.0, "a", [*a, 2]),
             _chat(2.0, "b", [*b, 3]), _chat(3.0, "b", [*b, 4])]  # fmt: skip
    assert sizing.measure_demand(trace, 16).shared_tokens == 64
    live = sizing.live_shared_tokens(trace, 16)
    assert live.peak_tokens == 32
    assert live.mean_tokens == pytest.approx(32 * 2 / 3)  # alive over 2 of the 3 seconds


def test_the_bench_reports_the_highest_rate_at_the_slo(capsys: pytest.CaptureFixture[str]) -> None:
    from tpuserve.cli import main

    args = ["bench", "--workload", "W1", "--requests", "200", "--cache-tokens", "8192",
            "--rate", "20", "--max-rate-at-slo", "--json"]  # fmt: skip
    assert main(args) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    search = data["slo_search"]
    assert search["attainment"] == 0.9
    assert search["max_rate"] == data["rate"] > 0  # the summary is the run at that rate
    assert data["good_fraction"] >= 0.9
    above = [t for t in search["tried"] if t["rate"] > search["max_rate"]]
    assert above
    assert not any(t["meets"] for t in above)


def test_the_rate_search_refuses_a_rate_fraction(capsys: pytest.CaptureFixture[str]) -> None:
    from tpuserve.cli import main

    args = ["bench", "--workload", "W1", "--max-rate-at-slo", "--rate-fraction", "0.5"]
    assert main(args) == 2
    assert "--max-rate-at-slo" in capsys.readouterr().err
