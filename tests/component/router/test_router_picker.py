"""The router as an endpoint picker (``--picker-port``): a client built from Envoy's published
protos (xds-protos) plays the gateway on loopback, in front of engine twins.

The cases follow the Endpoint Picker protocol (GIE docs/proposals/004) and the conformance
suite's tests that concern the picker: `GatewayFollowingEPPRouting` (the
``test-epp-endpoint-selection`` header narrows the choice to one, two or all pods, by
address), `...WithDataParallelism` (by ``ip:port``), `GatewayDestinationEndpointServed` (the
served endpoint is echoed in ``x-conformance-test-served-endpoint``); the rest of the suite
tests the gateway and the InferencePool's status, not the picker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import openai
import orjson
import pytest

from tests.component.router.gateway_emulator import GatewayFront, PickerClient
from tests.component.router.router_fleet import MODEL, EngineTwin, sample, start_router, wait_ready
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig
from tpuserve_router.front import picker as epp
from tpuserve_router.front import picker_protocol as protocol

pytestmark = pytest.mark.component

SYSTEM = "You are a meticulous assistant for the tpuserve project, routed by its picker. " * 10


def completion(prompt: str, **extra: object) -> bytes:
    return orjson.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 4, **extra})


def endpoint(engine: EngineTwin) -> str:
    return f"127.0.0.1:{engine.port}"


@pytest.fixture
async def picker(engines: list[EngineTwin]) -> AsyncIterator[RouterApp]:
    config = RouterConfig(
        workers=tuple(e.url for e in engines),
        policy="cache_aware",
        health_check_interval_seconds=0.5,
        picker_port=0,
        picker_test_headers=True,
        max_request_bytes=64 * 1024,
    )
    app = await start_router(config, ready_workers=len(engines))
    yield app
    await app.stop()


@pytest.fixture
async def gateway(picker: RouterApp) -> AsyncIterator[PickerClient]:
    assert picker.picker is not None
    client = PickerClient(f"127.0.0.1:{picker.picker.port}")
    yield client
    await client.close()


def settled(app: RouterApp) -> bool:
    picks = app.picker.share.count if app.picker is not None else 0
    return (
        picks == 0
        and app.pipeline.in_flight == 0
        and all(w.in_flight == 0 for w in app.registry.workers)
    )


async def test_the_destination_is_the_policys_choice_in_header_and_metadata(
    picker: RouterApp, gateway: PickerClient, engines: list[EngineTwin]
) -> None:
    body = completion(SYSTEM + "first")
    first = await gateway.exchange("/v1/completions", body)
    assert first.status == 200
    assert first.cleared_route_cache
    assert first.header_destination == first.metadata_destination  # identical, as required
    endpoints = first.endpoints
    assert len(endpoints) == 1 + picker.config.max_retries  # the chosen one, then fallbacks
    assert len(set(endpoints)) == len(endpoints)
    assert set(endpoints) <= {endpoint(e) for e in engines}
    forwarded = orjson.loads(first.request_body)  # passed on whole, with the router's own rid
    assert len(forwarded.pop("rid")) == 32
    assert forwarded == orjson.loads(body)
    again = await gateway.exchange("/v1/completions", body)
    assert again.endpoints[0] == endpoints[0]  # the prefix stays where it is cached
    usage = orjson.loads(again.body)["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
    await eventually_async(lambda: settled(picker), what="every request accounted for")
    worker = f"http://{endpoints[0]}"
    labels = {"model": MODEL, "worker": worker, "route": "/v1/completions", "status": "200"}
    assert sample(picker, "tpuserve_router_requests_total", labels) == 2
    assert (
        sample(
            picker, "tpuserve_router_completion_tokens_total", {"model": MODEL, "worker": worker}
        )
        == 8
    )
    assert (
        sample(picker, "tpuserve_router_cached_tokens_total", {"model": MODEL, "worker": worker})
        > 0
    )
    await eventually_async(lambda: settled(picker), what="every request accounted for")


async def test_openai_client_through_the_gateway_streamed_and_not(
    picker: RouterApp, gateway: PickerClient
) -> None:
    front = GatewayFront(gateway)
    url = await front.start()
    try:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused") as oa:
            whole = await oa.completions.create(model=MODEL, prompt=SYSTEM + "x", max_tokens=6)
            stream = await oa.chat.completions.create(
                model=MODEL,
                messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
                max_tokens=6,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
    finally:
        await front.stop()
    assert whole.choices[0].text
    assert whole.usage is not None
    assert whole.usage.completion_tokens == 6
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    route = {"route": "/v1/chat/completions", "status": "200", "model": MODEL}
    total = sum(
        sample(picker, "tpuserve_router_requests_total", {**route, "worker": w.name})
        for w in picker.registry.workers
    )
    assert total == 1
    await eventually_async(lambda: settled(picker), what="every request accounted for")


async def test_the_subset_hint_limits_the_choice(
    gateway: PickerClient, engines: list[EngineTwin]
) -> None:
    for engine in engines:  # as a list, and as one comma-separated string
        chosen = await gateway.exchange(
            "/v1/completions", completion(SYSTEM), subset=[endpoint(engine)]
        )
        assert chosen.endpoints == [endpoint(engine)]
    pair = f"{endpoint(engines[0])},{endpoint(engines[1])}"
    chosen = await gateway.exchange("/v1/completions", completion(SYSTEM), subset=pair)
    assert set(chosen.endpoints) == {endpoint(engines[0]), endpoint(engines[1])}
    for subset in (["10.9.9.9:8000"], []):  # nothing eligible: 503, never another endpoint
        refused = await gateway.exchange("/v1/completions", completion(SYSTEM), subset=subset)
        assert refused.status == 503
        assert b"none of the endpoints" in refused.body


@pytest.mark.parametrize("by_port", [False, True], ids=["by_address", "by_ip_port"])
async def test_the_conformance_selection_header_steers_and_the_served_endpoint_is_echoed(
    gateway: PickerClient, engines: list[EngineTwin], by_port: bool
) -> None:
    """GatewayFollowingEPPRouting (the twins share 127.0.0.1, so by address all are allowed),
    ...WithDataParallelism (ip:port), GatewayDestinationEndpointServed."""
    wanted = [endpoint(e) for e in engines[:2]] if by_port else ["127.0.0.1"]
    for _ in range(4):
        result = await gateway.exchange(
            "/v1/completions",
            completion("short"),
            headers={protocol.TEST_SELECTION_HEADER: ",".join(wanted)},
        )
        assert result.status == 200
        if by_port:
            assert set(result.endpoints) <= set(wanted)
        assert result.headers[protocol.TEST_SERVED_HEADER] == result.endpoints[0]


async def test_a_fallback_that_served_takes_the_accounting(
    picker: RouterApp, gateway: PickerClient
) -> None:
    call, decided = await gateway.open("/v1/completions", completion(SYSTEM + "fallback"))
    primary, fallback = decided.endpoints[:2]
    by_endpoint = {protocol.endpoint_of(w): w for w in picker.registry.workers}
    assert by_endpoint[primary].in_flight == 1  # booked on the choice
    chunks = [
        piece
        async for piece in gateway.relay(
            call, decided, fallback, "/v1/completions", "POST", decided.request_body
        )
    ]
    assert decided.headers[protocol.TEST_SERVED_HEADER] == fallback
    assert orjson.loads(b"".join(chunks))["usage"]["completion_tokens"] == 4
    # the stream's end is accounted for after its last chunk went out
    await eventually_async(lambda: settled(picker), what="every request accounted for")
    labels = {"model": MODEL, "route": "/v1/completions", "status": "200"}
    assert (
        sample(picker, "tpuserve_router_requests_total", {**labels, "worker": f"http://{fallback}"})
        == 1
    )
    assert (
        sample(picker, "tpuserve_router_requests_total", {**labels, "worker": f"http://{primary}"})
        == 0
    )
    await eventually_async(lambda: settled(picker), what="every request accounted for")


async def test_refusals_are_immediate_responses_naming_the_problem(
    picker: RouterApp, gateway: PickerClient
) -> None:
    bad = await gateway.exchange("/v1/completions", b"{not json")
    assert bad.status == 400
    unknown = await gateway.exchange(
        "/v1/completions", orjson.dumps({"model": "nope", "prompt": "x"})
    )
    assert unknown.status == 404
    assert MODEL in orjson.loads(unknown.body)["error"]["message"]  # lists the served ones
    too_big = await gateway.exchange("/v1/completions", completion("x" * 70_000))
    assert too_big.status == 413
    assert b"--max-request-bytes" in too_big.body
    assert picker.picker is not None
    assert picker.picker.buffered == 0
    await eventually_async(lambda: settled(picker), what="every request accounted for")


async def test_at_max_in_flight_the_picker_sheds_with_429(engines: list[EngineTwin]) -> None:
    config = RouterConfig(
        workers=(engines[0].url,),
        policy="round_robin",
        picker_port=0,
        max_in_flight=1,
        health_check_interval_seconds=0.5,
    )
    app = await start_router(config)
    assert app.picker is not None
    client = PickerClient(f"127.0.0.1:{app.picker.port}")
    try:
        await wait_ready(app, 1)
        held, decided = await client.open("/v1/completions", completion("one"))
        assert decided.endpoints == [endpoint(engines[0])]
        shed = await client.exchange("/v1/completions", completion("two"))
        assert shed.status == 429
        held.cancel()  # the gateway gave up on the first: counted as 499, nothing left booked
        await eventually_async(lambda: settled(app), what="the cancelled stream released")
        assert (
            sample(
                app,
                "tpuserve_router_requests_total",
                {
                    "model": MODEL,
                    "worker": engines[0].url,
                    "route": "/v1/completions",
                    "status": "499",
                },
            )
            == 1
        )
    finally:
        await client.close()
        await app.stop()


async def test_other_paths_and_bodiless_requests_go_to_a_routable_worker(
    gateway: PickerClient, engines: list[EngineTwin]
) -> None:
    models = await gateway.exchange("/v1/models", b"", method="GET")
    assert models.status == 200
    assert models.endpoints[0] in {endpoint(e) for e in engines}
    assert orjson.loads(models.body)["data"][0]["id"] == MODEL


async def test_grpc_health_follows_the_routable_workers(
    gateway: PickerClient, engines: list[EngineTwin]
) -> None:
    for service in ("liveness", "readiness", epp.EXT_PROC_SERVICE, "inference-extension", ""):
        assert await gateway.check(service) == "SERVING"
    empty = await start_router(RouterConfig(picker_port=0))  # no worker at all
    assert empty.picker is not None
    client = PickerClient(f"127.0.0.1:{empty.picker.port}")
    try:
        assert await client.check("liveness") == "SERVING"
        assert await client.check("readiness") == "NOT_SERVING"
        refused = await client.exchange("/v1/completions", completion("x"))
        assert refused.status in (404, 503)
    finally:
        await client.close()
        await empty.stop()


async def test_with_tls_the_picker_serves_its_self_signed_certificate(
    engines: list[EngineTwin],
) -> None:
    config = RouterConfig(workers=(engines[0].url,), policy="round_robin", picker_port=0,
                          picker_tls=True, health_check_interval_seconds=0.5)  # fmt: skip
    app = await start_router(config)
    assert app.picker is not None
    assert app.picker.certificate is not None
    client = PickerClient(f"127.0.0.1:{app.picker.port}", app.picker.certificate)
    plain = PickerClient(f"127.0.0.1:{app.picker.port}")
    try:
        await wait_ready(app, 1)
        result = await client.exchange("/v1/completions", completion("over TLS"))
        assert result.status == 200
        assert result.endpoints == [endpoint(engines[0])]
        with pytest.raises(grpc.aio.AioRpcError):  # plaintext is not served there
            await plain.check("liveness")
    finally:
        await client.close()
        await plain.close()
        await app.stop()
