"""The scaling behaviour (`tpuserve_operator.scaling_behavior`): the HPA controller's
stabilization and rate policies, as the operator renders them and the fleet model applies
them."""

from __future__ import annotations

import pytest

from tpuserve_operator import scaling_behavior as sb
from tpuserve_operator.scaling_behavior import Policy, Rules, Stepper

pytestmark = pytest.mark.unit


def _run(
    stepper: Stepper, current: int, desires: list[int], lo: int = 1, hi: int = 1000
) -> list[int]:
    """Decisions every 15 s from t = 0; the count after each."""
    out = []
    for i, desired in enumerate(desires):
        current = stepper.step(15.0 * i, current, desired, lo, hi)
        out.append(current)
    return out


def test_the_default_scales_up_by_the_most_of_four_slices_and_a_doubling_per_15_s() -> None:
    # 100 %: 40 -> 80 at once, then 160 after the period (not 1 a minute)
    assert _run(Stepper(sb.DEFAULT), 40, [250, 250, 250]) == [80, 160, 250]
    # 4 slices beat 100 % of 1
    assert _run(Stepper(sb.DEFAULT), 1, [50, 50]) == [5, 10]


def test_the_default_waits_the_window_then_sheds_ten_percent_a_minute() -> None:
    stepper = Stepper(sb.DEFAULT)
    counts = _run(stepper, 250, [250] + [70] * 40)
    assert counts[:21] == [250] * 21  # the 300-s window still holds the desire of t = 0
    # t = 315 s: down 10 % of 250 (25), then nothing more within that minute
    assert counts[21:25] == [225, 225, 225, 225]
    assert counts[25] == 202  # 225 less 10 % (202.5, rounded down as the HPA does)


def test_the_pods_policy_keeps_a_small_fleet_moving_at_one_a_minute() -> None:
    counts = _run(Stepper(sb.DEFAULT), 5, [5] + [1] * 30)
    # 10 % of 5 is under 1: one a minute
    assert (counts[20], counts[21], counts[25]) == (5, 4, 3)


def test_one_per_minute_is_what_the_operator_rendered_before() -> None:
    assert _run(Stepper(sb.ONE_PER_MINUTE), 40, [250] * 9) == [41, 41, 41, 41, 42, 42, 42, 42, 43]
    assert sb.ONE_PER_MINUTE.manifest()["scaleUp"]["policies"] == [
        {"type": "Pods", "value": 1, "periodSeconds": 60}
    ]


def test_the_fleet_models_old_mechanics_go_up_at_once_and_down_one_a_minute() -> None:
    stepper = Stepper(sb.UP_AT_ONCE_DOWN_ONE_PER_MINUTE)
    assert _run(stepper, 40, [250]) == [250]
    counts = _run(Stepper(sb.UP_AT_ONCE_DOWN_ONE_PER_MINUTE), 250, [250] + [70] * 28)
    assert (counts[21], counts[24], counts[25]) == (249, 249, 248)


def test_the_bounds_hold_and_a_period_counts_the_changes_both_ways() -> None:
    # within 15 s of removing 10, the period started at 50: 100 % allows 100, bounded by hi
    rules = sb.DEFAULT.scale_up
    assert sb.limit_up(rules, 40, [0, 0], [10, 10]) == 100
    assert _run(Stepper(sb.DEFAULT), 40, [250], hi=60) == [60]
    assert _run(Stepper(sb.DEFAULT), 4, [4] + [1] * 30, lo=3)[-1] == 3


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Policy("Pods", 0, 60), "value: 0 is not allowed; allowed: >= 1"),
        (lambda: Policy("Percent", 10, 0), "period_seconds: 0 is not allowed; allowed: 1..1800"),
        (lambda: Rules(3601, (Policy("Pods", 1, 60),)), "allowed: 0..3600"),
        (lambda: Rules(0, ()), "allowed: at least one policy"),
        (lambda: sb.behavior(scale_down_pods=0, scale_down_percent=0), "at least one policy"),
    ],
)
def test_a_behaviour_that_kubernetes_would_refuse_is_refused(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]
