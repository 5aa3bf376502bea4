"""The router as an endpoint picker (EPP) of the Gateway API Inference Extension.

With ``--picker-port`` the router also serves Envoy's external-processing gRPC service
(``envoy.service.ext_proc.v3.ExternalProcessor``) as the Endpoint Picker protocol describes it
(gateway-api-inference-extension, ``docs/proposals/004-endpoint-picker-protocol``): a gateway
that fronts an ``InferencePool`` sends each request's headers and body here, the router
chooses the worker with the same policy, load view, prefix index and adapter affinity as its
HTTP mode, and the gateway moves the bytes to it.

One ``Process`` stream is one HTTP request, in ``FULL_DUPLEX_STREAMED`` body mode (the only
mode the protocol's implementations support):

- request headers: kept (at most `MAX_HEADER_BYTES`); with ``end_of_stream`` (no body) the
  pick is made at once;
- request body: buffered up to ``--max-request-bytes`` (413 past it; the bodies of all
  streams and of the HTTP port share ``--max-buffered-bytes``, one `BufferBudget`, 503 past
  it) until its end, then parsed as the
  HTTP mode parses it (400 naming the field, 404 for a model no worker serves), the worker
  chosen, and the headers reply sent with ``clear_route_cache`` and the header
  ``x-gateway-destination-endpoint: ip:port[,ip:port...]`` (the chosen worker first, then up
  to ``--max-retries`` fallbacks, least loaded first), the same list under
  ``dynamic_metadata["envoy.lb"]["x-gateway-destination-endpoint"]``, then the body with the
  router's own ``rid`` in place of the client's, as the HTTP mode sends it (`request_ids`:
  SGLang aborts by prefix on a disconnect), as ``streamed_response`` chunks of at most
  `CHUNK_BYTES` (and ``content-length`` set to its new length when the request had one);
- the subset hint, ``metadata_context.filter_metadata["envoy.lb.subset_hint"]
  ["x-gateway-destination-endpoint-subset"]`` (a list of ``ip:port``, or one comma-separated
  string), limits the choice to those endpoints; when none of them can take the request the
  answer is 503;
- refusals are an ``ImmediateResponse``: 503 (no healthy worker, or none in the subset), 429
  (the router is at ``--max-in-flight``: shed), or the HTTP mode's 400/404/413, each with
  its OpenAI-style JSON error body;
- response headers and body pass through, the client's own ``rid`` written back where the
  engine echoes the router's (every body chunk is echoed back as a ``streamed_response``;
  ``content-length`` removed when a rid is written back); the endpoint that served the
  answer is read back from
  ``metadata_context.filter_metadata["envoy.lb"]["x-gateway-destination-endpoint-served"]``,
  and when it is a fallback, the request's in-flight count moves to it. The first body chunk
  ends the prefill for the policy (as the first byte does in HTTP mode); the last one ends the
  request: its status, tokens (``usage``, cached tokens included) and latency are counted on
  the worker that served it, and the policy and the peers hear of it. What the answer side
  says is the gateway's word, not an observation of the router's: a ``:status`` outside
  `KNOWN_STATUSES` is counted as ``other``, ``usage`` is capped by what the request could
  cost (its prompt, its max-tokens fields, the workers' context), and a status ejects a
  worker only when the gateway is authenticated (``--picker-token-file``: its statuses are its
  observations of the engine; without it only the health checks eject). A stream that
  closes before its answer ended is counted as ``499``.

A stream carries one request and makes one pick: a message out of turn (request headers
again, a body after the pick, an answer before it) ends it with ``INVALID_ARGUMENT``, never
with a second pick. What a stream may send and how long it may wait are bounded as the HTTP
port's clients are (`StreamRefused`, `WAITS`): over `MAX_HEADER_BYTES` of headers,
``RESOURCE_EXHAUSTED``; headers, body, answer or its next part later than their timeout,
``DEADLINE_EXCEEDED``, with the body released and the pick given back. Connections are capped
(``--picker-max-connections``; idle ones closed), so are streams (``--max-in-flight`` +
`SHED_STREAMS`). With ``--picker-token-file`` a stream without ``authorization: Bearer
<token>`` metadata ends with ``UNAUTHENTICATED`` before a message is read.

Requests to other paths (``/v1/models`` through the gateway, say) go to the least loaded
healthy worker without the policy. The same port serves the gRPC health service for
``liveness`` (always SERVING), ``readiness``, ``envoy.service.ext_proc.v3.ExternalProcessor``,
``inference-extension`` and the server as a whole (``""``): SERVING while at least one worker is
routable.

With ``--picker-tls`` the port serves TLS with a self-signed certificate made at start, as
the Inference Extension's own pickers do by default (``--secure-serving``): gateways dial
their picker over TLS without verifying it (Istio, GKE, NGINX Gateway Fabric by default).

``--picker-test-headers`` adds what the Inference Extension's conformance suite asks of its
reference picker: the request header ``test-epp-endpoint-selection: ip[:port][,...]`` narrows
the choice like a subset, and the response gets ``x-conformance-test-served-endpoint`` with
the served endpoint. It is for conformance runs only: any client may set that header.

This module is the server (`EndpointPicker`: the port, its health, its shares, the pick); one
stream's turns are `picker_exchange`'s, the protocol's names, limits and messages
`picker_protocol`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tpuserve_router.front.connections import BufferBudget
from tpuserve_router.front.picker_exchange import Exchange
from tpuserve_router.front.picker_gate import PickerGate
from tpuserve_router.front.picker_protocol import (
    TEMPLATE_TOKENS,
    Pick,
    Refused,
    StreamRefused,
    endpoint_of,
)
from tpuserve_router.metrics import PICKER_CONNECTION_REFUSAL_REASONS, PICKER_STREAM_REFUSAL_REASONS
from tpuserve_router.pipeline.deadlines import first_byte_budget
from tpuserve_router.pipeline.driver import Driver
from tpuserve_router.pipeline.generation_limits import MAX_TOKENS_ALLOWED
from tpuserve_router.pipeline.refusals import unavailable
from tpuserve_router.pipeline.request_body import CHARS_PER_TOKEN, GENERATION_ROUTES, ClientError
from tpuserve_router.pipeline.request_ids import name_request
from tpuserve_router.pipeline.selection import Single
from tpuserve_router.pipeline.stages import Admitted, Arrival, InFlight
from tpuserve_router.pipeline.stages import Refused as PipelineRefused
from tpuserve_router.policies.base import NoHealthyWorker, healthy_workers, least_loaded

if TYPE_CHECKING:
    from tpuserve_router.engines.workers import Worker

log = logging.getLogger(__name__)

EXT_PROC_SERVICE: Final = "envoy.service.ext_proc.v3.ExternalProcessor"
HEALTH_SERVICES: Final = ("", "readiness", EXT_PROC_SERVICE, "inference-extension")
"""Health services that follow readiness (a routable worker); ``liveness`` is always
SERVING."""
HEALTH_REFRESH_SECONDS: Final = 1.0
MAX_GRPC_MESSAGE_BYTES: Final = 4 * 1024 * 1024
"""The largest ext_proc message sent (the picker's own are at most `CHUNK_BYTES` of body);
what it takes is ``--picker-max-message-bytes``."""
SHED_STREAMS: Final = 1024
"""Streams a gateway connection may open beyond ``--max-in-flight``: requests the picker
refuses at once (429) rather than leave waiting for a stream."""
TOKEN_METADATA: Final = "authorization"
"""The gRPC metadata carrying ``Bearer <token>`` (``--picker-token-file``)."""
ADMIT_BYTES: Final = 1024 * 1024
"""The buffer room (or ``--max-request-bytes``, the smaller) below which the picker counts as
unable to admit: its health says NOT_SERVING."""
SERVING: Final = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING: Final = health_pb2.HealthCheckResponse.NOT_SERVING


class _LiveHealth(health.aio.HealthServicer):  # type: ignore[misc]
    """The standard health service, brought up to date before each ``Check`` (``Watch``
    follows the picker's refresh every `HEALTH_REFRESH_SECONDS`)."""

    def __init__(self, refresh: Callable[[], Awaitable[None]]) -> None:
        super().__init__()
        self._refresh_now = refresh

    async def Check(self, request: Any, context: Any) -> Any:
        await self._refresh_now()
        return await super().Check(request, context)


class EndpointPicker:
    """The ext_proc service and its gRPC health service, on one port; one per router."""

    def __init__(
        self,
        driver: Driver,
        *,
        test_headers: bool = False,
        tls: bool = False,
        buffers: BufferBudget | None = None,
        token: bytes | None = None,
    ) -> None:
        """``buffers``: the picker's own budget of buffered request bodies
        (``--picker-max-buffered-bytes``, apart from the HTTP port's; made from the config
        when None); ``token``: what a stream's ``authorization: Bearer`` metadata must hold
        (None: no credentials)."""
        self.driver = driver
        self.pipeline = pipeline = driver.pipeline
        self.ledger = driver.ledger
        self.certificate: bytes | None = None
        """The PEM certificate the port serves (``tls``), made at start; None: plaintext."""
        self._key: bytes | None = None
        if tls:
            self._key, self.certificate = self_signed_certificate()
        self.config = pipeline.config
        self.registry = pipeline.registry
        self.metrics = pipeline.metrics
        self.test_headers = test_headers
        self.max_body_bytes = self.config.max_request_bytes
        self.buffers = (
            buffers if buffers is not None else BufferBudget(self.config.picker_buffer_bytes())
        )
        self.share = InFlight(self.config.picker_in_flight(), "--picker-max-in-flight")
        """The picker's own requests in flight, apart from the HTTP port's (``--max-in-flight``):
        picks never followed hold this share, never the HTTP port's room."""
        self.first_byte = first_byte_budget(self.config)
        self.buffered = 0
        """Request-body bytes the picker's streams hold (charged to `buffers` too)."""
        self._token = None if token is None else b"Bearer " + token
        self.authenticated = token is not None
        """Every stream comes from the gateway that holds the token: its answers' statuses
        are the gateway's observations of the engine, and count for outlier ejection."""
        self.streams = 0
        self._live: dict[Exchange, asyncio.Task[Any]] = {}
        """The streams in hand and their tasks, which the sweep cancels past a deadline."""
        self._sweep: asyncio.TimerHandle | None = None
        for reason in PICKER_STREAM_REFUSAL_REASONS:
            self.metrics.picker_streams_refused.labels(reason)
        for reason in PICKER_CONNECTION_REFUSAL_REASONS:
            self.metrics.picker_connections_refused.labels(reason)
        self.gate: PickerGate | None = None
        """The port's TCP front (`picker_gate`): connection caps per source address."""
        self.health = _LiveHealth(self._refresh_health)
        self._server: grpc.aio.Server | None = None
        self._port = 0
        self._refresh: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifetime

    @property
    def port(self) -> int:
        return self._port

    async def start(self, host: str, port: int) -> None:
        config = self.config
        streams = self.share.limit + SHED_STREAMS
        server = grpc.aio.server(
            options=[
                # refused by gRPC from the message's length prefix, before it is buffered
                ("grpc.max_receive_message_length", config.picker_max_message_bytes),
                ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
                # room beyond --picker-max-in-flight, so the requests over it get a 429 at once
                ("grpc.max_concurrent_streams", streams),
                # the gate (`picker_gate`) holds the cap; the relays of connections it just
                # closed may not have reached gRPC yet, so gRPC's own backstop has room
                ("grpc.max_allowed_incoming_connections", 2 * config.picker_max_connections),
                # a connection that completes no handshake, or holds no stream, goes
                ("grpc.server_handshake_timeout_ms", int(config.header_timeout_seconds * 1000)),
                ("grpc.max_connection_idle_ms", int(config.keep_alive_timeout_seconds * 1000)),
                ("grpc.so_reuseport", 0),
                ("grpc.http2.bdp_probe", 0),
            ],
            maximum_concurrent_rpcs=streams,  # over it: RESOURCE_EXHAUSTED, on every connection
        )
        ext_proc_grpc.add_ExternalProcessorServicer_to_server(self, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        # gRPC listens on loopback only; the port is the gate's (per-address caps)
        inner = "127.0.0.1:0"
        if self.certificate is not None and self._key is not None:
            credentials = grpc.ssl_server_credentials([(self._key, self.certificate)])
            relayed = server.add_secure_port(inner, credentials)
        else:
            relayed = server.add_insecure_port(inner)
        if not relayed:
            raise OSError(f"picker_port={port}: could not listen on {inner} (its gRPC server)")
        await server.start()
        self._server = server
        refused = self.metrics.picker_connections_refused
        self.gate = PickerGate(
            relayed,
            max_connections=config.picker_max_connections,
            per_address=min(
                config.picker_max_connections_per_address, config.picker_max_connections
            ),
            count=lambda reason: refused.labels(reason).inc(),
        )
        try:
            bound = await self.gate.start(host, port)
        except OSError as err:
            await server.stop(0)
            self._server = None
            raise OSError(f"picker_port={port}: could not listen on {host}: {err}") from None
        self._port = bound
        self._sweep = asyncio.get_running_loop().call_later(self._tick_seconds(), self._tick)
        await self.health.set("liveness", SERVING)
        await self._refresh_health()
        self._refresh = asyncio.create_task(self._refresh_loop(), name="picker-health")
        log.info(
            "endpoint picker (ext_proc%s) listening on %s:%d",
            ", TLS" if self.certificate is not None else "",
            host,
            bound,
        )

    async def stop(self, grace_seconds: float) -> None:
        """Refuse new streams, give those in hand ``grace_seconds``, then cancel them."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        if self._refresh is not None:
            self._refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresh
            self._refresh = None
        if self.gate is not None:
            self.gate.close_listener()
        if self._server is not None:
            await self.health.enter_graceful_shutdown()
            await self._server.stop(grace_seconds)
            self._server = None
        if self.gate is not None:
            await self.gate.stop()
            self.gate = None

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_REFRESH_SECONDS)
            await self._refresh_health()

    async def _refresh_health(self) -> None:
        status = SERVING if self.registry.healthy_count() > 0 and self.admits() else NOT_SERVING
        for service in HEALTH_SERVICES:
            await self.health.set(service, status)

    def admits(self) -> bool:
        """Whether the picker can take a request now: its in-flight share has room and its
        buffer budget room for a body (`ADMIT_BYTES` or ``--max-request-bytes``, the
        smaller). Readiness follows it (gRPC health: NOT_SERVING while it cannot)."""
        room = min(ADMIT_BYTES, self.max_body_bytes)
        return not self.share.full and self.buffers.free >= room

    # ------------------------------------------------------------------ the stream

    async def Process(
        self,
        request_iterator: AsyncIterator[ext_proc.ProcessingRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        """One stream: read a message, answer it, until the exchange ends. Through the
        context's read and write (not the request iterator and a generator): grpcio's asyncio
        stack costs a quarter less per message that way. A stream without the token, one
        that breaks the protocol or sends more than a gateway may, and one past a deadline
        (`Exchange.expired`, found by the sweep) is ended with a gRPC status naming why, its
        body released and its pick accounted for."""
        exchange = Exchange(self)
        self.streams += 1
        task = asyncio.current_task()
        try:
            try:
                if self._token is not None:
                    self._authenticate(context)
                if task is not None:
                    self._live[exchange] = task
                while not exchange.closed:
                    message = await context.read()
                    if message is grpc.aio.EOF:
                        return
                    try:
                        replies = exchange.handle(message)
                    finally:
                        del message  # a message of megabytes is held no longer than its turn
                    for reply in replies:
                        await context.write(reply)
            except asyncio.CancelledError:
                if exchange.timed_out is None:  # the gateway went, or the router stops
                    raise
                if task is not None:
                    task.uncancel()
                raise exchange.timed_out from None
        except StreamRefused as refused:
            exchange.close()
            self.metrics.picker_streams_refused.labels(refused.reason).inc()
            # Its traceback holds the frames that read the refused message (megabytes of
            # headers, say) and the abort's error makes a cycle with it: only the collector
            # would free them, so a flood of refused streams held every message it sent.
            refused.__traceback__ = None
            code, details = refused.code, f"tpuserve picker: {refused.message}"
            del refused
            await context.abort(code, details)
        finally:
            self._live.pop(exchange, None)
            self.streams -= 1
            exchange.close()

    def _authenticate(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """Raise `StreamRefused` (UNAUTHENTICATED) unless the stream's metadata carries
        ``authorization: Bearer <the token>``."""
        presented = b""
        for key, value in context.invocation_metadata() or ():
            if key == TOKEN_METADATA:
                presented = value.encode("latin-1") if isinstance(value, str) else value
                break
        assert self._token is not None
        if hmac.compare_digest(presented, self._token):
            if self.gate is not None:  # its connection no longer counts against its address
                self.gate.authenticated(context.peer())
            return
        raise StreamRefused(
            grpc.StatusCode.UNAUTHENTICATED,
            "unauthenticated",
            "this picker needs the gateway's token: gRPC metadata "
            f"'{TOKEN_METADATA}: Bearer <token>' (--picker-token-file)"
            + ("; the one presented does not match" if presented else ""),
        )

    # ------------------------------------------------------------------ deadlines

    def _tick_seconds(self) -> float:
        """How often streams' deadlines are checked: a quarter of the shortest, 10 ms..1 s."""
        config = self.config
        shortest = min(
            config.header_timeout_seconds,
            config.body_timeout_seconds,
            config.stream_idle_timeout_seconds,
        )
        return min(1.0, max(0.01, shortest / 4))

    def _tick(self) -> None:
        now = time.monotonic()
        for exchange, task in list(self._live.items()):
            if not exchange.closed and exchange.timed_out is None and exchange.expired(now):
                task.cancel()  # Process turns it into DEADLINE_EXCEEDED
        self._sweep = asyncio.get_running_loop().call_later(self._tick_seconds(), self._tick)

    # ------------------------------------------------------------------ choosing

    def pick(
        self,
        path: str,
        body: bytes,
        allowed: frozenset[str] | None,
        arrived: float | None = None,
    ) -> Pick:
        """Choose the worker for a request to ``path`` with ``body``, which arrived at
        ``arrived`` (now when None): the pipeline's admission and selection, as the HTTP port
        runs them (`tpuserve_router.pipeline.stages`); the gateway relays. ``allowed`` is the set of
        endpoints the gateway (or the test header) allows, None for any. Raises `Refused`."""
        route = path.partition("?")[0]
        parser = GENERATION_ROUTES.get(route)
        if parser is None:
            return self._pick_other(allowed, arrived)
        arrival = Arrival(
            route, parser, body, time.monotonic() if arrived is None else arrived,
            may_wait=False, authenticates=False, shed_status=429, share=self.share,
        )  # fmt: skip
        narrow = None if allowed is None else functools.partial(_allowed, allowed)
        try:
            admitted, selection = self.driver.pick(arrival, narrow)
        except PipelineRefused as refused:
            raise Refused(refused.error, route, refused.model) from None
        return self._pick(admitted, selection, body)

    def _pick(self, admitted: Admitted, selection: Single, body: bytes) -> Pick:
        """The driver's selection, as the gateway is told it: the endpoints in order."""
        parsed, served, bound = admitted.parsed, admitted.served, admitted.bound
        candidates = selection.candidates
        decision = selection.decision
        worker = decision.worker
        # The engine knows the request by the router's own id, never the client's (SGLang
        # aborts by prefix on a disconnect: request_ids), as in HTTP mode.
        ids = name_request(body, admitted.theirs, parsed.single)
        contexts = [w.context_tokens for w in candidates if w.context_tokens is not None]
        context = max(contexts, default=None)
        prompt_cap = (parsed.prompt_tokens * CHARS_PER_TOKEN + TEMPLATE_TOKENS) * bound.generations
        if context is not None:
            prompt_cap = min(prompt_cap, context * bound.generations)
        answer = self.first_byte.seconds(
            parsed.prompt_tokens, parsed.max_new_tokens, parsed.stream, worker.in_flight
        )
        return Pick(
            worker,
            decision,
            [endpoint_of(worker), *self._fallbacks(worker, candidates)],
            served.model or (worker.models[0] if worker.models else ""),
            admitted.route,
            parsed.stream,
            admitted.arrival.arrived,
            ids.body,
            ids.restorer,
            prompt_cap,
            bound.allowance(parsed.prompt_tokens, context, MAX_TOKENS_ALLOWED * bound.generations),
            admitted,
            selection=selection,
            answer_seconds=answer,
        )

    def _pick_other(self, allowed: frozenset[str] | None, arrived: float | None) -> Pick:
        """A request off the generation routes: the least loaded routable worker."""
        if self.share.full:  # counted in the picker's share too (`Exchange._book`)
            message = (
                f"the router has {self.share.count} of the picker's requests in flight, its "
                "limit (--picker-max-in-flight); retry"
            )
            raise Refused(ClientError(429, message, error_type="rate_limit_exceeded"), "other")
        workers = self.registry.workers
        if allowed is not None:
            workers = [w for w in workers if _allows(allowed, w)]
        try:
            worker = least_loaded(healthy_workers(workers))
        except NoHealthyWorker:
            raise Refused(unavailable("no healthy worker"), "other") from None
        return Pick(
            worker, None, [endpoint_of(worker), *self._fallbacks(worker, workers)], "", "other",
            False, time.monotonic() if arrived is None else arrived,
            answer_seconds=self.config.first_byte_timeout_floor_seconds,
        )  # fmt: skip

    def _fallbacks(self, chosen: Worker, candidates: Sequence[Worker]) -> list[str]:
        """Up to ``--max-retries`` other routable candidates, least loaded first: where the
        gateway goes if the chosen one fails before answering."""
        others = [w for w in candidates if w is not chosen and w.healthy]
        others.sort(key=lambda w: w.in_flight)
        return [endpoint_of(w) for w in others[: self.config.max_retries]]

    def worker_at(self, endpoint: str) -> Worker | None:
        for worker in self.registry.workers:
            if endpoint_of(worker) == endpoint:
                return worker
        return None


CERTIFICATE_NAME: Final = "tpuserve-picker"
"""The self-signed certificate's common name and DNS name (a client that checks it
overrides the target name with this)."""
CERTIFICATE_DAYS: Final = 3650


def self_signed_certificate() -> tuple[bytes, bytes]:
    """A new P-256 key and a self-signed certificate for it, both PEM (what the reference
    picker makes at start for ``--secure-serving``: gateways skip verifying it)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CERTIFICATE_NAME)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERTIFICATE_DAYS))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(CERTIFICATE_NAME)]), False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key_pem, certificate.public_bytes(serialization.Encoding.PEM)


def _allowed(allowed: frozenset[str], admitted: Admitted) -> list[Worker]:
    """The workers serving ``admitted``'s model that the gateway ``allowed``; `Refused`
    (503) when none is."""
    candidates = [w for w in admitted.served.workers if _allows(allowed, w)]
    if not candidates:
        raise PipelineRefused(
            unavailable(
                "none of the endpoints the gateway allows "
                f"({', '.join(sorted(allowed)) or 'none'}) serves model {admitted.asked!r}"
            ),
            admitted.served.model,
        )
    return candidates


def _allows(allowed: frozenset[str], worker: Worker) -> bool:
    """``worker`` is in ``allowed``: by ``ip:port``, or by its address alone (an entry
    without a port allows every port of that address, as the reference picker reads it)."""
    return endpoint_of(worker) in allowed or worker.host.strip("[]") in allowed
