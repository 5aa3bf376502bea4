"""A TPUModelServer's status: built (`build_status`, the one builder of it) and written, with
an Event for each condition that changed.

The status is patched only when it differs from the one last written (or, after a restart,
from the object's); `ServerGone` says the object no longer exists.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic

from tpuserve_operator import conditions, disaggregation
from tpuserve_operator.api import CompileCacheStatus, RoleStatus, TPUModelServerStatus
from tpuserve_operator.conditions import Condition
from tpuserve_operator.kube import EventSink, KubeApi, NotFoundError
from tpuserve_operator.observed import ServerKey
from tpuserve_operator.render import Rendered
from tpuserve_operator.server_state import ServerState
from tpuserve_operator.status import GroupReport, timestamp

log = logging.getLogger(__name__)


def build_status(
    previous: TPUModelServerStatus,
    decided: Sequence[Condition],
    *,
    now: datetime.datetime,
    generation: int | None,
    observed: bool,
    rendered: Rendered | None = None,
    reports: Mapping[int, GroupReport] | None = None,
    compile_cache: CompileCacheStatus | None = None,
) -> TPUModelServerStatus:
    """The status to write: `previous` with the decided conditions merged in, and

    - `observed`: `generation` was reconciled, so it becomes `observedGeneration` and the
      conditions carry it (False: a new generation is only being acknowledged);
    - `rendered`: what the spec resolves to (endpoint, served name, selector, plan);
    - `reports` (with `rendered`): the replica groups, their counts and the revision;
    - `compile_cache`: the key, hits and misses and the last cold start (`cold_starts`).
    """
    update: dict[str, object] = {
        "conditions": conditions.merge(
            previous.conditions,
            decided,
            now=timestamp(now),
            generation=generation if observed else None,
        )
    }
    if observed:
        update["observed_generation"] = generation
    if rendered is not None:
        update |= {
            "endpoint": rendered.endpoint,
            "served_name": rendered.server.valid.served_name,
            "selector": rendered.selector,
            "plan": (  # a plan made from spec.slo says which generation it was made for
                rendered.plan.model_copy(update={"observed_generation": generation})
                if rendered.plan.operating_point is not None
                else rendered.plan
            ),
        }
    if rendered is not None and reports is not None:
        wanted = set(rendered.group_keys)
        main = [r for r in reports.values() if r.index in wanted]
        update |= {
            "replicas": sum(1 for r in reports.values() if r.exists),
            "ready_replicas": sum(1 for r in reports.values() if r.ready),
            "updated_replicas": sum(1 for r in main if r.updated),
            "revision": rendered.revision,
            "groups": [reports[k].as_status() for k in sorted(reports)],
            "roles": role_statuses(rendered, reports),
        }
    if compile_cache is not None:
        update["compile_cache"] = compile_cache
    return previous.model_copy(update=update)


def role_statuses(rendered: Rendered, reports: Mapping[int, GroupReport]) -> list[RoleStatus]:
    """Each role's groups and counts, for a disaggregated server (else none)."""
    spec = rendered.server.valid.spec
    if spec.disaggregation is None:
        return []
    out = []
    wanted = set(rendered.group_keys)
    for role in disaggregation.ROLES:
        mine = [r for k, r in sorted(reports.items()) if disaggregation.key_role(k) == role]
        out.append(
            RoleStatus(
                role=role,
                desired=disaggregation.role_of(spec, role).replicas,
                replicas=sum(1 for r in mine if r.exists),
                ready_replicas=sum(1 for r in mine if r.ready),
                updated_replicas=sum(1 for r in mine if r.updated and r.index in wanted),
                revision=rendered.role_revisions[role],
                groups=[disaggregation.key_index(r.index) for r in mine],
            )
        )
    return out


class ServerGone(Exception):
    """The TPUModelServer no longer exists (its deletion event may have been missed)."""


def _written(state: ServerState, body: Mapping[str, Any]) -> dict[str, Any]:
    return state.status or dict(body.get("status") or {})


class StatusWriter:
    """Patches one server's status and posts Events for its condition transitions."""

    def __init__(self, kube: KubeApi, emit_event: EventSink) -> None:
        self.kube = kube
        self.emit_event = emit_event

    def previous(self, state: ServerState, body: Mapping[str, Any]) -> TPUModelServerStatus:
        """The status last written, else the object's (none after a restart)."""
        written = _written(state, body)
        try:
            return TPUModelServerStatus.model_validate(written)
        except pydantic.ValidationError as err:
            meta = body.get("metadata") or {}
            where = f"{meta.get('namespace')}/{meta.get('name')}"
            log.warning("%s: ignoring a status the operator cannot read: %s", where, err)
            return TPUModelServerStatus()

    async def write(
        self,
        key: ServerKey,
        state: ServerState,
        body: Mapping[str, Any],
        status: TPUModelServerStatus,
        decided: Sequence[Condition],
    ) -> None:
        previous = self.previous(state, body)
        new = status.model_dump(by_alias=True, exclude_unset=True)
        if new != _written(state, body):
            try:
                await self.kube.patch_status(key[0], key[1], new)
            except NotFoundError:
                raise ServerGone(key) from None
            state.status = new
        for change in conditions.transitions(previous.conditions, decided):
            c = change.condition
            if (
                change.previous_status is None
                and c.status == "False"
                and c.type != conditions.VALID
            ):
                continue  # a new object: only report what is true, and a bad spec
            kind = "Warning" if change.warning else "Normal"
            self.emit_event(body, kind, str(c.reason), f"{c.type}={c.status}: {c.message}")
