"""The router's HTTP routes by method and path and who may use them (`Routes`): dispatch (404, 405
naming the allowed methods), what a request's head settles before its body is read (two
credential headers refused, an API key, the right to the admin API, a body on a route that takes
none) and whose share of the buffer budget a body is charged to. `tpuserve_router.app` fills the
tables with its handlers.

Who may do what is settled at the end of a request's head, before its body is read
(`Routes.head_check`): a route that needs an API key refuses a request without a valid one
(401), the admin API one without the right to it (403), and either refuses two ``Authorization``
(or ``x-api-key``) headers (400). The admin API trusts no client for its address: with ``--admin
loopback`` (the default) it needs an admin key, unless the request came through a listener bound
to a loopback address (``--host 127.0.0.1``, or ``--admin-port``, which serves only the admin
API on ``127.0.0.1``): a proxy in the pod (a service-mesh sidecar) dials from a loopback
address, but it forwards what reached the pod's address, never a loopback listener.

An unknown path gets 404, a known path with another method 405 naming the allowed ones, a method
the router never serves (``CONNECT``, ``PUT``, ...) 405; when such a request has a body, at the
end of its head (`Routes._body_refusal`), the body unread and the connection closed, as for a
``GET`` or ``HEAD`` with a body (400): every body the router reads is on a route that takes one,
and needs a key when the router has keys. Each client's bodies are charged to its share of the
buffer budget (`Routes.client_of`: its key's tenant, else its address).
"""

from __future__ import annotations

from typing import Final

from tpuserve_router.config import RouterConfig
from tpuserve_router.front.admin import ROUTE as ADMIN_ROUTE
from tpuserve_router.front.http_request import BodyNotTaken, Handler, HttpRequest
from tpuserve_router.front.replies import reject
from tpuserve_router.metrics import RouterMetrics
from tpuserve_router.pipeline.refusals import unauthorized
from tpuserve_router.pipeline.request_body import GENERATION_ROUTES, ClientError
from tpuserve_router.tenancy.auth import KeyStore, presented_key

KNOWN_METHODS: Final = (b"GET", b"HEAD", b"POST", b"DELETE")
MODELS_PREFIX: Final = "/v1/models/"
ADMIN_PATHS: Final = frozenset(
    {"/workers", "/flush_cache", "/add_worker", "/remove_worker", "/kv_snapshot"}
)
CREDENTIAL_HEADERS: Final = (b"authorization", b"x-api-key")


