"""Hostile clients of the router's endpoint picker (issue 57): a stream that repeats its request
headers, floods of header bytes, idle streams and bodies that never end, too many connections,
and clients without the gateway's token. Each is a gRPC client built from Envoy's published
protos (xds-protos) on loopback, in front of engine twins, while keyed-free HTTP traffic goes
through the router's own port.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import openai
import orjson
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from grpc_health.v1 import health_pb2

from tests.bench_scripts import load_bench_script
from tests.component.router.gateway_emulator import PickerClient
from tests.component.router.router_fleet import (
    MODEL,
    EngineTwin,
    sample,
    start_router,
)
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig

pytestmark = pytest.mark.component


def settled(app: RouterApp) -> bool:
    assert app.picker is not None
    return app.picker.share.count == 0 and all(w.in_flight == 0 for w in app.registry.workers)


def headers(
    path: str, *, end: bool, extra: dict[str, str] | None = None
) -> ext_proc.ProcessingRequest:
    pairs = {":method": "GET" if end else "POST", ":path": path, **(extra or {})}
    return ext_proc.ProcessingRequest(
        request_headers=ext_proc.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()
                ]
            ),
            end_of_stream=end,
        )
    )


async def served_over_http(app: RouterApp) -> str:
    async with openai.AsyncOpenAI(
        base_url=app.base_url + "/v1", api_key="unused", max_retries=0, timeout=30
    ) as oa:
        answer = await oa.completions.create(model=MODEL, prompt="still served", max_tokens=2)
    return answer.choices[0].text


@pytest.fixture
async def router(engines: list[EngineTwin]) -> AsyncIterator[RouterApp]:
    config = RouterConfig(
        workers=tuple(e.url for e in engines),
        policy="round_robin",
        health_check_interval_seconds=0.5,
        picker_port=0,
    )
    app = await start_router(config, ready_workers=len(engines))
    yield app
    await app.stop()


async def test_repeated_request_headers_on_one_stream_pick_once_and_leak_nothing(
    router: RouterApp,
) -> None:
    assert router.picker is not None
    client = PickerClient(f"127.0.0.1:{router.picker.port}")
    try:
        call = client.stub.Process()
        replies: list[Any] = []
        status: Any = None
        for _ in range(50):
            try:
                await call.write(headers("/v1/models", end=True))
                replies.append(await call.read())
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                break
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await call.done_writing()
        status = await call.code()
        await eventually_async(
            lambda: settled(router), what="every in-flight count back to 0", timeout_seconds=5
        )
        picks = [r for r in replies if r is not grpc.aio.EOF and r.HasField("request_headers")]
        assert len(picks) == 1  # one pick per stream; the second headers are refused
        assert status == grpc.StatusCode.INVALID_ARGUMENT
        assert "one request per stream" in (await call.details())
        assert await served_over_http(router)
    finally:
        await client.close()


TOKEN = "gateway-token-0123456789abcdef"
KEY = "sk-tenant-0123456789abcdef"


@pytest.fixture
async def guarded(engines: list[EngineTwin], tmp_path: Path) -> AsyncIterator[RouterApp]:
    """A router with API keys on its HTTP port, and on its picker port the gateway's token,
    short stream deadlines and room for 3 connections."""
    keys = tmp_path / "keys.json"
    keys.write_bytes(orjson.dumps({"keys": [{"key": KEY, "tenant": "acme"}]}))
    token = tmp_path / "picker-token"
    token.write_text(TOKEN + "\n")
    config = RouterConfig(
        workers=tuple(e.url for e in engines),
        policy="round_robin",
        health_check_interval_seconds=0.5,
        api_keys_file=str(keys),
        picker_port=0,
        picker_token_file=str(token),
        picker_max_connections=3,
        header_timeout_seconds=1.0,
        body_timeout_seconds=1.5,
        max_request_bytes=64 * 1024,
    )
    app = await start_router(config, ready_workers=len(engines))
    yield app
    await app.stop()


def refused(app: RouterApp, reason: str) -> float:
    return sample(app, "tpuserve_router_picker_streams_refused_total", {"reason": reason})


async def keyed_completion(app: RouterApp) -> str:
    async with openai.AsyncOpenAI(
        base_url=app.base_url + "/v1", api_key=KEY, max_retries=0, timeout=30
    ) as oa:
        answer = await oa.completions.create(model=MODEL, prompt="still served", max_tokens=2)
    return answer.choices[0].text


async def ended_with(call: Any) -> tuple[grpc.StatusCode, str]:
    """Read ``call`` to its end: its status and details."""
    with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
        while await call.read() is not grpc.aio.EOF:
            pass
    return await call.code(), await call.details()


async def test_streams_without_the_gateways_token_are_refused(guarded: RouterApp) -> None:
    assert guarded.picker is not None
    target = f"127.0.0.1:{guarded.picker.port}"
    for token in (None, "not-the-gateway-token-0123"):
        client = PickerClient(target, token=token)
        try:
            # The picker refuses the stream on its metadata, before it reads a message, so
            # the client writes none: grpcio's asyncio client reports a write that fails
            # because the server has already ended the call as INTERNAL, overwriting the
            # status the server sent (grpc/grpc#36066, PR #43486, open). Envoy keeps the
            # server's status; a loaded machine made the write lose the race (INTERNAL).
            call = client.stub.Process(metadata=client.metadata)
            code, details = await ended_with(call)
            assert code == grpc.StatusCode.UNAUTHENTICATED
            assert "--picker-token-file" in details
            assert await client.check("liveness") == "SERVING"  # health needs no token
        finally:
            await client.close()
    assert refused(guarded, "unauthenticated") == 2
    client = PickerClient(target, token=TOKEN)
    try:
        answer = await client.exchange(
            "/v1/completions", orjson.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2})
        )
        assert answer.status == 200
    finally:
        await client.close()
    await eventually_async(lambda: settled(guarded), what="every request accounted for")


async def test_a_header_flood_is_refused_and_nothing_of_it_is_kept(guarded: RouterApp) -> None:
    assert guarded.picker is not None
    client = PickerClient(f"127.0.0.1:{guarded.picker.port}", token=TOKEN)
    flood = {f"x-flood-{i}": "f" * 1000 for i in range(1000)}  # ~1 MB of headers a stream

    async def one() -> tuple[grpc.StatusCode, str]:
        call = client.stub.Process(metadata=client.metadata)
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await call.write(headers("/v1/completions", end=False, extra=flood))
        return await ended_with(call)

    try:
        flooding = asyncio.gather(*(one() for _ in range(20)))
        served = await keyed_completion(guarded)  # the HTTP port serves meanwhile
        outcomes = await flooding
    finally:
        await client.close()
    assert served
    assert {code for code, _ in outcomes} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert all("61440" in details for _, details in outcomes)
    assert refused(guarded, "headers_too_large") == 20
    picker = guarded.picker
    await eventually_async(lambda: picker.streams == 0, what="every stream released")
    assert picker.buffered == 0
    assert guarded.book.buffers.used == 0
    await eventually_async(lambda: settled(guarded), what="every request accounted for")


async def test_idle_streams_and_bodies_that_never_end_are_timed_out_and_released(
    guarded: RouterApp,
) -> None:
    picker = guarded.picker
    assert picker is not None
    client = PickerClient(f"127.0.0.1:{picker.port}", token=TOKEN)
    try:
        idle = client.stub.Process(metadata=client.metadata)  # sends nothing at all
        await idle.wait_for_connection()
        holding = client.stub.Process(metadata=client.metadata)
        await holding.write(headers("/v1/completions", end=False))
        await holding.write(
            ext_proc.ProcessingRequest(
                request_body=ext_proc.HttpBody(body=b"x" * 3000, end_of_stream=False)
            )
        )
        await eventually_async(lambda: picker.buffered == 3000, what="the body held")
        assert picker.buffers.used == 3000  # the picker's own budget, not the HTTP port's
        assert guarded.book.buffers.used == 0
        idle_end, body_end = await asyncio.gather(ended_with(idle), ended_with(holding))
        assert idle_end[0] == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "--header-timeout" in idle_end[1]
        assert body_end[0] == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "--body-timeout" in body_end[1]
    finally:
        await client.close()
    assert refused(guarded, "header_timeout") == 1
    assert refused(guarded, "body_timeout") == 1
    assert picker.buffered == 0
    assert picker.buffers.used == 0
    assert picker.streams == 0
    assert await keyed_completion(guarded)


async def test_connections_past_the_cap_are_refused_and_http_still_served(
    guarded: RouterApp,
) -> None:
    picker = guarded.picker
    assert picker is not None
    target = f"127.0.0.1:{picker.port}"
    held = [PickerClient(target, token=TOKEN, own_connection=True) for _ in range(3)]
    extra = PickerClient(target, token=TOKEN, own_connection=True)
    try:
        for client in held:  # each one connection (its own channel), open and idle
            assert await client.check("liveness") == "SERVING"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await extra.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert caught.value.code() in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        )
        assert await keyed_completion(guarded)
        await held.pop().close()

        async def admitted() -> bool:
            fresh = PickerClient(target, token=TOKEN, own_connection=True)
            try:
                return await fresh.check("liveness") == "SERVING"
            except grpc.aio.AioRpcError:
                return False
            finally:
                await fresh.close()

        await eventually_async(admitted, what="a connection admitted once one closed")
    finally:
        for client in (*held, extra):
            await client.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_the_engine_sees_the_routers_rid_and_the_client_its_own(
    router: RouterApp, stream: bool
) -> None:
    """A client's ``rid`` never reaches the engine through the gateway (SGLang aborts by
    prefix on a disconnect: a short rid would stop other clients' requests); its answer still
    names the request by the client's rid."""
    assert router.picker is not None
    client = PickerClient(f"127.0.0.1:{router.picker.port}")
    body = orjson.dumps(
        {"text": "hello there", "rid": "c", "stream": stream,
         "sampling_params": {"max_new_tokens": 3}}
    )  # fmt: skip
    try:
        result = await client.exchange("/generate", body)
    finally:
        await client.close()
    assert result.status == 200
    ours = orjson.loads(result.request_body)["rid"]
    assert ours != "c"
    assert len(ours) == 32
    if stream:
        events = [
            orjson.loads(line[5:])
            for line in result.body.split(b"\n\n")
            if line.startswith(b"data:") and line.strip() != b"data: [DONE]"
        ]
        ids = {event["meta_info"]["id"] for event in events}
    else:
        ids = {orjson.loads(result.body)["meta_info"]["id"]}
    assert ids == {"c"}
    assert ours.encode() not in result.body
    await eventually_async(lambda: settled(router), what="the request accounted for")


