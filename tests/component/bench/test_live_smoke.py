"""Mode live on loopback: engine-twin processes behind `tpuserve router`, a tiny trace over HTTP."""

from __future__ import annotations

import json

import pytest

from tpuserve.cli import main

pytestmark = pytest.mark.component


def test_live_run_through_tpuserve_router_reports_ground_truth_hits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main([
        "bench", "--workload", "W1", "--requests", "40", "--rate", "20", "--workers", "2",
        "--mode", "live", "--policy", "precise", "--time-scale", "0.5",
        "--cache-tokens", "40000", "--workload-param", "groups=4", "--json",
    ])  # fmt: skip
    assert code == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert data["mode"] == "live"
    assert data["router"] == "tpuserve router"
    assert data["requests"] == 36
    assert data["failed"] == 0
    # 4 groups sharing 1,024-token prompts over 2 workers: most prompt tokens come from cache
    assert data["hit_rate"] > 0.5
    assert 0 < data["ttft_p50"] <= data["ttft_p99"] < data["e2e_p99"]
    cpu = data["cpu_share_of_one_core"]
    assert set(cpu) == {"router", "engine0", "engine1", "client"}
    assert all(0 <= v < 2 for v in cpu.values())


def test_live_mode_refuses_anchors_that_need_in_process_engines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["bench", "--workload", "W1", "--requests", "4", "--rate", "5", "--mode", "live",
                 "--policy", "gie_approx"])  # fmt: skip
    assert code == 2
    assert "need the engines in-process (--mode sim)" in capsys.readouterr().err
