"""The TPUModelServerRole objects of a disaggregated server's autoscaled roles.

Each autoscaled role has a TPUModelServerRole whose scale subresource its HPA sets; the
operator creates it with the count the role was rendered at, reads its `spec.replicas` back as
the role's count, and writes its status (the role's groups and its leaders' selector) for the
HPA.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from tpuserve_operator import disaggregation, labels
from tpuserve_operator.api import RoleStatus
from tpuserve_operator.kube import KubeApi, NotFoundError
from tpuserve_operator.observed import ChildView, ObservedCache, ServerKey
from tpuserve_operator.render import Rendered
from tpuserve_operator.render.roles import role_scale_name, role_selector, with_replicas


class RoleScales:
    """Create, read and report the TPUModelServerRoles of autoscaled roles."""

    def __init__(self, kube: KubeApi, cache: ObservedCache) -> None:
        self.kube = kube
        self.cache = cache

    def observed_role_replicas(self, key: ServerKey) -> tuple[tuple[str, int | None], ...]:
        """Each role's count as its TPUModelServerRole says (None: none seen, or unset)."""
        children = self.cache.children(key)
        out = []
        for role in disaggregation.ROLES:
            child = children.get((labels.ROLE_KIND, role_scale_name(key[1], role)))
            out.append((role, None if child is None or child.deleting else child.desired))
        return tuple(out)

    async def seed_role_scales(
        self, key: ServerKey, rendered: Rendered, children: Mapping[tuple[str, str], ChildView]
    ) -> None:
        """Create each autoscaled role's TPUModelServerRole with the count it was rendered at
        (the apply that follows leaves spec.replicas to its HPA); give one that lost its
        spec.replicas that count back."""
        spec = rendered.server.valid.spec
        for manifest in rendered.shared:
            if manifest["kind"] != labels.ROLE_KIND:
                continue
            count = disaggregation.role_of(spec, manifest["spec"]["role"]).replicas
            child = children.get((labels.ROLE_KIND, manifest["metadata"]["name"]))
            if child is None:
                await self.kube.create(with_replicas(manifest, count))
            elif child.desired is None and not child.deleting:
                await self.kube.patch_role(key[0], child.name, {"spec": {"replicas": count}})

    async def write_role_scales(self, key: ServerKey, roles: list[RoleStatus]) -> None:
        """Each TPUModelServerRole's status: the role's groups and its leaders' selector."""
        children = self.cache.children(key)
        for role in roles:
            child = children.get((labels.ROLE_KIND, role_scale_name(key[1], role.role)))
            if child is None or child.deleting:
                continue
            selector = labels.selector_string(role_selector(key[1], role.role))
            if child.scale_status == (role.replicas, selector):
                continue
            status = {"replicas": role.replicas, "selector": selector}
            with contextlib.suppress(NotFoundError):  # pruned meanwhile
                await self.kube.patch_role(key[0], child.name, {"status": status}, status=True)