FLOOD_BUDGET_MIB = 32
MEMORY_ROOM = 100 * 1000 * 1000
"""What a flood may add to the router's RSS beyond its buffer budget (issue 57)."""


async def test_a_flood_of_large_header_messages_stays_within_the_buffer_budget() -> None:
    """100 streams each sending one 1.9 MB headers message (under --picker-max-message-bytes,
    over the 60 KiB header cap) to a router process with a 32 MiB buffer budget: every one
    is refused, the HTTP port answers meanwhile, and the router's peak RSS grows by at most
    the budget + 100 MB (it held every refused message, 200+ MiB, before)."""
    floods = load_bench_script("picker_floods")
    port, picker = floods.free_port(), floods.free_port()
    router = floods.start_router(port, picker, None, FLOOD_BUDGET_MIB)
    try:
        at_rest = floods.memory_bytes(router.pid, "VmRSS")
        ended, answered = await asyncio.gather(
            floods.stream_flood(picker, 100, 1900), asyncio.to_thread(floods.answers, port)
        )
        peak = floods.memory_bytes(router.pid, "VmHWM")
    finally:
        router.terminate()
        router.wait(30)
    assert ended == {"RESOURCE_EXHAUSTED": 100}
    assert answered == "yes"
    growth = peak - at_rest
    assert growth <= (FLOOD_BUDGET_MIB << 20) + MEMORY_ROOM, f"router RSS +{growth >> 20} MiB"
