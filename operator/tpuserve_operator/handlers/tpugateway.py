"""kopf handlers for TPUGateway: one daemon per gateway runs its reconciler's passes.

The servers' handlers (`handlers.tpumodelserver`) make the Kubernetes client and the
reconciler at startup; a gateway's daemon uses the same client and the operator's render
settings (router image, resources, policy, NetworkPolicy mode).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf

from tpuserve_operator import labels
from tpuserve_operator.gateway_reconciler import PASS_SECONDS, GatewayReconciler
from tpuserve_operator.kube import error_summary

log = logging.getLogger(__name__)


@kopf.daemon(labels.GROUP, labels.VERSION, labels.GATEWAY_PLURAL, cancellation_timeout=2.0)
async def gateway_loop(
    body: kopf.Body, stopped: kopf.DaemonStopped, memo: kopf.Memo, **_: Any
) -> None:
    """Converge the TPUGateway every `PASS_SECONDS` for as long as it exists (kopf's ``body``
    is its live view, so a spec change is seen at the next pass)."""
    reconciler = GatewayReconciler(memo.kube, memo.reconciler.settings.render)
    while not stopped:
        try:
            await reconciler.converge(body)
        except Exception as err:  # a failed pass is logged and retried at the next
            log.warning(
                "TPUGateway %s/%s: pass failed: %s",
                body.get("metadata", {}).get("namespace"),
                body.get("metadata", {}).get("name"),
                error_summary(err),
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopped.wait(), PASS_SECONDS)
