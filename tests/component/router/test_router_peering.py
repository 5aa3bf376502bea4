"""Router replicas peering over real ZMQ on loopback (``--peer-port``, ``--peer``), in front of
engine twins: a decision made on one replica shows in the others' load views and predictions,
a peer that dies has its requests dropped at once, and a message no router could have sent is
counted and skipped."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
import zmq

from tests.component.router.router_fleet import EngineTwin, RouterProcess, start_engines
from tests.component.router.test_router_replicas import (
    LONG_ANSWER_TOKENS,
    PAGE,
    complete,
    get_json,
    routable,
    series_sum,
)
from tests.waiting import eventually, eventually_async
from tpuserve.cluster.ports import free_port

pytestmark = pytest.mark.component


@pytest.fixture
def blind_engines() -> Iterator[list[EngineTwin]]:
    """Engines without KV events: a router's predictions are then all it knows of their
    caches (kept 120 s), so what a peer predicted stays visible."""
    fleet = start_engines(2, ["--page-size", str(PAGE)], kv_events=False)
    yield fleet
    for engine in fleet:
        engine.stop()


def announced(router: RouterProcess) -> dict[str, int]:
    """Per worker: the requests the router's peers announced and have not ended."""
    workers = get_json(router.url + "/workers")["workers"]
    return {w["url"]: w["announced_in_flight"] for w in workers}


def own(router: RouterProcess) -> dict[str, int]:
    workers = get_json(router.url + "/workers")["workers"]
    return {w["url"]: w["in_flight"] for w in workers}


def long_requests(
    session: aiohttp.ClientSession, router: RouterProcess, prompts: list[str]
) -> list[asyncio.Future[dict[str, Any]]]:
    """Requests in flight at ``router`` for seconds each (long answers), one per prompt."""
    return [
        asyncio.ensure_future(complete(session, router, prompt, LONG_ANSWER_TOKENS))
        for prompt in prompts
    ]


def peers_connected(router: RouterProcess, least: int) -> bool:
    return series_sum(router, "tpuserve_router_peers") >= least


def peering_routers(engines: list[EngineTwin], count: int, *extra: str) -> list[RouterProcess]:
    """``count`` routers, each publishing on its own port and subscribed to every router's
    port, its own included (it must ignore itself)."""
    ports = [free_port() for _ in range(count)]
    everyone = [arg for port in ports for arg in ("--peer", f"tcp://127.0.0.1:{port}")]
    routers: list[RouterProcess] = []
    try:
        for port in ports:
            args = ["--policy", "precise", "--health-check-interval", "0.2"]
            args += ["--load-poll-interval", "0", "--peer-port", str(port), *everyone, *extra]
            for engine in engines:
                args += ["--worker", engine.url]
            routers.append(RouterProcess(args).start())
        for router in routers:
            eventually(functools.partial(routable, router, len(engines)),
                       what="routable workers", timeout_seconds=20, context=router.log)  # fmt: skip
            eventually(
                functools.partial(peers_connected, router, count - 1),
                what=f"{count - 1} peers connected", timeout_seconds=20, context=router.log,
            )  # fmt: skip
    except BaseException:
        for router in routers:
            router.stop()
        raise
    return routers


async def test_a_decision_on_one_replica_shows_in_the_others_load_and_predictions(
    blind_engines: list[EngineTwin],
) -> None:
    first, second, third = peering_routers(blind_engines, 3)
    try:
        async with aiohttp.ClientSession() as session:
            prompt = "a long shared history the second replica never saw. " * 20
            busy = long_requests(session, first, [f"{prompt} question {i}" for i in range(4)])
            try:
                await eventually_async(
                    lambda: sum(own(first).values()) == 4
                    and announced(second) == own(first) == announced(third),
                    what="the others counting the first replica's 4 requests on its workers",
                    timeout_seconds=10, context=second.log,
                )  # fmt: skip
                # the first replica predicted the prompts' blocks, and so did its peers
                predicted = series_sum(
                    first, "tpuserve_router_prefix_index_size", kind="predicted_blocks"
                )
                assert predicted > 0
                assert (
                    series_sum(second, "tpuserve_router_prefix_index_size", kind="predicted_blocks")
                    == predicted
                )
                # so the second replica sends the same prefix where the first did, as a hit
                busiest = max(own(first).items(), key=lambda item: item[1])[0]
                await complete(session, second, f"{prompt} question 9", 4)
                assert (
                    series_sum(second, "tpuserve_router_routing_decisions_total",
                               outcome="prefix_hit") == 1
                )  # fmt: skip
                assert series_sum(second, "tpuserve_router_requests_total", worker=busiest) == 1
            finally:
                await asyncio.gather(*busy)
        await eventually_async(
            lambda: not any(announced(second).values()) and not any(announced(third).values()),
            what="the peers' counts back to zero once the requests ended",
        )
        for kind in ("route", "end"):
            assert series_sum(second, "tpuserve_router_peer_messages_total", kind=kind) >= 4
    finally:
        for router in (first, second, third):
            router.stop()


async def test_a_killed_peers_requests_vanish_from_the_others(
    blind_engines: list[EngineTwin],
) -> None:
    first, second, third = peering_routers(blind_engines, 3)
    try:
        async with aiohttp.ClientSession() as session:
            busy = long_requests(session, first, [f"long answer {i}" for i in range(3)])
            await eventually_async(
                lambda: sum(announced(second).values()) == 3, what="the first's 3 requests",
                timeout_seconds=10, context=second.log,
            )  # fmt: skip
            assert first.proc is not None
            first.proc.kill()  # no end message will ever come
            await eventually_async(
                lambda: sum(announced(second).values()) == 0
                and series_sum(second, "tpuserve_router_peers") == 1,
                what="the dead peer's requests dropped, one peer left",
                timeout_seconds=10, context=second.log,
            )  # fmt: skip
            assert "requests dropped" in second.log()
            await asyncio.gather(*busy, return_exceptions=True)
    finally:
        for router in (first, second, third):
            router.stop()


async def test_a_malformed_peer_message_is_counted_and_skipped(
    blind_engines: list[EngineTwin],
) -> None:
    rogue_port = free_port()
    context = zmq.Context()
    rogue = context.socket(zmq.PUB)
    rogue.bind(f"tcp://127.0.0.1:{rogue_port}")
    try:
        first, second = peering_routers(blind_engines, 2, "--peer", f"tcp://127.0.0.1:{rogue_port}")
        try:

            def rogue_heard() -> bool:
                rogue.send(b"\xc1 not msgpack")
                return series_sum(second, "tpuserve_router_peer_messages_total",
                                  kind="malformed") > 0  # fmt: skip

            await eventually_async(
                rogue_heard, what="the rogue message counted", context=second.log
            )
            async with aiohttp.ClientSession() as session:
                await complete(session, first, "still peering", 4)
            await eventually_async(
                lambda: series_sum(second, "tpuserve_router_peer_messages_total", kind="end") == 1,
                what="the first replica's request still heard", context=second.log,
            )  # fmt: skip
            assert "cannot read" in second.log()
        finally:
            first.stop()
            second.stop()
    finally:
        rogue.close(linger=0)
        context.term()
