"""A rendered server's rollout plan over its group keys (`rollout.plan`, per role with PD)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tpuserve_operator import disaggregation, rollout
from tpuserve_operator.render import Rendered


def plan_groups(
    rendered: Rendered,
    groups: Mapping[int, rollout.GroupState],
    *,
    max_unavailable: int,
    max_surge: int,
    moving: frozenset[int] = frozenset(),
    urgent: frozenset[int] = frozenset(),
) -> rollout.Plan:
    """The rollout plan over group keys: `rollout.plan` for a plain server; for a
    disaggregated one `rollout.plan_roles` over each role's indices (groups of no current
    role, left from before the server was disaggregated, are deleted)."""
    spec = rendered.server.valid.spec
    if spec.disaggregation is None:
        return rollout.plan(
            spec.replicas,
            groups,
            max_unavailable=max_unavailable,
            max_surge=max_surge,
            moving=moving,
            urgent=urgent,
        )

    def by_role(keys: Iterable[int]) -> dict[str, dict[int, int]]:
        """role -> {index within the role: group key}"""
        out: dict[str, dict[int, int]] = {role: {} for role in disaggregation.ROLES}
        for k in keys:
            role = disaggregation.key_role(k)
            if role is not None:
                out[role][disaggregation.key_index(k)] = k
        return out

    plans = rollout.plan_roles(
        {role: disaggregation.role_of(spec, role).replicas for role in disaggregation.ROLES},
        {role: {i: groups[k] for i, k in ks.items()} for role, ks in by_role(groups).items()},
        max_unavailable=max_unavailable,
        max_surge=max_surge,
        moving={role: frozenset(ks) for role, ks in by_role(moving).items()},
        urgent={role: frozenset(ks) for role, ks in by_role(urgent).items()},
    )
    stray = [k for k, g in groups.items() if g.exists and disaggregation.key_role(k) is None]
    return rollout.merged(
        {disaggregation.ROLE_KEY_BASE[role]: p for role, p in plans.items()}, stray
    )
