"""Converge one TPUGateway: select its servers, apply its router, prune, report.

A pass (every `PASS_SECONDS`, and at once on a change of the TPUGateway):

1. list the TPUModelServers of the namespace and keep those the serverSelector selects
   (`render.gateway.gateway_models`): each is one model, with its demand Lease when it has
   ``autoscaling.minReplicas: 0``;
2. create the replicas' peering Secret once (random, never read back), then apply what
   `render.gateway.gateway_children` renders (server-side apply, only what changed since the
   last pass, and everything every `RESYNC_SECONDS`, which restores what was deleted);
3. delete the InferencePools of models no longer selected (by the gateway's label);
4. write ``status`` (endpoint, models, a message).

A server added to or removed from the selection changes the router's flags (its models and
Leases), so the gateway's pods roll (maxUnavailable 0: the old pods serve until the new ones
are Ready). The servers' own reconciler asks `fronted_by_gateway` whether a server without a
router of its own that scales to zero is fronted (validation: someone must hold its requests
and renew its Lease).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

from tpuserve_operator import labels
from tpuserve_operator.gateway_api import TPUGatewaySpec
from tpuserve_operator.kube import Kube, KubeApi, error_summary
from tpuserve_operator.render.context import ROUTER_PORT, RenderConfig, stable_hash
from tpuserve_operator.render.gateway import (
    Gateway,
    gateway_children,
    gateway_models,
    peering_secret,
    selects,
)
from tpuserve_operator.render.inference_pool import GROUP_VERSION as POOL_API
from tpuserve_operator.render.inference_pool import KIND as POOL_KIND

log = logging.getLogger(__name__)

PASS_SECONDS = 5.0
RESYNC_SECONDS = 60.0
"""Every this often a pass applies every object, changed or not (one deleted by hand comes
back; in between a pass applies only what its rendering changed)."""


async def fronted_by_gateway(
    kube: KubeApi, namespace: str, server_labels: Mapping[str, str]
) -> bool:
    """Whether a TPUGateway of ``namespace`` selects a server with these labels."""
    gateways = await kube.list(labels.API_VERSION, labels.GATEWAY_KIND, namespace, "")
    for body in gateways or []:
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            continue
        selector = ((body.get("spec") or {}).get("serverSelector") or {}).get("matchLabels") or {}
        if selects(selector, server_labels):
            return True
    return False


class GatewayReconciler:
    """One per TPUGateway daemon: what it applied last, so a pass applies only changes."""

    def __init__(
        self, kube: Kube, config: RenderConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.kube = kube
        self.config = config
        self.clock = clock
        self.applied: dict[tuple[str, str], str] = {}  # (kind, name) -> hash
        self.applied_all_at: float | None = None
        self.secret_made = False

    async def converge(self, body: Mapping[str, Any]) -> None:
        now = self.clock()
        if self.applied_all_at is None or now - self.applied_all_at >= RESYNC_SECONDS:
            self.applied.clear()  # apply everything again: restores what was deleted or edited
            self.applied_all_at = now
        meta = body.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        try:
            spec = TPUGatewaySpec.model_validate(dict(body.get("spec") or {}), strict=False)
        except ValueError as err:
            await self._status(namespace, name, {"message": f"invalid spec: {err}"})
            return
        servers = await self.kube.list(labels.API_VERSION, labels.KIND, namespace, "") or []
        models, duplicates = gateway_models(spec.server_selector.match_labels, servers)
        pools = await self.kube.has_group_version(POOL_API)
        gateway = Gateway(name, namespace, spec, self.config, models, uid=meta.get("uid"))
        if not self.secret_made:
            await self.kube.create(peering_secret(gateway, secrets.token_hex(32)))
            self.secret_made = True
        rendered = [m for m in gateway_children(gateway) if pools or m["kind"] != POOL_KIND]
        for manifest in rendered:
            key = (manifest["kind"], manifest["metadata"]["name"])
            digest = stable_hash(manifest)
            if self.applied.get(key) != digest:
                await self.kube.apply(manifest)
                self.applied[key] = digest
        if pools:
            await self._prune_pools(gateway, {m["metadata"]["name"] for m in rendered})
        message = f"{len(models)} models"
        if duplicates:
            message += (
                f"; servers {', '.join(duplicates)} serve a model another selected server "
                "serves already: not fronted"
            )
        if spec.inference_pool is not None and not pools:
            message += "; no InferencePool CRD in the cluster: no pools"
        await self._status(
            namespace,
            name,
            {
                "observedGeneration": meta.get("generation"),
                "endpoint": f"http://{gateway.router_name}.{namespace}.svc:{ROUTER_PORT}",
                "models": [
                    {"server": m.server, "model": m.model, "scalesToZero": m.lease is not None}
                    for m in models
                ],
                "message": message,
            },
        )

    async def _prune_pools(self, gateway: Gateway, keep: set[str]) -> None:
        selector = labels.selector_string({labels.GATEWAY: gateway.name})
        found = await self.kube.list(POOL_API, POOL_KIND, gateway.namespace, selector) or []
        for pool in found:
            pool_name = str((pool.get("metadata") or {}).get("name"))
            if pool_name not in keep:
                await self.kube.delete(POOL_API, POOL_KIND, gateway.namespace, pool_name)
                self.applied.pop((POOL_KIND, pool_name), None)

    async def _status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        try:
            await self.kube.patch_gateway_status(namespace, name, status)
        except Exception as err:  # the next pass writes it again
            log.warning(
                "TPUGateway %s/%s: status not written: %s", namespace, name, error_summary(err)
            )
