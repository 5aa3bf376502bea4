"""The endpoint picker's own shares (issue 68, item 1): picks and bodies sent to the picker's
port hold the picker's in-flight and buffer shares, never the HTTP port's; a pick the gateway
never follows is released when a working engine would have answered; readiness (HTTP) and
gRPC health say when a front cannot admit. Real gRPC (a client built from Envoy's protos) and
real HTTP (the openai client, raw sockets) on loopback, in front of engine twins.

Each test reproduces a red team's finding, scaled down: 4,096 picks never answered held the
HTTP port's in-flight limit (every HTTP request 503); 16 half-sent 32 MiB bodies filled the
shared buffer budget (HTTP 503 for 60 s); readiness and gRPC health said "ready" throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import openai
import orjson
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc

from tests.component.router.gateway_emulator import PickerClient
from tests.component.router.router_fleet import MODEL, EngineTwin, sample, start_router
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig

pytestmark = pytest.mark.component

WAIT_SECONDS = 60.0
"""The most a test waits for a bounded stream to end (the old bound was 600 s)."""


def completion(prompt: str, stream: bool = False) -> bytes:
    return orjson.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": stream})


async def http_completion(app: RouterApp, prompt: str = "still served") -> str:
    async with openai.AsyncOpenAI(
        base_url=app.base_url + "/v1", api_key="unused", max_retries=0, timeout=30
    ) as oa:
        answer = await oa.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    return answer.choices[0].text


async def readiness(app: RouterApp) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(app.base_url + "/readiness") as response,
    ):
        return response.status, orjson.loads(await response.read())


def headers(path: str = "/v1/completions") -> ext_proc.ProcessingRequest:
    pairs = {":method": "POST", ":path": path, "content-type": "application/json"}
    return ext_proc.ProcessingRequest(
        request_headers=ext_proc.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()
                ]
            ),
            end_of_stream=False,
        )
    )


async def ended_with(call: Any) -> tuple[grpc.StatusCode, str]:
    with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
        while await call.read() is not grpc.aio.EOF:
            pass
    return await call.code(), await call.details()


async def health_is(client: PickerClient, status: str) -> bool:
    return await client.check("readiness") == status


def settled(app: RouterApp) -> bool:
    assert app.picker is not None
    return (
        app.picker.share.count == 0
        and app.pipeline.in_flight == 0
        and all(w.in_flight == 0 for w in app.registry.workers)
    )


@pytest.fixture
async def small(engines: list[EngineTwin]) -> AsyncIterator[RouterApp]:
    """A router with room for 8 requests in flight and 1 MiB of bodies (256 KiB of it the
    picker's), one address allowed the whole HTTP share."""
    config = RouterConfig(
        workers=tuple(e.url for e in engines),
        policy="round_robin",
        health_check_interval_seconds=0.5,
        picker_port=0,
        max_in_flight=8,
        max_request_bytes=256 * 1024,
        max_buffered_bytes=1024 * 1024,
        max_buffered_bytes_per_client=768 * 1024,
        body_timeout_seconds=30.0,
    )
    app = await start_router(config, ready_workers=len(engines))
    yield app
    await app.stop()


async def test_picks_never_answered_leave_the_http_ports_in_flight_room(small: RouterApp) -> None:
    picker = small.picker
    assert picker is not None
    client = PickerClient(f"127.0.0.1:{picker.port}")
    held: list[Any] = []
    try:
        for i in range(8):  # picked, and never followed: no answer comes back
            call, decision = await client.open("/v1/completions", completion(f"held {i}"))
            assert decision.endpoints, decision.body
            held.append(call)
        assert await http_completion(small)  # before: 503, the shared limit held by picks
        assert small.pipeline.in_flight == 0  # the HTTP port's count is its own
        assert picker.share.count == 8
        over = await client.exchange("/v1/completions", completion("one more"))
        assert over.status == 429
        assert b"--picker-max-in-flight" in over.body
        await eventually_async(lambda: health_is(client, "NOT_SERVING"), what="not ready")
        assert await client.check(picker_service()) == "NOT_SERVING"
        status, body = await readiness(small)
        assert (status, body["ready"]) == (200, True)  # the HTTP port still admits
        for call in held:
            call.cancel()
        await eventually_async(lambda: settled(small), what="every pick given back")
        await eventually_async(lambda: health_is(client, "SERVING"), what="ready again")
    finally:
        for call in held:
            call.cancel()
        await client.close()


def picker_service() -> str:
    return "envoy.service.ext_proc.v3.ExternalProcessor"


async def test_half_sent_bodies_fill_the_pickers_share_not_the_http_ports(
    small: RouterApp,
) -> None:
    picker = small.picker
    assert picker is not None
    client = PickerClient(f"127.0.0.1:{picker.port}")
    half = b"x" * (64 * 1024)
    calls = [client.stub.Process() for _ in range(16)]

    async def half_send(call: Any) -> None:  # half of a 256 KiB body, then nothing
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await call.write(headers())
            for _ in range(2):
                await call.write(
                    ext_proc.ProcessingRequest(
                        request_body=ext_proc.HttpBody(body=half, end_of_stream=False)
                    )
                )

    try:
        await asyncio.gather(*(half_send(call) for call in calls))
        await eventually_async(
            lambda: picker.buffers.free < 64 * 1024, what="the picker's share filled"
        )
        # the HTTP port takes a body of ~200 KB meanwhile (before: 503, the budget was one)
        assert await http_completion(small, "y" * 200_000)
        assert picker.buffers.used <= picker.buffers.max_bytes == 256 * 1024
        assert small.book.buffers.used == 0
        await eventually_async(lambda: health_is(client, "NOT_SERVING"), what="not ready")
        status, _ = await readiness(small)
        assert status == 200
        labels = {"model": "", "worker": "none", "route": "/v1/completions", "status": "503"}
        refused = sample(small, "tpuserve_router_requests_total", labels)
        assert refused >= 12  # the streams past the share were answered 503 at once
    finally:
        for call in calls:
            call.cancel()
        await client.close()
    await eventually_async(lambda: picker.buffers.used == 0, what="every body released")


async def test_the_http_readiness_is_false_while_its_buffer_budget_is_full(
    small: RouterApp,
) -> None:
    """Raw sockets that send a request head and half its body hold the HTTP port's budget:
    /readiness answers 503 (``admits`` false) until they go."""
    host, port = "127.0.0.1", small.port
    budget = small.book.buffers
    writers: list[asyncio.StreamWriter] = []
    try:
        for _ in range(5):  # 5 x 256 KiB bodies, half sent, of the 768 KiB HTTP share
            _reader, writer = await asyncio.open_connection(host, port)
            writer.write(
                b"POST /v1/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n"
                b"content-length: 262144\r\n\r\n" + b"x" * 131_072
            )
            await writer.drain()
            writers.append(writer)
        await eventually_async(
            lambda: budget.free < 256 * 1024, what="the HTTP budget held by half-sent bodies"
        )
        status, body = await readiness(small)
        assert (status, body["ready"], body["admits"]) == (503, False, False)
    finally:
        for writer in writers:
            writer.close()
    await eventually_async(lambda: budget.used == 0, what="the bodies released")
    status, body = await readiness(small)
    assert (status, body["admits"]) == (200, True)


async def test_a_pick_the_gateway_never_follows_is_released_at_its_first_byte_bound(
    engines: list[EngineTwin],
) -> None:
    """The answer's head is awaited as long as the HTTP port would wait for a worker's first
    byte on this request (floor + prefill; a stream's head comes before its first token),
    not --first-byte-timeout's 600 s."""
    config = RouterConfig(
        workers=tuple(e.url for e in engines),
        policy="round_robin",
        health_check_interval_seconds=0.5,
        picker_port=0,
        first_byte_timeout_floor_seconds=1.0,
    )
    app = await start_router(config, ready_workers=len(engines))
    picker = app.picker
    assert picker is not None
    assert config.first_byte_timeout_seconds == 600
    client = PickerClient(f"127.0.0.1:{picker.port}")
    try:
        call, decision = await client.open("/v1/completions", completion("never followed", True))
        assert decision.endpoints
        code, details = await asyncio.wait_for(ended_with(call), WAIT_SECONDS)
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "answer did not arrive" in details
        assert picker.share.count == 0
        labels = {"reason": "first_byte_timeout"}
        assert sample(app, "tpuserve_router_picker_streams_refused_total", labels) == 1
        await eventually_async(lambda: settled(app), what="the pick given back")
    finally:
        await client.close()
        await app.stop()


async def test_at_zero_replicas_only_admitted_picks_are_demand() -> None:
    """Issue 68: 20 picks at zero replicas woke the server although the client got a 404
    (the arrival counted as demand before admission). Now a pick for a model the router
    knows (``--hold-models``: the operator passes the served name) is 503 with
    ``Retry-After`` and demand; one for any other model is 503 and no demand. The hook is the
    one `DemandLease.arrived` is wired to (tests/component/router/test_router_demand.py
    holds the Lease's side)."""
    config = RouterConfig(workers=(), picker_port=0, hold_models=(MODEL,))
    app = await start_router(config)
    picker = app.picker
    assert picker is not None
    demand: list[bool] = []
    app.pipeline.on_arrival = lambda held, model: demand.append(held)
    client = PickerClient(f"127.0.0.1:{picker.port}")
    try:
        for _ in range(20):
            forged = await client.exchange(
                "/v1/completions", orjson.dumps({"model": "not-served", "prompt": "x"})
            )
            assert forged.status == 503  # the docs' answer at zero replicas (a 404 before)
        assert demand == []
        wanted = await client.exchange("/v1/completions", completion("wake up"))
        assert wanted.status == 503
        retry = {h.header.key: h.header.raw_value for h in wanted.immediate.headers.set_headers}
        assert retry.get("retry-after")
        assert demand == [True]  # held at once: the Lease is renewed without waiting
        assert picker.share.count == 0
    finally:
        await client.close()
        await app.stop()


async def test_a_connection_flood_from_one_address_leaves_the_gateway_room(
    engines: list[EngineTwin], tmp_path: Path
) -> None:
    """Issue 68: 300 half-open connections from one address blocked 44 of 45 new gateway
    connections (one cap for the port, counted before authentication). From 127.0.0.2, 300
    connections that never speak; from 127.0.0.1 the gateway opens 45 connections, each
    authenticating with a request: every one is served. The flood's address holds at most
    --picker-max-connections-per-address, and at the port's cap its connections are the ones
    closed, never an authenticated one."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    config = RouterConfig(
        workers=tuple(e.url for e in engines),
        policy="round_robin",
        health_check_interval_seconds=0.5,
        picker_port=0,
        picker_token_file=str(token),
        picker_max_connections=96,
    )
    app = await start_router(config, ready_workers=len(engines))
    picker = app.picker
    assert picker is not None
    flood: list[socket.socket] = []
    gateway: list[PickerClient] = []
    try:
        for _ in range(300):
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", picker.port))
            flood.append(s)
        for i in range(45):  # one after another, as a gateway's proxies connect
            client = PickerClient(f"127.0.0.1:{picker.port}", token=TOKEN, own_connection=True)
            gateway.append(client)
            answer = await client.exchange("/v1/completions", completion(f"gateway {i}"))
            assert answer.status == 200, (i, answer.body)
        assert await http_completion(app)
        # (the listen backlog holds some back for a while: not all 300 have arrived)
        await eventually_async(
            lambda: sample(app, PICKER_CONNECTIONS_REFUSED, {"reason": "per_address"}) > 0,
            what="the flood's address held to its share",
        )
        assert picker.gate is not None
        assert picker.gate.unauthenticated.get("127.0.0.2", 0) <= 64
    finally:
        for s in flood:
            s.close()
        for client in gateway:
            await client.close()
        await app.stop()


PICKER_CONNECTIONS_REFUSED = "tpuserve_router_picker_connections_refused_total"
TOKEN = "gateway-token-0123456789abcdef"
