"""A hung prefill in PD mode gets the liveness check the HTTP port has (issue 68 item 2):
a prefill engine that accepts connections and answers nothing, neither requests nor health
probes, fails each request's prefill leg at the time a stream of it would be given (floor and
prefill), and the request moves to a new pair without spending the retry budget, as a hung
worker's requests do on the HTTP port (`relay.liveness`; issue 57 item 8). Without it a
non-streamed request without ``max_tokens`` waited for the handoff timeout, then spent the
budget (here none is left: it would be answered 504). Real engine twins on loopback, the
hung one behind a real TCP front that stops answering (`HangingFront`); whole answers and
streams (a stream's first byte is given floor and prefill anyway: its retry is what the
check frees)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest

from tests.component.router.router_fleet import EngineTwin, sample, start_router
from tests.component.router.test_router_failing_workers import HangingFront
from tests.component.router.test_router_pd import LONG
from tpuserve.cluster.ports import free_port
from tpuserve_router.config import RouterConfig

pytestmark = pytest.mark.component

REQUESTS = 8


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[list[EngineTwin], EngineTwin]]:
    ports = [free_port(), free_port()]
    mode = ["--time-scale", "1", "--disaggregation-mode", "prefill"]
    prefill = [
        EngineTwin([*mode, "--disaggregation-bootstrap-port", str(port)], kv_events=False)
        for port in ports
    ]
    decode = EngineTwin(["--time-scale", "1", "--disaggregation-mode", "decode"], kv_events=False)
    try:
        for engine in (*prefill, decode):
            engine.start()
        yield prefill, decode
    finally:
        for engine in (*prefill, decode):
            engine.stop()


def bootstrap_port(twin: EngineTwin) -> int:
    args = list(twin.args)
    return int(args[args.index("--disaggregation-bootstrap-port") + 1])


@pytest.mark.parametrize("stream", [False, True])
async def test_a_hung_prefills_requests_move_at_its_floor_without_spending_the_retry_budget(
    engines: tuple[list[EngineTwin], EngineTwin], stream: bool
) -> None:
    prefill, decode = engines
    front = HangingFront(prefill[0].port)
    await front.start()
    config = RouterConfig(
        prefill=(
            f"{front.url} {bootstrap_port(prefill[0])}",
            f"{prefill[1].url} {bootstrap_port(prefill[1])}",
        ),
        decode=(decode.url,),
        policy="round_robin",
        pd_policy="always",
        pd_handoff_timeout_seconds=120,  # what a request without max_tokens waited before
        first_byte_timeout_floor_seconds=1.0,
        health_check_interval_seconds=0.3,
        health_check_timeout_seconds=0.3,
        health_failure_threshold=1000,  # probes fail, never eject: the liveness check acts
        outlier_consecutive_failures=1000,
        retry_budget_min=0,
        retry_budget_percent=0,  # a retry that spends the budget is refused
    )
    app = await start_router(config, ready_workers=3)
    hung = app.registry.get(front.url)
    assert hung is not None
    try:
        front.hang()  # probes and requests alike: a stopped engine
        # no max_tokens: a whole answer is given the cap, not the floor
        body = {"prompt": LONG, "temperature": 0, "stream": stream}
        async with aiohttp.ClientSession() as session:

            async def one() -> tuple[int, bytes]:
                async with session.post(app.base_url + "/v1/completions", json=body) as answer:
                    return answer.status, await answer.read()

            answers = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(REQUESTS))), 60)
        assert [status for status, _ in answers] == [200] * REQUESTS, answers
        assert not any(b'"error"' in answer for _, answer in answers)  # nor a stream's event
        assert hung.healthy  # never ejected: each request left it on its own
        timeouts = sample(
            app, "tpuserve_router_upstream_errors_total",
            {"worker": front.url, "reason": "first_byte_timeout"},
        )  # fmt: skip
        assert timeouts >= 1  # the round robin gave it some: each left at its floor
        failures = sample(
            app, "tpuserve_router_pd_failures_total", {"leg": "prefill", "kind": "timeout"}
        )
        assert failures == timeouts
        assert sample(app, "tpuserve_router_retries_over_budget_total") == 0
        retries = sample(app, "tpuserve_router_retries_total", {"route": "/v1/completions"})
        assert retries == timeouts
    finally:
        await app.stop()
        await front.stop()
