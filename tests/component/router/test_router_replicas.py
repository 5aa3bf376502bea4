"""Router replicas as processes in front of the same engine twins: a replica started late
learns what the engines hold from their KV-event replay, and every replica's load view
converges on the engines' real load (its own requests plus the others', from /v1/loads)."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.component.router.router_fleet import (
    MODEL,
    EngineTwin,
    RouterProcess,
    start_engines,
)
from tests.waiting import eventually, eventually_async

pytestmark = pytest.mark.component

PAGE = 16
LONG_ANSWER_TOKENS = 400  # at the twin's modelled speed, seconds in flight


@pytest.fixture
def engines() -> Iterator[list[EngineTwin]]:
    fleet = start_engines(2, ["--page-size", str(PAGE)])
    yield fleet
    for engine in fleet:
        engine.stop()


def router_args(engines: list[EngineTwin]) -> list[str]:
    args = ["--policy", "precise", "--health-check-interval", "0.2"]
    for engine in engines:
        args += ["--worker", engine.url]
    return args


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def confirmed_blocks(router: RouterProcess) -> int:
    with urllib.request.urlopen(router.url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "tpuserve_router_prefix_index_size":
            for s in family.samples:
                if s.labels.get("kind") == "confirmed_blocks":
                    return int(s.value)
    return 0


def routable(router: RouterProcess, count: int) -> bool:
    workers = get_json(router.url + "/workers")["workers"]
    return sum(1 for w in workers if w["healthy"] and w["models"]) >= count


def loads_by_worker(router: RouterProcess) -> dict[str, tuple[int, int]]:
    """Per worker: (requests this router sent, requests the others sent as of its last poll)."""
    workers = get_json(router.url + "/workers")["workers"]
    return {w["url"]: (w["in_flight"], w["peer_in_flight"]) for w in workers}


async def complete(
    session: aiohttp.ClientSession, router: RouterProcess, prompt: str, max_tokens: int
) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    async with session.post(router.url + "/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = await response.json()
        return answer


def start_routers(engines: list[EngineTwin], count: int) -> list[RouterProcess]:
    routers: list[RouterProcess] = []
    try:
        for _ in range(count):
            routers.append(RouterProcess(router_args(engines)).start())
            eventually(lambda: routable(routers[-1], len(engines)), what="routable workers",
                       timeout_seconds=20, context=routers[-1].log)  # fmt: skip
    except BaseException:
        for router in routers:
            router.stop()
        raise
    return routers


async def test_a_late_replica_learns_the_engines_blocks_from_their_replay(
    engines: list[EngineTwin],
) -> None:
    (early,) = start_routers(engines, 1)
    try:
        async with aiohttp.ClientSession() as session:
            prompts = [f"conversation {i}: " + f"the shared history of turn {i}. " * 30
                       for i in range(12)]  # fmt: skip
            await asyncio.gather(*(complete(session, early, p, 8) for p in prompts))
        held = await eventually_async(
            lambda: confirmed_blocks(early) or None, what="blocks in the early router's index"
        )
        assert held >= 12 * 10  # each prompt is hundreds of tokens: many pages each
        (late,) = start_routers(engines, 1)
        try:
            await eventually_async(
                lambda: confirmed_blocks(late) == confirmed_blocks(early),
                what="the late router's index holding what the early one holds",
                context=late.log,
            )
            assert confirmed_blocks(late) >= held
        finally:
            late.stop()
    finally:
        early.stop()


async def test_each_replica_sees_the_requests_the_other_sent(engines: list[EngineTwin]) -> None:
    first, second = start_routers(engines, 2)
    try:
        async with aiohttp.ClientSession() as session:
            busy = [
                asyncio.ensure_future(
                    complete(session, first, f"long answer {i}", LONG_ANSWER_TOKENS)
                )
                for i in range(6)
            ]
            try:

                def second_sees_all() -> bool:
                    own = sum(o for o, _ in loads_by_worker(first).values())
                    peers = sum(p for _, p in loads_by_worker(second).values())
                    return own == 6 and peers == 6

                await eventually_async(
                    second_sees_all, what="the second router seeing the first's 6 requests",
                    timeout_seconds=10, context=second.log,
                )  # fmt: skip
                # per worker, too: the second router's view of each worker is the first's count
                ours = loads_by_worker(first)
                theirs = loads_by_worker(second)
                assert {u: o for u, (o, _) in ours.items()} == {
                    u: p for u, (_, p) in theirs.items()
                }
                assert all(own == 0 for own, _ in theirs.values())
            finally:
                await asyncio.gather(*busy)
        await eventually_async(
            lambda: all(p == 0 for _, p in loads_by_worker(second).values()),
            what="the second router's view back to zero once the requests ended",
        )
    finally:
        first.stop()
        second.stop()