class Routes:
    """The HTTP ports' route tables (``get``, ``post``, ``delete``: path to handler, and
    ``model_card`` for ``/v1/models/{id}``), their dispatch, and the checks that settle who
    may use them."""

    def __init__(self, config: RouterConfig, keys: KeyStore | None, metrics: RouterMetrics) -> None:
        self.config = config
        self.keys = keys
        self.metrics = metrics
        self.post: dict[str, Handler] = {}
        self.get: dict[str, Handler] = {}
        self.delete: dict[str, Handler] = {}
        self.model_card: Handler | None = None
        # What `head_check` guards, by path: the route label of its refusals, and whether
        # it is the admin API's (else it needs an API key when the router has keys).
        self._guarded: dict[bytes, tuple[str, bool]] = {
            route.encode(): (route, False) for route in GENERATION_ROUTES
        }
        self._guarded[b"/v1/models"] = ("other", False)
        self._guarded.update({path.encode(): (ADMIN_ROUTE, True) for path in ADMIN_PATHS})
        self._body_routes: frozenset[tuple[bytes, bytes]] = frozenset()

    def seal(self) -> None:
        """The tables are filled: note what takes a request body (every one of them guarded
        above), by method and path."""
        self._body_routes = frozenset(
            {(b"POST", path.encode()) for path in self.post}
            | {(b"DELETE", path.encode()) for path in self.delete}
        )

    async def handle(self, request: HttpRequest) -> None:
        method = request.method
        if method == b"POST":
            handler = self.post.get(request.path)
        elif method == b"GET" or method == b"HEAD":
            handler = self.get.get(request.path)
        elif method == b"DELETE":
            handler = self.delete.get(request.path)
        else:
            handler = None
        if handler is not None:
            await handler(request)
            return
        path = request.path
        if (
            self.model_card is not None
            and (method == b"GET" or method == b"HEAD")
            and path.startswith(MODELS_PREFIX)
        ):
            await self.model_card(request)
            return
        if path in self.post or path in self.get or path in self.delete:
            allowed = [
                m
                for m, t in (("GET", self.get), ("POST", self.post), ("DELETE", self.delete))
                if path in t
            ]
            reject(
                request,
                ClientError(
                    405,
                    f"method {method.decode('latin-1')} is not allowed on {path}; "
                    f"allowed: {', '.join(allowed)}",
                    param="method",
                    headers={"allow": ", ".join(allowed)},
                ),
                self.metrics,
                route="other",
            )
            return
        if method not in KNOWN_METHODS:  # CONNECT included: the router is no forward proxy
            reject(
                request,
                ClientError(
                    405,
                    f"method {method.decode('latin-1')} is not supported; supported: "
                    f"{', '.join(m.decode() for m in KNOWN_METHODS)}",
                    param="method",
                    headers={"allow": ", ".join(m.decode() for m in KNOWN_METHODS)},
                ),
                self.metrics,
                route="other",
            )
            return
        reject(
            request,
            ClientError(404, f"no route {path}", param="path", error_type="not_found_error"),
            self.metrics,
            route="other",
        )

    async def handle_admin(self, request: HttpRequest) -> None:
        """``--admin-port``: the admin API alone, to this host's clients."""
        if request.path in ADMIN_PATHS:
            await self.handle(request)
            return
        reject(
            request,
            ClientError(
                404,
                f"no route {request.path} here: this port serves only the admin API "
                f"({', '.join(sorted(ADMIN_PATHS))})",
                param="path",
                error_type="not_found_error",
            ),
            self.metrics,
            route=ADMIN_ROUTE,
        )

    def head_check(
        self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]], local: bool
    ) -> ClientError | None:
        """What a request's head settles, before its body is read (`server.HeadCheck`): on a
        guarded route, two credential headers are refused (400: a router and a proxy in
        front could each read another one), a keyed route needs a valid API key (401), the
        admin API the right to it (403). A body on a route that takes none is refused
        (`_body_refusal`), so every body the router reads is on a guarded route. Counted as
        the handlers count their refusals."""
        path = url.partition(b"?")[0]
        if (method, path) not in self._body_routes and _declares_body(headers):
            return self._body_refusal(method, path)
        guarded = self._guarded.get(path)
        if guarded is None:
            if not path.startswith(b"/v1/models/"):
                return None
            guarded = ("other", False)
        route, is_admin = guarded
        found: dict[bytes, bytes] | None = None  # most requests carry one or none
        for name, value in headers:
            if name in CREDENTIAL_HEADERS:
                if found is None:
                    found = {name: value}
                    continue
                if name in found:
                    duplicate = ClientError(
                        400,
                        f"the request has more than one {name.decode()} header; allowed: one",
                        param=name.decode(),
                    )
                    self.metrics.requests.labels("", "none", route, "400").inc()
                    return duplicate
                found[name] = value
        if not is_admin and self.keys is None:
            return None
        presented = (
            None
            if found is None
            else presented_key(found.get(b"authorization"), found.get(b"x-api-key"))
        )
        if is_admin:
            refusal = self.admin_refusal(presented, local)
            if refusal is not None:
                self.metrics.auth_failures.labels("admin_denied").inc()
                self.metrics.requests.labels("", "none", route, str(refusal.status)).inc()
            return refusal
        if self.keys is None or self.keys.authenticate(presented) is not None:
            return None
        self.metrics.auth_failures.labels("missing" if not presented else "invalid").inc()
        self.metrics.requests.labels("", "none", route, "401").inc()
        return unauthorized(presented)

    def admin_head_check(
        self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]], local: bool
    ) -> ClientError | None:
        """``--admin-port``'s: `head_check` on the admin API (anything else gets its 404,
        at once when it has a body)."""
        path = url.partition(b"?")[0]
        if path.decode("latin-1") in ADMIN_PATHS:
            return self.head_check(method, url, headers, local)
        if not _declares_body(headers):
            return None
        self.metrics.requests.labels("", "none", ADMIN_ROUTE, "404").inc()
        return BodyNotTaken(
            404,
            f"no route {path.decode('latin-1')} here: this port serves only the admin API "
            f"({', '.join(sorted(ADMIN_PATHS))})",
            param="path",
            error_type="not_found_error",
        )

    def _body_refusal(self, method: bytes, path: bytes) -> BodyNotTaken:
        """The answer to a request with a body on a route that takes none, given before the
        body is read (which the connection then drops): 404 for an unknown path, 405 for a
        method the path does not serve, 400 for a method that takes no body."""
        name = path.decode("latin-1")
        verb = method.decode("latin-1")
        allowed = [
            m for m, t in (("GET", self.get), ("POST", self.post), ("DELETE", self.delete))
            if name in t or (m == "GET" and name.startswith(MODELS_PREFIX))
        ]  # fmt: skip
        refusal: BodyNotTaken
        if not allowed:
            refusal = BodyNotTaken(
                404, f"no route {name}", param="path", error_type="not_found_error"
            )
        elif verb not in allowed and not (verb == "HEAD" and "GET" in allowed):
            refusal = BodyNotTaken(
                405,
                f"method {verb} is not allowed on {name}; allowed: {', '.join(allowed)}",
                param="method",
                headers={"allow": ", ".join(allowed)},
            )
        else:
            refusal = BodyNotTaken(
                400, f"{verb} {name} takes no request body; send none", param="body"
            )
        self.metrics.requests.labels("", "none", "other", str(refusal.status)).inc()
        return refusal

    def client_of(self, headers: list[tuple[bytes, bytes]], address: str) -> str:
        """Whose share of the buffer budget a request's body is charged to: its API key's
        tenant when the router has keys (every body route needs one), else its address."""
        if self.keys is not None:
            presented = presented_key(
                _first(headers, b"authorization"), _first(headers, b"x-api-key")
            )
            key = self.keys.authenticate(presented)
            if key is not None:
                return f"tenant {key.tenant}"
        return f"address {address}"

    def admin_only(self, handler: Handler) -> Handler:
        """``handler``, answering only those ``--admin`` lets use the admin API (checked at
        the head already, `head_check`; again here for a listener without the check)."""

        async def gated(request: HttpRequest) -> None:
            refusal = self.admin_refusal(self._presented(request), request.local)
            if refusal is None:
                await handler(request)
                return
            self.metrics.auth_failures.labels("admin_denied").inc()
            reject(request, refusal, self.metrics, route=ADMIN_ROUTE)

        return gated

    def admin_refusal(self, presented: bytes | None, local: bool) -> ClientError | None:
        """Why a request presenting ``presented`` (through a loopback-bound listener when
        ``local``) may not use the admin API, or None. The client's address is never
        trusted: only the listener it came through, or an admin key."""
        mode = self.config.admin
        if mode == "open":
            return None
        if mode == "off":
            return ClientError(
                403, "the admin API is off (--admin off)", error_type="permission_error"
            )
        key = self.keys.authenticate(presented) if self.keys is not None else None
        if key is not None and key.admin:
            return None
        if mode == "loopback" and local:
            return None
        allowed = "an admin API key" + (
            " (or a request through a listener bound to a loopback address: --host "
            "127.0.0.1, or --admin-port)"
            if mode == "loopback"
            else ""
        )
        return ClientError(
            403,
            f"the admin API needs {allowed} (--admin {mode})",
            error_type="permission_error",
        )

    def keyed(self, handler: Handler) -> Handler:
        """``handler``, answering only requests with a valid API key (else 401)."""

        async def keyed(request: HttpRequest) -> None:
            presented = self._presented(request)
            if self.keys is not None and self.keys.authenticate(presented) is None:
                self.metrics.auth_failures.labels("missing" if not presented else "invalid").inc()
                reject(request, unauthorized(presented), self.metrics, route="other")
                return
            await handler(request)

        return keyed

    @staticmethod
    def _presented(request: HttpRequest) -> bytes | None:
        return presented_key(request.header(b"authorization"), request.header(b"x-api-key"))


def _declares_body(headers: list[tuple[bytes, bytes]]) -> bool:
    """The request has a body: a ``content-length`` above 0 (or unreadable), or a
    ``transfer-encoding``."""
    for name, value in headers:
        if name == b"transfer-encoding":
            return True
        if name == b"content-length":
            value = value.strip()
            return not (value.isdigit() and int(value) == 0)
    return False


def _first(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    return next((value for key, value in headers if key == name), None)
