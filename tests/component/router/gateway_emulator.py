"""A data plane that consults the router's endpoint picker as a gateway does, for tests.

No Envoy package exists for these machines, so the tests play its part with a client built
from the same published protos (xds-protos) the picker serves: `PickerClient.exchange` runs
one ext_proc stream for one request, in ``FULL_DUPLEX_STREAMED`` mode, the way Envoy's
``ext_proc`` filter with ``request_body_mode``/``response_body_mode: FULL_DUPLEX_STREAMED``
drives it: the request headers (with the subset hint in ``metadata_context`` when given),
the body in chunks, then, once the picker answered with its destination, the request to
that endpoint (the first, or the one ``serve_at`` names, as a retry onto a fallback would),
its response headers with ``envoy.lb``'s ``x-gateway-destination-endpoint-served``, and its
body chunk by chunk, relaying what the picker echoes back. `GatewayFront` puts an HTTP port
in front of it, so the official ``openai`` client can talk to "the gateway".
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc
from aiohttp import web
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tpuserve_router.front import picker as epp
from tpuserve_router.front import picker_protocol as protocol

REQUEST_CHUNK_BYTES = 1000  # small, so a test body arrives in several chunks
HOP_BY_HOP = frozenset({"connection", "transfer-encoding", "content-length", "keep-alive"})


@dataclass
class Exchange:
    """What one request's stream showed."""

    status: int = 0
    header_destination: str = ""
    metadata_destination: str = ""
    immediate: Any = None
    """The picker's ImmediateResponse, when it answered the request itself."""
    body: bytes = b""
    """The response body as the picker passed it back (or the immediate response's)."""
    headers: dict[str, str] = field(default_factory=dict)
    """The response headers the picker set (its mutation)."""
    request_body: bytes = b""
    """The request body as the picker passed it on."""
    cleared_route_cache: bool = False
    content_type: str = ""
    """The endpoint's response content type."""

    @property
    def endpoints(self) -> list[str]:
        return [e for e in self.header_destination.split(",") if e]


def _header(key: str, value: str) -> base_pb2.HeaderValue:
    return base_pb2.HeaderValue(key=key, raw_value=value.encode())


def _metadata(namespace: str, key: str, value: Any) -> base_pb2.Metadata:
    inner = struct_pb2.Struct()
    inner.update({key: value})
    metadata = base_pb2.Metadata()
    metadata.filter_metadata[namespace].CopyFrom(inner)
    return metadata


