"""Which replica groups to create, update, restart or delete now. A pure function.

A replica group is a whole TPU slice; updating one restarts every host of it together, so
a group is unavailable from the moment it is touched until its leader serves again. The
plan follows Deployment-style `maxUnavailable` / `maxSurge`, counted in groups:

- a missing group (k < replicas) is always created: it is unavailable anyway;
- a stale group (not on the current revision) that is not ready is always updated, since
  updating it costs no availability;
- a ready stale group is updated only while fewer than `maxUnavailable` (+ ready surge
  groups) are down, so by default one group rolls at a time; with 2 or more replicas at
  least one group always stays ready, whatever `maxUnavailable` says;
- while a rollout is in progress, up to `maxSurge` extra groups (indices replicas ..
  replicas+maxSurge-1) run at the new revision; they are deleted (drained like any group)
  only once every main group is updated *and ready again*, so with `maxSurge` the routable
  count never drops below `replicas`; groups at index >= replicas beyond them go at once
  (scale-down);
- a group on a node GKE is about to take away (`node_signals`) counts as stale although
  its revision is current, and is replaced the same way; its pods come back elsewhere. For
  scheduled maintenance with `maxSurge`, a surge group must be ready first; on a node being
  terminated now the group is replaced at once, and if it was still ready it uses the
  unavailability budget first, so a voluntary move or update waits for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GroupState:
    """One replica group as observed."""

    exists: bool  # its workload exists and is not being deleted
    updated: bool  # workload and every pod on the current revision
    ready: bool  # every host up and the leader serving
    contract: str = ""  # a disaggregated server's pairing contract ("": pairs with any)


@dataclass(frozen=True, slots=True)
class Plan:
    apply: tuple[int, ...]  # create, or update to the current revision
    restart: tuple[int, ...]  # groups whose stale pods must be replaced (StatefulSet path)
    delete: tuple[int, ...]
    rolling: bool
    scaling_up: bool
    scaling_down: bool


def plan(
    replicas: int,
    groups: Mapping[int, GroupState],
    *,
    max_unavailable: int,
    max_surge: int,
    moving: frozenset[int] = frozenset(),
    urgent: frozenset[int] = frozenset(),
) -> Plan:
    """`moving`: groups to take off a node with upcoming maintenance; with `max_surge` they
    wait for a ready surge group, whatever `max_unavailable` says. `urgent`: groups on a node
    being terminated now; they are replaced at once (they are going anyway)."""
    existing = {k for k, g in groups.items() if g.exists}
    displaced = moving | urgent
    stale = [
        k for k in range(replicas) if k in existing and (not groups[k].updated or k in displaced)
    ]
    rolling = bool(stale)
    settling = rolling or any(not groups[k].ready for k in range(replicas) if k in existing)
    surge = set(range(replicas, replicas + max_surge)) if settling else set()
    missing = [k for k in range(replicas) if k not in existing]

    ready_main = sum(1 for k in range(replicas) if k in existing and groups[k].ready)
    ready_surge = sum(1 for k in surge if k in existing and groups[k].ready and groups[k].updated)
    down = replicas - ready_main
    budget = max_unavailable + ready_surge - down
    if replicas >= 2:
        budget = min(budget, ready_main + ready_surge - 1)
    spare = ready_surge - down  # ready groups above replicas: what a surge-first move needs

    update = [k for k in stale if not groups[k].ready or k in urgent]
    # An urgent group goes anyway, but a ready one still takes a group of availability:
    # it uses the budget (and a ready surge group) first, so voluntary moves wait.
    urgent_ready = sum(1 for k in update if k in urgent and groups[k].ready)
    budget -= urgent_ready
    spare -= urgent_ready
    for k in stale:
        if k in update or budget <= 0:
            continue
        if k in moving and max_surge > 0:
            if spare <= 0:
                continue
            spare -= 1
        update.append(k)
        budget -= 1

    surge_apply = [
        k
        for k in sorted(surge)
        if (rolling and k not in existing) or (k in existing and not groups[k].updated)
    ]
    delete = sorted(k for k in existing if k >= replicas and k not in surge)
    return Plan(
        apply=tuple(sorted({*missing, *update, *surge_apply})),
        restart=tuple(sorted(update)),
        delete=tuple(delete),
        rolling=rolling,
        scaling_up=bool(missing),
        scaling_down=bool(delete),
    )


def plan_roles(
    replicas: Mapping[str, int],
    groups: Mapping[str, Mapping[int, GroupState]],
    *,
    max_unavailable: int,
    max_surge: int,
    moving: Mapping[str, frozenset[int]] | None = None,
    urgent: Mapping[str, frozenset[int]] | None = None,
) -> dict[str, Plan]:
    """One plan per role of a disaggregated server (`replicas`: the two roles', prefill then
    decode; `groups`: each role's groups by their index within the role): `plan` per role,
    with the pair surge, then the pair rule (see the module's docstring)."""
    pair = len(replicas) == 2 and all(count > 0 for count in replicas.values())
    plans = {
        role: plan(
            count,
            groups.get(role, {}),
            max_unavailable=max_unavailable,
            max_surge=1 if pair and count == 1 and max_surge == 0 else max_surge,
            moving=(moving or {}).get(role, frozenset()),
            urgent=(urgent or {}).get(role, frozenset()),
        )
        for role, count in replicas.items()
    }
    if not pair:
        return plans
    return _keeping_a_pair(plans, groups, urgent or {})


def _paired(ready: Mapping[str, Mapping[int, str]]) -> bool:
    """Whether a ready group of each role share a contract ("" pairs with any)."""
    first, second = (set(contracts.values()) for contracts in ready.values())
    if not first or not second:
        return False
    return bool(first & second) or "" in first or "" in second


def _keeping_a_pair(
    plans: Mapping[str, Plan],
    groups: Mapping[str, Mapping[int, GroupState]],
    urgent: Mapping[str, frozenset[int]],
) -> dict[str, Plan]:
    """`plans` less the ready groups whose going down would leave no ready pair."""
    ready = {
        role: {k: g.contract for k, g in groups.get(role, {}).items() if g.exists and g.ready}
        for role in plans
    }
    if not _paired(ready):
        return dict(plans)  # no pair to keep
    for role in plans:
        for k in urgent.get(role, frozenset()) & set(plans[role].restart):
            ready[role].pop(k, None)  # going anyway
    held: dict[str, set[int]] = {role: set() for role in plans}
    for role, p in plans.items():
        for k in sorted({*p.restart, *p.delete}):
            if k not in ready[role]:
                continue
            contract = ready[role].pop(k)
            if not _paired(ready):
                ready[role][k] = contract
                held[role].add(k)
    return {
        role: dataclasses.replace(
            p,
            apply=tuple(k for k in p.apply if k not in held[role]),
            restart=tuple(k for k in p.restart if k not in held[role]),
            delete=tuple(k for k in p.delete if k not in held[role]),
        )
        for role, p in plans.items()
    }


def merged(parts: Mapping[int, Plan], delete: Iterable[int] = ()) -> Plan:
    """One plan from plans over disjoint index spaces: `parts` maps where each space starts
    (added to its indices) to its plan; `delete`: further indices to delete."""
    extra = set(delete)

    def shifted(field: str) -> tuple[int, ...]:
        return tuple(sorted(base + k for base, p in parts.items() for k in getattr(p, field)))

    return Plan(
        apply=shifted("apply"),
        restart=shifted("restart"),
        delete=tuple(sorted({*shifted("delete"), *extra})),
        rolling=any(p.rolling for p in parts.values()),
        scaling_up=any(p.scaling_up for p in parts.values()),
        scaling_down=bool(extra) or any(p.scaling_down for p in parts.values()),
    )
