"""group_restart: a multi-host group restarts as one when any of its pods restarts."""

from __future__ import annotations

import dataclasses

import pytest

from tests.fake_kube import make_pod
from tpuserve_operator.group_restart import check
from tpuserve_operator.observed import PodView

pytestmark = pytest.mark.unit


def pod(name: str, uid: str, *, restarts: int = 0, running: bool = True) -> PodView:
    return make_pod(name, uid=uid, restarts=restarts, running=running)


GROUP = [pod("q-r0-0", "a"), pod("q-r0-w-1", "b"), pod("q-r0-w-2", "c")]


def test_no_epoch_until_every_host_runs() -> None:
    starting = [*GROUP[:2], pod("q-r0-w-2", "c", running=False)]
    assert check(None, starting, hosts=3).epoch is None
    assert check(None, GROUP[:2], hosts=3).epoch is None
    verdict = check(None, GROUP, hosts=3)
    assert verdict.epoch == {"q-r0-0": ("a", 0), "q-r0-w-1": ("b", 0), "q-r0-w-2": ("c", 0)}
    assert verdict.delete == ()


def test_a_steady_group_is_left_alone() -> None:
    epoch = check(None, GROUP, hosts=3).epoch
    assert check(epoch, GROUP, hosts=3).epoch == epoch
    assert check(epoch, GROUP, hosts=3).delete == ()


def test_a_recreated_pod_restarts_the_others() -> None:
    epoch = check(None, GROUP, hosts=3).epoch
    recreated = [GROUP[0], pod("q-r0-w-1", "b2", running=False), GROUP[2]]
    verdict = check(epoch, recreated, hosts=3)
    assert verdict.delete == ("q-r0-0", "q-r0-w-2")
    assert verdict.cause == "q-r0-w-1"
    assert verdict.epoch is None


def test_a_container_restart_restarts_the_others() -> None:
    epoch = check(None, GROUP, hosts=3).epoch
    restarted = [pod("q-r0-0", "a", restarts=1), *GROUP[1:]]
    verdict = check(epoch, restarted, hosts=3)
    assert verdict.delete == ("q-r0-w-1", "q-r0-w-2")
    assert verdict.cause == "q-r0-0"


def test_a_pod_being_deleted_or_gone_restarts_the_others() -> None:
    epoch = check(None, GROUP, hosts=3).epoch
    deleting = [GROUP[0], dataclasses.replace(GROUP[1], deleting=True), GROUP[2]]
    assert check(epoch, deleting, hosts=3).delete == ("q-r0-0", "q-r0-w-2")
    assert check(epoch, [GROUP[0], GROUP[2]], hosts=3).delete == ("q-r0-0", "q-r0-w-2")


def test_pods_already_deleted_by_the_operator_found_no_epoch() -> None:
    # the watch still shows the condemned pods alive next to the one recreated pod
    recreated = [GROUP[0], pod("q-r0-w-1", "b2"), GROUP[2]]
    assert check(None, recreated, hosts=3, condemned={"a", "c"}).epoch is None
    fresh = [pod("q-r0-0", "a2"), pod("q-r0-w-1", "b2"), pod("q-r0-w-2", "c2")]
    assert check(None, fresh, hosts=3, condemned={"a", "c"}).epoch is not None
