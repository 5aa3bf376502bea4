"""bench/router_side_by_side.py: its ratios pair rounds, and its arguments are checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.router_side_by_side import interpreter_problem, median_interval, paired, summarize

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "router_side_by_side.py"


def rows(*pairs: tuple[float, float]) -> list[dict[str, float]]:
    return [{"cpu_us_per_request": a, "against_us": b, "errors": 0} for a, b in pairs]


def test_a_ratio_is_the_median_of_the_rounds_ratios() -> None:
    # a slow round slows both routers: round by round the first costs 0.9x
    assert paired(rows((90, 100), (450, 500), (180, 200))) == pytest.approx(0.9)
    # the ratio of the medians would say 1.0 here; round by round it is 1.25x, 0.5x, 2x
    assert paired(rows((125, 100), (100, 200), (400, 200))) == pytest.approx(1.25)


def test_the_summary_has_a_row_per_pair() -> None:
    summary = summarize(
        {("new", "old"): rows((90, 100), (180, 200)), ("new", "anchor"): rows((90, 100))}
    )
    first, second = summary
    assert (first["router"], first["against"]) == ("new", "old")
    assert first["cpu_us_per_request"] == 135
    assert first["against_us_per_request"] == 150
    assert first["paired_ratio"] == pytest.approx(0.9)
    assert (second["against"], second["errors"]) == ("anchor", 0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rate", "0"], "--rate must be > 0, got 0.0"),
        (["--policies", "precise+kvv"], "unknown modifier 'kvv'"),
        (["--policies", "precise+auth"], "+auth is not measured here"),
        (["--baseline", "/nonexistent"], "--baseline /nonexistent: not a tpuserve checkout"),
        (["--skip-anchor"], "--skip-anchor without --baseline leaves nothing to compare"),
        (["--engines", "twins"], "invalid choice: 'twins'"),
        (["--python", "/nonexistent/python"], "--python /nonexistent/python: cannot be run"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(argv: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert message in done.stderr


@pytest.mark.parametrize(
    ("n", "k"),
    # k: the order statistic each end takes (from the binomial tails: P(count <= k - 1) is
    # at most 0.025 and P(count <= k) is more)
    [(6, 1), (8, 1), (9, 2), (12, 3), (16, 4), (20, 6)],
)
def test_the_median_interval_takes_the_binomial_order_statistics(n: int, k: int) -> None:
    values = [float(v) for v in range(n, 0, -1)]  # unsorted on purpose
    assert median_interval(values) == (k, n - k + 1)


def test_the_median_interval_needs_enough_rounds() -> None:
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None  # 2 / 32 > 0.025 even at k = 1
    assert median_interval([]) is None
    with pytest.raises(ValueError, match="level must be in"):
        median_interval([1.0] * 8, level=1.0)


def test_the_summary_gives_the_paired_ratios_interval() -> None:
    ratios = [0.9, 1.1, 1.0, 0.95, 1.05, 0.97]
    (row,) = summarize({("new", "anchor"): rows(*((100 * r, 100) for r in ratios))})
    assert row["paired_ratio_ci95"] == pytest.approx((0.9, 1.1))
    (short,) = summarize({("new", "anchor"): rows((90, 100), (110, 100))})
    assert short["paired_ratio_ci95"] is None


def test_an_interpreter_is_taken_only_if_it_imports_the_router(tmp_path: Path) -> None:
    assert interpreter_problem(sys.executable) is None  # this one has the project installed
    bare = tmp_path / "python"
    bare.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named tpuserve' >&2\nexit 1\n")
    bare.chmod(0o755)
    problem = interpreter_problem(str(bare))
    assert problem == (
        "does not import tpuserve and its router (ModuleNotFoundError: No module named tpuserve)"
    )
