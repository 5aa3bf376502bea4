"""A disaggregated server's rollout (`rollout.plan_roles`): each role planned over its own
groups, and never a step without a ready prefill and a ready decode that pair.

The simulation applies each plan as the operator would (applied groups come back on the new
revision, not ready; deleted groups go) and marks the groups applied at one step ready at
the next (or, for a slow role, two steps later: a role's engines may take longer to start
than the other's), checking at every step, before and after the plan is applied, that a
ready prefill and a ready decode share a pairing contract."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tpuserve_operator.rollout import GroupState, Plan, plan_roles

pytestmark = pytest.mark.unit

ROLES = ("prefill", "decode")
OLD, NEW = "contract-1", "contract-2"


def ready(contract: str, *, updated: bool) -> GroupState:
    return GroupState(exists=True, updated=updated, ready=True, contract=contract)


def paired(groups: dict[str, dict[int, GroupState]]) -> bool:
    prefill, decode = (
        {g.contract for g in groups[role].values() if g.exists and g.ready} for role in ROLES
    )
    return bool(prefill & decode)


@dataclass
class Rollout:
    """Both roles' groups as the operator sees them, moved by the plans step by step."""

    replicas: dict[str, int]
    groups: dict[str, dict[int, GroupState]]
    contract: str  # what a group applied now runs
    max_unavailable: int = 1
    max_surge: int = 0
    slow: str | None = None  # the role whose applied groups take two steps to serve
    touched: dict[str, set[int]] = field(default_factory=lambda: {r: set() for r in ROLES})
    peak: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROLES, 0))

    def plans(self) -> dict[str, Plan]:
        return plan_roles(
            self.replicas,
            self.groups,
            max_unavailable=self.max_unavailable,
            max_surge=self.max_surge,
        )

    def run(self, steps: int = 40) -> int:
        """Steps until every role is settled; asserts a pair at every step."""
        starting: dict[tuple[str, int], int] = {}  # (role, group) -> the step it serves
        for step in range(steps):
            for (role, k), serves in list(starting.items()):  # what was applied serves now
                if serves == step and k in self.groups[role]:
                    self.groups[role][k] = ready(self.contract, updated=True)
                    del starting[(role, k)]
            assert paired(self.groups), f"step {step}: no pair before the plan: {self.groups}"
            plans = self.plans()
            if not any((*p.apply, *p.delete) for p in plans.values()) and self.settled():
                return step
            for role, p in plans.items():
                for k in p.apply:
                    starting[(role, k)] = step + (2 if role == self.slow else 1)
                self.touched[role] |= {*p.apply, *p.delete}
                for k in p.apply:
                    self.groups[role][k] = GroupState(
                        exists=True, updated=True, ready=False, contract=self.contract
                    )
                for k in p.delete:
                    del self.groups[role][k]
                self.peak[role] = max(self.peak[role], len(self.groups[role]))
            assert paired(self.groups), f"step {step}: no pair after {plans}: {self.groups}"
        raise AssertionError(f"not settled after {steps} steps: {self.groups}")

    def settled(self) -> bool:
        return all(
            sorted(self.groups[role]) == list(range(self.replicas[role]))
            and all(g.ready and g.updated for g in self.groups[role].values())
            for role in ROLES
        )


def serving(p: int, d: int, *, prefill_updated: bool, decode_updated: bool) -> Rollout:
    return Rollout(
        replicas={"prefill": p, "decode": d},
        groups={
            "prefill": {k: ready(OLD, updated=prefill_updated) for k in range(p)},
            "decode": {k: ready(OLD, updated=decode_updated) for k in range(d)},
        },
        contract=OLD,
    )


@pytest.mark.parametrize("slow", [None, "prefill", "decode"])
@pytest.mark.parametrize("max_surge", [0, 1])
@pytest.mark.parametrize(("p", "d"), [(1, 1), (2, 3)])
def test_a_contract_change_never_leaves_a_step_without_a_ready_pair(
    p: int, d: int, max_surge: int, slow: str | None
) -> None:
    rollout = serving(p, d, prefill_updated=False, decode_updated=False)
    rollout.contract = NEW  # the image changed: every group rolls onto the new contract
    rollout.max_surge = max_surge
    rollout.slow = slow
    rollout.run()
    assert all(g.contract == NEW for role in ROLES for g in rollout.groups[role].values())
    if (p, d) == (1, 1):
        # one group per role: a surge group each, even with maxSurge 0 (the pair surge)
        assert rollout.peak == {"prefill": 2, "decode": 2}
    elif max_surge == 0:
        assert rollout.peak == {"prefill": 2, "decode": 3}  # no extra slice needed


def test_a_contract_change_with_many_down_at_once_keeps_a_pair() -> None:
    rollout = serving(3, 4, prefill_updated=False, decode_updated=False)
    rollout.contract = NEW
    rollout.max_unavailable = 4
    rollout.slow = "decode"
    rollout.run()


@pytest.mark.parametrize("max_surge", [0, 1])
@pytest.mark.parametrize(("p", "d"), [(1, 1), (2, 3)])
def test_a_decode_only_change_rolls_decode_alone_and_keeps_a_pair(
    p: int, d: int, max_surge: int
) -> None:
    rollout = serving(p, d, prefill_updated=True, decode_updated=False)
    rollout.max_surge = max_surge
    rollout.run()
    assert rollout.touched["prefill"] == set()
    assert rollout.touched["decode"] >= set(range(d))


def test_resizing_prefill_leaves_decode_groups_alone() -> None:
    rollout = serving(1, 3, prefill_updated=True, decode_updated=True)
    rollout.replicas["prefill"] = 3
    plans = rollout.plans()
    assert plans["prefill"].apply == (1, 2)
    assert plans["decode"] == Plan(
        apply=(), restart=(), delete=(), rolling=False, scaling_up=False, scaling_down=False
    )
    rollout.run()
    assert rollout.touched["decode"] == set()


def test_the_last_old_decode_waits_for_a_new_pair() -> None:
    """Prefill rolled to the new contract; decode's old group may not go before a new decode
    serves, whatever maxUnavailable says."""
    groups = {
        "prefill": {0: ready(OLD, updated=False), 1: ready(NEW, updated=True)},
        "decode": {0: ready(OLD, updated=False), 1: ready(OLD, updated=False)},
    }
    plans = plan_roles({"prefill": 2, "decode": 2}, groups, max_unavailable=2, max_surge=0)
    assert plans["prefill"].restart == ()  # p0 is the old pair's only prefill
    assert plans["decode"].restart == (0,)  # d1 keeps the old pair


def test_a_role_scaled_to_zero_wants_no_pair() -> None:
    groups = {"prefill": {0: ready(OLD, updated=True)}, "decode": {0: ready(OLD, updated=False)}}
    plans = plan_roles({"prefill": 0, "decode": 1}, groups, max_unavailable=1, max_surge=0)
    assert plans["prefill"].delete == (0,)
    assert plans["decode"].restart == (0,)  # no pair surge: nothing to pair with
