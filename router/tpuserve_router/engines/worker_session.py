"""The router's aiohttp client for its workers' JSON endpoints: the look-ups at admission
(``/v1/models``, ``/get_server_info``), aborts, cache flushes and PD's bootstrap questions.

Callers build a URL from a worker's name and a path (``worker.name + "/v1/models"``). For an
``http://`` worker that is an ordinary URL, sent through one shared session. A ``unix:``
worker's name is ``unix:/PATH`` (`tpuserve_router.engines.workers.normalize_worker_url`), which
aiohttp cannot dial: `WorkerSession` finds the registered socket the URL begins with and sends
the rest of it (``/v1/models``) as ``http://localhost/...`` through a session bound to that
socket (aiohttp's `UnixConnector`), one per socket, made when first needed (``unix:`` workers
come from the router's command line alone, so there are few) and closed with the router. A
``unix:`` URL of no registered worker fails with `aiohttp.InvalidUrlClientError` (an
`aiohttp.ClientError`, which callers already handle), so nothing here dials a socket the
registry did not name.

The request-path proxy does not come here: it speaks raw HTTP over its own pooled
connections (`tpuserve_router.engines.proxy.UpstreamPool`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp

from tpuserve_router.engines.workers import UNIX_PREFIX

UNIX_BASE = "http://localhost"
"""What a unix socket's requests are addressed to (their ``host`` header)."""


class WorkerSession:
    """aiohttp's ``get``/``post``/``request`` for worker URLs, ``http://`` or ``unix:``.

    ``names``: the registered workers' names, asked at each ``unix:`` request (a socket is
    dialled only while its worker is registered)."""

    def __init__(
        self,
        timeout_seconds: float,
        names: Callable[[], Iterable[str]],
    ) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._names = names
        self.tcp = aiohttp.ClientSession(
            timeout=self._timeout, connector=aiohttp.TCPConnector(limit=0, force_close=True)
        )
        self._unix: dict[str, aiohttp.ClientSession] = {}  # by worker name

    def get(self, url: str, **kwargs: Any) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
        return self.request("POST", url, **kwargs)

    def request(
        self, method: str, url: str, **kwargs: Any
    ) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
        if not url.startswith(UNIX_PREFIX):
            return self.tcp.request(method, url, **kwargs)
        name, rest = self._split(url)
        session = self._unix.get(name)
        if session is None:
            connector = aiohttp.UnixConnector(
                path=name.removeprefix(UNIX_PREFIX), limit=0, force_close=True
            )
            session = self._unix[name] = aiohttp.ClientSession(
                timeout=self._timeout, connector=connector
            )
        return session.request(method, UNIX_BASE + rest, **kwargs)

    def _split(self, url: str) -> tuple[str, str]:
        """(the registered ``unix:`` worker ``url`` begins with, the path after it)."""
        best = ""
        for name in self._names():
            if (
                name.startswith(UNIX_PREFIX)
                and len(name) > len(best)
                and url.startswith(name)
                and url[len(name) : len(name) + 1] in ("", "/", "?")
            ):
                best = name
        if not best:
            raise aiohttp.InvalidUrlClientError(url, "no registered unix: worker serves it")
        return best, url[len(best) :] or "/"

    async def close(self) -> None:
        await self.tcp.close()
        for session in self._unix.values():
            await session.close()
        self._unix.clear()
