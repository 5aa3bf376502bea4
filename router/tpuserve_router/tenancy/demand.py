"""The demand signal: the router renews a Lease while requests arrive, run or wait.

The operator scales a server from zero when the Lease named by ``--demand-lease`` was
renewed recently, and to zero when it has not been renewed for the server's idle period
(docs/operator.md, "Scale to zero"). So the router renews it (``spec.renewTime``, its own
wall clock, as every Lease holder does) every ``--demand-interval`` seconds while requests
arrive, are in flight or are held, and *at once* when a request is held and the Lease is not
fresh already: that is the activation signal, one API call after the first request at zero.

The router may only ``get`` and ``patch`` that one Lease (its Role names it), so a router
cannot change anything else; the operator creates the Lease and owns its other fields.
A failed write is counted (``tpuserve_router_demand_signals_total{result="failed"}``),
logged, and retried on the next tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import socket
import time
from collections.abc import Callable
from urllib.parse import quote

import aiohttp
import orjson

from tpuserve_router.engines.discovery.kubernetes import ApiServer, ApiTask
from tpuserve_router.metrics import RouterMetrics

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
WRITE_TIMEOUT_SECONDS = 5.0


def renew_time(now: datetime.datetime) -> str:
    """A Lease's MicroTime: RFC 3339 with microseconds, in UTC."""
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def renewal_patch(now: datetime.datetime, holder: str) -> bytes:
    return orjson.dumps({"spec": {"renewTime": renew_time(now), "holderIdentity": holder}})


class DemandLease(ApiTask):
    """Renews one Lease while ``busy()`` (requests in flight or held) or requests arrived."""

    def __init__(
        self,
        api: ApiServer,
        namespace: str,
        name: str,
        interval_seconds: float,
        metrics: RouterMetrics,
        busy: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.url = (
            f"{api.host}/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}"
            f"/leases/{quote(name)}"
        )
        self.interval_seconds = interval_seconds
        self.metrics = metrics
        self.busy = busy
        self.clock = clock
        self.holder = socket.gethostname()
        self.written_at: float | None = None  # monotonic time of the last good write
        self._arrived = False
        self._urgent = asyncio.Event()

    def arrived(self, held: bool) -> None:
        """A request arrived; ``held``: it waits for a worker (renew now unless fresh)."""
        self._arrived = True
        if held and (
            self.written_at is None or self.clock() - self.written_at >= self.interval_seconds
        ):
            self._urgent.set()

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=WRITE_TIMEOUT_SECONDS)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._urgent.wait(), self.interval_seconds)
                self._urgent.clear()
                try:
                    if self._arrived or self.busy():
                        self._arrived = False
                        await self.write(session)
                except Exception:  # a bug must not end the Lease's renewals silently
                    log.exception("demand Lease %s: renewal pass failed", self.url)

    async def write(self, session: aiohttp.ClientSession) -> bool:
        """Renew the Lease; False (counted ``failed``) whatever went wrong, a token that
        cannot be read included."""
        try:
            headers = {**self.api.request_headers(), "Content-Type": MERGE_PATCH}
            body = renewal_patch(datetime.datetime.now(datetime.UTC), self.holder)
            async with session.patch(
                self.url, data=body, headers=headers, ssl=self.api.ssl_context
            ) as response:
                await response.read()
                response.raise_for_status()
        except (aiohttp.ClientError, TimeoutError) as err:
            self.metrics.demand_signals.labels("failed").inc()
            log.warning("could not renew the demand Lease %s: %s", self.url, err)
            return False
        except Exception:
            self.metrics.demand_signals.labels("failed").inc()
            log.exception("could not renew the demand Lease %s", self.url)
            return False
        self.written_at = self.clock()
        self.metrics.demand_signals.labels("ok").inc()
        return True