class PickerClient:
    """An ext_proc client of one picker, with its health stub."""

    def __init__(
        self,
        target: str,
        certificate: bytes | None = None,
        chunk_bytes: int = REQUEST_CHUNK_BYTES,
        token: str | None = None,
        own_connection: bool = False,
    ) -> None:
        """``certificate``: the picker's (``--picker-tls``), trusted for this channel;
        ``chunk_bytes``: the request body's chunks (Envoy's are as large as its reads);
        ``token``: sent as ``authorization: Bearer`` metadata on each stream, as Envoy's
        ``grpc_service.initial_metadata`` would (``--picker-token-file``); ``own_connection``:
        this client's channel shares no connection with other clients' (grpc pools them)."""
        self.chunk_bytes = chunk_bytes
        self.metadata = None if token is None else (("authorization", f"Bearer {token}"),)
        options = [("grpc.use_local_subchannel_pool", 1)] if own_connection else []
        if certificate is None:
            self.channel = grpc.aio.insecure_channel(target, options=options)
        else:
            self.channel = grpc.aio.secure_channel(
                target,
                grpc.ssl_channel_credentials(root_certificates=certificate),
                options=[("grpc.ssl_target_name_override", epp.CERTIFICATE_NAME), *options],
            )
        self.stub = ext_proc_grpc.ExternalProcessorStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.http: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        await self.channel.close()
        if self.http is not None:
            await self.http.close()

    async def check(self, service: str) -> str:
        reply = await self.health.Check(health_pb2.HealthCheckRequest(service=service))
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

    async def open(
        self,
        path: str,
        body: bytes,
        *,
        method: str = "POST",
        headers: dict[str, str] | None = None,
        subset: Sequence[str] | str | None = None,
    ) -> tuple[Any, Exchange]:
        """Start a stream and send the request; returns it with the picker's decision read
        (the stream is left open for the response)."""
        call = self.stub.Process(metadata=self.metadata)
        sent = [
            _header(":method", method),
            _header(":path", path),
            _header(":authority", "gateway.test"),
            _header("content-type", "application/json"),
        ]
        sent += [_header(k, v) for k, v in (headers or {}).items()]
        message = ext_proc.ProcessingRequest(
            request_headers=ext_proc.HttpHeaders(
                headers=base_pb2.HeaderMap(headers=sent), end_of_stream=not body
            )
        )
        if subset is not None:
            value = subset if isinstance(subset, str) else list(subset)
            message.metadata_context.CopyFrom(
                _metadata(protocol.SUBSET_NAMESPACE, protocol.SUBSET_KEY, value)
            )
        await call.write(message)
        writer = asyncio.create_task(self._send_body(call, body, self.chunk_bytes))
        try:
            return await self._decision(call, body)
        finally:
            await writer

    @staticmethod
    async def _send_body(call: Any, body: bytes, chunk_bytes: int) -> None:
        """The body in chunks, as a data plane streams it while reading the picker's answers:
        a picker that answers at once (an immediate response) ends the stream, and the rest
        is not sent."""
        for start in range(0, len(body), chunk_bytes):
            piece = body[start : start + chunk_bytes]
            last = start + chunk_bytes >= len(body)
            try:
                await call.write(
                    ext_proc.ProcessingRequest(
                        request_body=ext_proc.HttpBody(body=piece, end_of_stream=last)
                    )
                )
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                return

    @staticmethod
    async def _decision(call: Any, body: bytes) -> tuple[Any, Exchange]:
        """Read the picker's answers up to its decision (or its refusal)."""
        result = Exchange()
        while True:  # the headers reply, then the body as re-emitted (or a refusal)
            reply = await call.read()
            assert reply is not grpc.aio.EOF, "the picker closed the stream without a decision"
            kind = reply.WhichOneof("response")
            if kind == "immediate_response":
                result.immediate = reply.immediate_response
                result.status = reply.immediate_response.status.code
                result.body = reply.immediate_response.body
                return call, result
            if kind == "request_headers":
                common = reply.request_headers.response
                result.cleared_route_cache = common.clear_route_cache
                for option in common.header_mutation.set_headers:
                    if option.header.key == protocol.DESTINATION_KEY:
                        result.header_destination = option.header.raw_value.decode()
                lb = reply.dynamic_metadata.fields[protocol.DESTINATION_NAMESPACE].struct_value
                result.metadata_destination = lb.fields[protocol.DESTINATION_KEY].string_value
                if not body:
                    return call, result
                continue
            assert kind == "request_body", kind
            streamed = reply.request_body.response.body_mutation.streamed_response
            result.request_body += streamed.body
            if streamed.end_of_stream:
                return call, result

    async def exchange(
        self,
        path: str,
        body: bytes,
        *,
        method: str = "POST",
        headers: dict[str, str] | None = None,
        subset: Sequence[str] | str | None = None,
        serve_at: str | None = None,
    ) -> Exchange:
        """One request through the picker and on to the endpoint it chose (or ``serve_at``)."""
        call, result = await self.open(path, body, method=method, headers=headers, subset=subset)
        if result.immediate is not None:
            call.cancel()
            return result
        endpoint = serve_at or result.endpoints[0]
        chunks = []
        async for piece in self.relay(call, result, endpoint, path, method, result.request_body):
            chunks.append(piece)
        result.body = b"".join(chunks)
        return result

    async def relay(
        self, call: Any, result: Exchange, endpoint: str, path: str, method: str, body: bytes
    ) -> AsyncIterator[bytes]:
        """Send the request to ``endpoint`` and pass its answer through the picker, yielding
        the body chunks the picker passes back."""
        if self.http is None:
            self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        served = _metadata(protocol.DESTINATION_NAMESPACE, protocol.SERVED_KEY, endpoint)
        async with self.http.request(
            method,
            f"http://{endpoint}{path}",
            data=body or None,
            headers={"content-type": "application/json"},
        ) as response:
            result.status = response.status
            result.content_type = response.headers.get("content-type", "")
            sent = [_header(":status", str(response.status))]
            sent += [
                _header(k.lower(), v)
                for k, v in response.headers.items()
                if k.lower() not in HOP_BY_HOP
            ]
            await call.write(
                ext_proc.ProcessingRequest(
                    response_headers=ext_proc.HttpHeaders(headers=base_pb2.HeaderMap(headers=sent)),
                    metadata_context=served,
                )
            )
            reply = await call.read()
            assert reply.WhichOneof("response") == "response_headers"
            for option in reply.response_headers.response.header_mutation.set_headers:
                result.headers[option.header.key] = option.header.raw_value.decode()
            async for piece in response.content.iter_any():
                async for echoed in self._body(call, piece, False, served):
                    yield echoed
            async for echoed in self._body(call, b"", True, served):
                yield echoed
        await call.done_writing()

    @staticmethod
    async def _body(
        call: Any, piece: bytes, last: bool, served: base_pb2.Metadata
    ) -> AsyncIterator[bytes]:
        await call.write(
            ext_proc.ProcessingRequest(
                response_body=ext_proc.HttpBody(body=piece, end_of_stream=last),
                metadata_context=served,
            )
        )
        reply = await call.read()
        assert reply.WhichOneof("response") == "response_body"
        streamed = reply.response_body.response.body_mutation.streamed_response
        assert streamed.end_of_stream == last
        yield streamed.body


class GatewayFront:
    """An HTTP port whose every request goes through the picker (`PickerClient`): what the
    ``openai`` client talks to in place of a gateway."""

    def __init__(self, client: PickerClient) -> None:
        self.client = client
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        path = request.path_qs
        call, result = await self.client.open(path, body, method=request.method)
        if result.immediate is not None:
            call.cancel()
            return web.Response(
                status=result.status, body=result.body, content_type="application/json"
            )
        out = web.StreamResponse()
        started = False
        async for piece in self.client.relay(
            call, result, result.endpoints[0], path, request.method, result.request_body
        ):
            if not started:
                out.set_status(result.status)
                out.headers["content-type"] = result.content_type or "application/json"
                await out.prepare(request)
                started = True
            if piece:
                await out.write(piece)
        if not started:
            out.set_status(result.status)
            await out.prepare(request)
        await out.write_eof()
        return out
