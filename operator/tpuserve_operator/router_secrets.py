"""The two Secrets a server's routers need, created once with random values.

The router replicas' peering secret, and the gateway's token for the router's picker
(`pickerAuth: Token` without `tokenSecretRef`). The operator never reads either back (its
RBAC may create Secrets, not read them); an existing one is kept.
"""

from __future__ import annotations

import secrets

from tpuserve_operator.kube import KubeApi
from tpuserve_operator.render import Rendered
from tpuserve_operator.render.inference_pool import picker_secret, wants_picker_secret
from tpuserve_operator.render.router import router_peering_secret
from tpuserve_operator.server_state import ServerState


class RouterSecrets:
    """Create a server's router Secrets the first time they are wanted."""

    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube

    async def ensure_peering_secret(self, state: ServerState, rendered: Rendered) -> None:
        """Create the router replicas' peering secret once (a random value the operator
        never reads back: its RBAC may create Secrets, not read them). Checked again after an
        operator restart; an existing one is kept."""
        server = rendered.server
        if state.peering_secret or not server.valid.spec.router.enabled:
            return
        await self.kube.create(router_peering_secret(server, secrets.token_urlsafe(32)))
        state.peering_secret = True

    async def ensure_picker_secret(self, state: ServerState, rendered: Rendered) -> None:
        """Create the gateway's token for the router's picker once (``pickerAuth: Token``
        without ``tokenSecretRef``): a random value the operator never reads back; the
        routers mount it, the gateway's configuration reads it. An existing one is kept."""
        server = rendered.server
        if state.picker_secret or not wants_picker_secret(server):
            return
        await self.kube.create(picker_secret(server, secrets.token_urlsafe(32)))
        state.picker_secret = True
