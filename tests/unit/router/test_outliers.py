"""Outlier ejection: consecutive failures or a failure rate eject a worker, for longer each
time, never more than the allowed share of the fleet; it returns when its time is up."""

from __future__ import annotations

import pytest

from tests.fakes import VirtualClock
from tpuserve_router.config import RouterConfig
from tpuserve_router.engines.outliers import OutlierDetector, outlier_config
from tpuserve_router.engines.workers import Worker, WorkerSpec

pytestmark = pytest.mark.unit


def fleet(n: int) -> list[Worker]:
    workers = [Worker(WorkerSpec(f"http://w{i}:1")) for i in range(n)]
    for worker in workers:
        worker.health_check_passed(1)
    return workers


def routable(worker: Worker) -> bool:
    """``worker.healthy``, read through a call (the type checker would narrow the attribute)."""
    return worker.healthy


def detector(
    workers: list[Worker], clock: VirtualClock, ejected: list[tuple[str, str]], **settings: float
) -> OutlierDetector:
    config = outlier_config(
        RouterConfig(outlier_base_ejection_seconds=30, outlier_max_ejection_seconds=300).replace(
            **settings
        )
    )
    return OutlierDetector(config, lambda: workers, lambda w, r: ejected.append((w.name, r)), clock)


def test_consecutive_failures_eject_and_a_success_resets_the_count() -> None:
    workers, clock = fleet(4), VirtualClock()
    ejected: list[tuple[str, str]] = []
    outliers = detector(workers, clock, ejected, outlier_consecutive_failures=5)
    sick = workers[0]
    for _ in range(4):
        outliers.failed(sick)
    outliers.succeeded(sick)
    for _ in range(4):
        outliers.failed(sick)
    assert routable(sick)
    outliers.failed(sick)  # the fifth in a row
    assert not routable(sick)
    assert ejected == [(sick.name, "consecutive_failures")]


def test_a_failure_rate_ejects_once_the_window_has_enough_requests() -> None:
    workers, clock = fleet(4), VirtualClock()
    ejected: list[tuple[str, str]] = []
    outliers = detector(workers, clock, ejected, outlier_min_requests=10, outlier_failure_rate=0.5)
    flaky = workers[1]
    for _ in range(4):  # succeed, fail, succeed, ...: never two failures in a row
        outliers.succeeded(flaky)
        outliers.failed(flaky)
    assert routable(flaky)  # 8 requests: not enough to judge
    outliers.succeeded(flaky)
    outliers.failed(flaky)
    assert not routable(flaky)  # 5 of 10 failed
    assert ejected == [(flaky.name, "failure_rate")]


def test_a_new_window_forgets_the_old_rate() -> None:
    workers, clock = fleet(4), VirtualClock()
    ejected: list[tuple[str, str]] = []
    outliers = detector(
        workers, clock, ejected, outlier_min_requests=10, outlier_interval_seconds=10
    )
    flaky = workers[1]
    for _ in range(4):
        outliers.failed(flaky)
        outliers.succeeded(flaky)
    clock.advance(10)
    outliers.release_due(clock())
    outliers.failed(flaky)
    outliers.succeeded(flaky)
    assert routable(flaky)
    assert (flaky.window_requests, flaky.window_failures) == (2, 1)


def test_an_ejection_ends_on_its_own_and_each_one_lasts_longer() -> None:
    workers, clock = fleet(4), VirtualClock()
    ejected: list[tuple[str, str]] = []
    outliers = detector(workers, clock, ejected, outlier_consecutive_failures=1)
    sick = workers[0]
    outliers.failed(sick)
    clock.advance(29)
    outliers.release_due(clock())
    assert not routable(sick)
    clock.advance(1)
    outliers.release_due(clock())
    assert routable(sick)  # 30 s, the base
    outliers.failed(sick)  # back, and failing at once
    clock.advance(30)
    outliers.release_due(clock())
    assert not routable(sick)  # the second ejection lasts 60 s
    clock.advance(30)
    outliers.release_due(clock())
    assert routable(sick)


def test_ejections_are_forgotten_over_time_in_rotation() -> None:
    workers, clock = fleet(4), VirtualClock()
    ejected: list[tuple[str, str]] = []
    outliers = detector(
        workers, clock, ejected, outlier_consecutive_failures=1, outlier_interval_seconds=10
    )
    sick = workers[0]
    outliers.failed(sick)
    clock.advance(30)
    outliers.release_due(clock())
    clock.advance(100)  # ten intervals in rotation
    outliers.failed(sick)
    assert sick.ejected_until == pytest.approx(clock() + 30)  # back to the base


def test_no_more_than_the_allowed_share_of_workers_is_ejected() -> None:
    workers, clock = fleet(4), VirtualClock()
    ejected: list[tuple[str, str]] = []
    outliers = detector(
        workers, clock, ejected, outlier_consecutive_failures=1, outlier_max_ejected_percent=50
    )
    for worker in workers:
        outliers.failed(worker)
    assert [routable(w) for w in workers] == [False, False, True, True]


def test_one_worker_may_be_ejected_whatever_the_share() -> None:
    workers, clock = fleet(1), VirtualClock()
    ejected: list[tuple[str, str]] = []
    outliers = detector(
        workers, clock, ejected, outlier_consecutive_failures=1, outlier_max_ejected_percent=10
    )
    outliers.failed(workers[0])
    assert not workers[0].healthy
