"""Rollout planning: groups roll one at a time by default, never leaving zero ready groups
with 2 or more replicas; missing groups are created at once; scale-down deletes the top."""

from __future__ import annotations

import pytest

from tpuserve_operator.rollout import GroupState, Plan, plan

pytestmark = pytest.mark.unit

READY_OLD = GroupState(exists=True, updated=False, ready=True)
READY_NEW = GroupState(exists=True, updated=True, ready=True)
STARTING_NEW = GroupState(exists=True, updated=True, ready=False)
BROKEN_OLD = GroupState(exists=True, updated=False, ready=False)


def test_new_server_creates_every_group_at_once() -> None:
    p = plan(3, {}, max_unavailable=1, max_surge=0)
    assert p.apply == (0, 1, 2)
    assert p.scaling_up
    assert not p.rolling


def test_steady_state_does_nothing() -> None:
    p = plan(2, {0: READY_NEW, 1: READY_NEW}, max_unavailable=1, max_surge=0)
    assert p == Plan(
        apply=(), restart=(), delete=(), rolling=False, scaling_up=False, scaling_down=False
    )


def test_a_spec_change_rolls_one_group_at_a_time() -> None:
    p = plan(3, {0: READY_OLD, 1: READY_OLD, 2: READY_OLD}, max_unavailable=1, max_surge=0)
    assert p.apply == (0,)
    assert p.restart == (0,)
    assert p.rolling


def test_the_next_group_waits_for_the_updated_one_to_be_ready() -> None:
    groups = {0: STARTING_NEW, 1: READY_OLD, 2: READY_OLD}
    assert plan(3, groups, max_unavailable=1, max_surge=0).apply == ()
    groups[0] = READY_NEW
    assert plan(3, groups, max_unavailable=1, max_surge=0).apply == (1,)


def test_never_zero_ready_with_two_replicas_even_if_max_unavailable_allows() -> None:
    p = plan(2, {0: READY_OLD, 1: READY_OLD}, max_unavailable=5, max_surge=0)
    assert len(p.apply) == 1


def test_a_lone_ready_group_is_kept_while_the_other_is_down() -> None:
    p = plan(2, {0: READY_OLD, 1: BROKEN_OLD}, max_unavailable=1, max_surge=0)
    assert p.apply == (1,)  # the broken one is free to update, the ready one waits


def test_one_replica_without_surge_must_go_down_to_update() -> None:
    assert plan(1, {0: READY_OLD}, max_unavailable=1, max_surge=0).apply == (0,)


def test_max_unavailable_two_updates_two_at_once() -> None:
    groups = {k: READY_OLD for k in range(4)}
    assert plan(4, groups, max_unavailable=2, max_surge=0).apply == (0, 1)


def test_surge_creates_an_extra_group_and_keeps_the_old_ones_until_it_is_ready() -> None:
    groups = {0: READY_OLD, 1: READY_OLD}
    p = plan(2, groups, max_unavailable=0, max_surge=1)
    assert p.apply == (2,)
    groups[2] = STARTING_NEW
    assert plan(2, groups, max_unavailable=0, max_surge=1).apply == ()
    groups[2] = READY_NEW
    assert plan(2, groups, max_unavailable=0, max_surge=1).apply == (0,)


def test_surge_groups_are_deleted_when_the_rollout_ends() -> None:
    groups = {0: READY_NEW, 1: READY_NEW, 2: READY_NEW}
    p = plan(2, groups, max_unavailable=0, max_surge=1)
    assert p.delete == (2,)
    assert not p.rolling


def test_scale_down_deletes_the_highest_groups() -> None:
    groups = {k: READY_NEW for k in range(4)}
    p = plan(2, groups, max_unavailable=1, max_surge=0)
    assert p.delete == (2, 3)
    assert p.scaling_down


def test_scale_to_zero_deletes_everything() -> None:
    assert plan(0, {0: READY_NEW}, max_unavailable=1, max_surge=0).delete == (0,)


