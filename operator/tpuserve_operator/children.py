"""A server's children: server-side apply of what a pass wants, deletion of what it does not.

A pass wants the shared children (Services, router, budget, autoscaler, monitors) and the
replica groups the rollout plan allows; groups already on the current revision are re-applied
when they drifted (edited or partly deleted), stale groups are left for the plan to roll. Only
children `drift.needs_apply` picks are sent. Children the server no longer wants (scale-down,
surge groups after a rollout, the router when disabled) are deleted, by uid.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tpuserve_operator import rollout
from tpuserve_operator.drift import needs_apply, record_of, stamp
from tpuserve_operator.kube import KubeApi, error_summary
from tpuserve_operator.metrics import OperatorMetrics
from tpuserve_operator.observed import ChildView, ObservedCache, ServerKey
from tpuserve_operator.render import Manifest, Rendered
from tpuserve_operator.server_state import ServerState
from tpuserve_operator.status import GroupReport

log = logging.getLogger(__name__)

ChildRef = tuple[str, str]  # (kind, name)


def ref_of(manifest: Manifest) -> ChildRef:
    return (str(manifest["kind"]), str(manifest["metadata"]["name"]))


def wanted_refs(rendered: Rendered, groups: Iterable[int]) -> set[ChildRef]:
    """The shared children and those of `groups`."""
    refs = {ref_of(m) for m in rendered.shared}
    for k in groups:
        refs |= {ref_of(m) for m in rendered.group(k)}
    return refs


# Kinds that others name, applied first; a RoleBinding next (the apiserver resolves its Role
# when the binder holds no `bind` verb, so a RoleBinding sent with its Role fails NotFound);
# then everything else (workloads, Services, monitors), whose pods use the two above.
FIRST_KINDS = frozenset({"ServiceAccount", "Role", "ConfigMap", "Secret", "Lease"})
SECOND_KINDS = frozenset({"RoleBinding"})


def apply_stages(
    todo: Sequence[tuple[dict[str, Any], str]],
) -> list[list[tuple[dict[str, Any], str]]]:
    """`todo` in the order it can be applied: each stage's applies run at once."""
    stages: list[list[tuple[dict[str, Any], str]]] = [[], [], []]
    for item in todo:
        kind = str(item[0]["kind"])
        stages[0 if kind in FIRST_KINDS else 1 if kind in SECOND_KINDS else 2].append(item)
    return [stage for stage in stages if stage]


class Children:
    """Applies and deletes one server's children, remembering each apply in its state."""

    def __init__(self, kube: KubeApi, cache: ObservedCache, metrics: OperatorMetrics) -> None:
        self.kube = kube
        self.cache = cache
        self.metrics = metrics

    async def apply(
        self,
        key: ServerKey,
        state: ServerState,
        rendered: Rendered,
        plan: rollout.Plan,
        reports: Mapping[int, GroupReport],
        observed: Mapping[ChildRef, ChildView],
    ) -> str | None:
        """Apply what changed; returns a sentence naming the first refused child, or None."""
        wanted: list[Manifest] = list(rendered.shared)
        for k in plan.apply:
            wanted += rendered.group(k)
        # Groups already on this revision are re-applied when drifted (edited, deleted
        # parts); stale groups are left alone until the plan lets them roll.
        for k, report in reports.items():
            if k not in plan.apply and k not in plan.delete and report.updated:
                wanted += rendered.group(k)
        todo: list[tuple[dict[str, Any], str]] = []
        for manifest in wanted:
            stamped, digest = stamp(manifest)
            ref = ref_of(manifest)
            if needs_apply(digest, observed.get(ref), state.applied.get(ref)):
                todo.append((stamped, digest))
        for stage in apply_stages(todo):
            results = await asyncio.gather(
                *(self._apply_one(key, state, m, d) for m, d in stage), return_exceptions=True
            )
            for (manifest, _), result in zip(stage, results, strict=True):
                if isinstance(result, BaseException):
                    if not isinstance(result, Exception):
                        raise result
                    kind, name = ref_of(manifest)
                    return f"{kind} {name}: {error_summary(result)}"
        return None

    async def _apply_one(
        self, key: ServerKey, state: ServerState, manifest: dict[str, Any], digest: str
    ) -> None:
        applied = await self.kube.apply(manifest)
        kind, name = ref_of(manifest)
        state.applied[(kind, name)] = record_of(applied, digest)
        self.metrics.applies.labels(kind).inc()
        log.debug("applied %s %s/%s", kind, key[0], name)

    async def prune(
        self,
        key: ServerKey,
        state: ServerState,
        rendered: Rendered,
        plan: rollout.Plan,
        observed: Mapping[ChildRef, ChildView],
    ) -> None:
        """Delete this server's children it no longer wants (by uid: only that incarnation)."""
        existing_groups = {c.replica for c in observed.values() if c.replica is not None}
        keep = (set(rendered.group_keys) | existing_groups) - set(plan.delete)
        wanted = wanted_refs(rendered, keep)
        doomed = [
            c
            for c in observed.values()
            if c.owner_uid == rendered.server.uid and c.ref not in wanted
        ]
        for child in doomed:
            if not child.deleting:
                log.info("deleting %s %s/%s: no longer wanted", child.kind, key[0], child.name)
        found = await asyncio.gather(
            *(self.kube.delete(c.api_version, c.kind, key[0], c.name, uid=c.uid) for c in doomed)
        )
        for child, existed in zip(doomed, found, strict=True):
            state.applied.pop(child.ref, None)
            if not existed:  # gone already; its deletion event was missed
                self.cache.drop_child(key, child.kind, child.name)
