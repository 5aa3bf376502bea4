"""A server's InferencePool in the cluster: whether the operator may manage it, and what the
gateways say of it (``status.inferencePool``). The manifests are `render.inference_pool`'s.

Shared ownership, like a Service: a pool of the server's name that the operator did not
create (no owner reference to this TPUModelServer) is someone else's; it is neither applied
over nor deleted, and the status says so (``managed: false``). The operator's own pool is
watched like every child (its labels), and its ``status.parents`` (one entry per Gateway, with
an ``Accepted`` condition) become ``status.inferencePool.parents``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tpuserve_operator.api import GatewayParentStatus, InferencePoolStatus
from tpuserve_operator.kube import KubeApi
from tpuserve_operator.observed import ChildView
from tpuserve_operator.render import Manifest, Rendered
from tpuserve_operator.render.inference_pool import (
    GROUP_VERSION,
    KIND,
    ParentView,
    parents_of,
    wants_pool,
)


def _owned_by(body: Mapping[str, Any], uid: str | None) -> bool:
    owners = (body.get("metadata") or {}).get("ownerReferences") or []
    return uid is not None and any(o.get("uid") == uid for o in owners)


async def foreign_pool(
    kube: KubeApi,
    rendered: Rendered,
    observed: Mapping[tuple[str, str], ChildView],
    applied: bool,
) -> Mapping[str, Any] | None:
    """The pool of the server's name when it exists and is not the operator's (None: there
    is none, or it is the operator's, or the server wants no pool). ``applied``: the operator
    applied the pool before (then it is its own, and no read is needed)."""
    server = rendered.server
    if not wants_pool(server) or applied:
        return None
    view = observed.get((KIND, server.name))
    if view is not None and view.owner_uid == server.uid:
        return None
    body = await kube.get(GROUP_VERSION, KIND, server.namespace, server.name)
    if body is None or _owned_by(body, server.uid):
        return None
    return body


def without_pool(rendered: Rendered) -> list[Manifest]:
    """The shared children but the pool (when the pool of that name is someone else's)."""
    return [m for m in rendered.shared if m["kind"] != KIND]


def pool_status(
    rendered: Rendered,
    observed: Mapping[tuple[str, str], ChildView],
    foreign: Mapping[str, Any] | None,
) -> InferencePoolStatus | None:
    """``status.inferencePool``: None when the server wants no pool."""
    server = rendered.server
    if not wants_pool(server):
        return None
    parents: Sequence[ParentView]
    if foreign is not None:
        parents = parents_of(foreign)
    else:
        view = observed.get((KIND, server.name))
        parents = view.parents if view is not None else ()
    return InferencePoolStatus(
        name=server.name,
        managed=foreign is None,
        accepted=any(accepted for _, accepted, _, _ in parents),
        parents=[
            GatewayParentStatus(gateway=g, accepted=a, reason=r, message=m)
            for g, a, r, m in parents
        ],
    )