@pytest.mark.parametrize("replicas", [2, 3, 5])
@pytest.mark.parametrize(("max_unavailable", "max_surge"), [(1, 0), (2, 0), (9, 0), (0, 1), (1, 2)])
def test_a_whole_rollout_converges_and_never_leaves_zero_ready(
    replicas: int, max_unavailable: int, max_surge: int
) -> None:
    """Simulate: applied groups go down for one step, then come back ready and updated."""
    groups = {k: READY_OLD for k in range(replicas)}
    for _ in range(4 * (replicas + max_surge) + 4):
        p = plan(replicas, groups, max_unavailable=max_unavailable, max_surge=max_surge)
        for k in p.delete:
            del groups[k]
        # groups applied last step finish starting
        groups = {k: (READY_NEW if g == STARTING_NEW else g) for k, g in groups.items()}
        for k in p.apply:
            groups[k] = STARTING_NEW
        ready = sum(1 for g in groups.values() if g.ready)
        assert ready >= 1
        down = sum(1 for k in range(replicas) if not groups[k].ready)
        assert down <= max_unavailable + max_surge
        assert down <= replicas - 1
        if all(groups.get(k) == READY_NEW for k in range(replicas)) and len(groups) == replicas:
            break
    assert groups == {k: READY_NEW for k in range(replicas)}


def test_surge_groups_stay_until_the_last_updated_group_is_ready_again() -> None:
    groups = {0: READY_NEW, 1: STARTING_NEW, 2: READY_NEW}
    p = plan(2, groups, max_unavailable=0, max_surge=1)
    assert p.delete == ()
    assert not p.rolling
    groups[1] = READY_NEW
    assert plan(2, groups, max_unavailable=0, max_surge=1).delete == (2,)


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_with_surge_and_no_unavailability_the_ready_count_never_drops(replicas: int) -> None:
    groups = {k: READY_OLD for k in range(replicas)}
    for _ in range(6 * replicas + 6):
        p = plan(replicas, groups, max_unavailable=0, max_surge=1)
        for k in p.delete:
            del groups[k]
        groups = {k: (READY_NEW if g == STARTING_NEW else g) for k, g in groups.items()}
        for k in p.apply:
            groups[k] = STARTING_NEW
        assert sum(1 for g in groups.values() if g.ready) >= replicas
        if groups == {k: READY_NEW for k in range(replicas)}:
            break
    assert groups == {k: READY_NEW for k in range(replicas)}


def test_a_group_moving_off_a_maintenance_node_waits_for_a_ready_surge_group() -> None:
    groups = {0: READY_NEW, 1: READY_NEW}
    p = plan(2, groups, max_unavailable=1, max_surge=1, moving=frozenset({0}))
    assert p.apply == (2,)  # the replacement slice first
    assert p.restart == ()
    assert p.rolling
    groups[2] = STARTING_NEW
    assert plan(2, groups, max_unavailable=1, max_surge=1, moving=frozenset({0})).restart == ()
    groups[2] = READY_NEW
    p = plan(2, groups, max_unavailable=1, max_surge=1, moving=frozenset({0}))
    assert p.restart == (0,)  # now the moving group drains
    assert p.delete == ()


def test_without_surge_a_moving_group_goes_within_max_unavailable() -> None:
    groups = {0: READY_NEW, 1: READY_NEW}
    p = plan(2, groups, max_unavailable=1, max_surge=0, moving=frozenset({1}))
    assert p.restart == (1,)
    assert plan(2, groups, max_unavailable=0, max_surge=0, moving=frozenset({1})).restart == ()


def test_a_group_on_a_terminating_node_is_replaced_at_once() -> None:
    groups = {0: READY_NEW, 1: READY_NEW}
    p = plan(2, groups, max_unavailable=0, max_surge=1, urgent=frozenset({0}))
    assert p.restart == (0,)
    assert p.apply == (0, 2)


def test_a_ready_urgent_group_uses_the_budget_so_a_move_waits() -> None:
    groups = {0: READY_NEW, 1: READY_NEW}
    p = plan(
        2,
        groups,
        max_unavailable=1,
        max_surge=0,
        urgent=frozenset({0}),
        moving=frozenset({1}),
    )
    assert p.restart == (0,)


def test_a_ready_urgent_group_uses_the_budget_so_an_update_waits() -> None:
    groups = {0: READY_OLD, 1: READY_OLD, 2: READY_OLD}
    p = plan(3, groups, max_unavailable=1, max_surge=0, urgent=frozenset({0}))
    assert p.restart == (0,)
