"""Affinity that survives failure (issue 68 item 3), against engine twins on loopback: a killed
engine's conversations go to the same successor on every replica and stay there, a restarted
engine takes new conversations again, a late replica routes like its peer, and replicas
installed together are ready without waiting for each other.

Each twin answers with its own ``system_fingerprint`` (``--system-fingerprint``), so a test
reads which engine served a request from the answer itself, as a client would."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import aiohttp
import pytest

from tests.component.router.router_fleet import (
    EngineTwin,
    RouterProcess,
    start_router,
    wait_caught_up,
)
from tests.waiting import eventually, eventually_async
from tpuserve.cluster.ports import free_port_pair
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig
from tpuserve_router.peering.peer_snapshot import NOT_UP_REFUSED
from tpuserve_router.policies.precise import PrecisePolicy

pytestmark = pytest.mark.component

MODEL = "m"
PAGE = 16
SYSTEM = "You are the support assistant of a large company; answer briefly and politely. " * 6


def twins(count: int, *extra: str) -> list[EngineTwin]:
    engines: list[EngineTwin] = []
    try:
        for i in range(count):
            args = ["--page-size", str(PAGE), "--served-model-name", MODEL, "--seed", "3",
                    "--system-fingerprint", f"e{i}", *extra]  # fmt: skip
            engines.append(EngineTwin(args).start())
    except BaseException:
        for engine in engines:
            engine.kill()
        raise
    return engines


@pytest.fixture
def engines() -> Iterator[list[EngineTwin]]:
    fleet = twins(3)
    yield fleet
    for engine in fleet:
        engine.stop()


def history(i: int) -> str:
    return f"Conversation {i}. " + f"What conversation {i} said so far, line by line. " * 24


async def complete(
    session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int = 8, **extra: Any
) -> tuple[str, str]:
    """(the engine that answered, the text) of a greedy completion through ``url``."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    async with session.post(url + "/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        answer = await response.json()
    return str(answer["system_fingerprint"]), str(answer["choices"][0]["text"])


def precise(app: RouterApp) -> PrecisePolicy:
    assert isinstance(app.policy, PrecisePolicy)
    return app.policy


def indexed(app: RouterApp, blocks: int) -> Callable[[], bool]:
    return lambda: precise(app).block_index.confirmed_blocks >= blocks


def lost(app: RouterApp, url: str) -> Callable[[], bool]:
    """Whether ``app`` remembers a lost stream and has ejected ``url`` (only it)."""
    return lambda: (
        precise(app).successors.active
        and all(w.healthy != (w.name == url) for w in app.registry.workers)
    )


@pytest.fixture
async def replicas(engines: list[EngineTwin]) -> AsyncIterator[list[RouterApp]]:
    """Two replicas that do not peer: each decides from the engines' KV events alone."""
    config = RouterConfig(
        workers=tuple(e.url for e in engines), health_check_interval_seconds=0.2,
        policy_params={"page_size": str(PAGE)},
    )  # fmt: skip
    apps: list[RouterApp] = []
    try:
        for _ in range(2):
            apps.append(await start_router(config, ready_workers=len(engines)))
            await wait_caught_up(apps[-1], [e.url for e in engines])
        yield apps
    finally:
        for app in apps:
            await app.stop()


async def test_a_killed_engines_conversations_go_to_the_same_successor_on_every_replica(
    engines: list[EngineTwin], replicas: list[RouterApp]
) -> None:
    first, second = replicas
    async with aiohttp.ClientSession() as session:
        held: dict[int, str] = {}
        for i in range(12):  # one at a time: they spread over the engines
            held[i], _ = await complete(session, first.base_url, history(i))
        wanted = precise(first).block_index.confirmed_blocks
        assert wanted > 0
        for app in replicas:
            await eventually_async(
                indexed(app, wanted), what="each replica indexing the conversations"
            )
        victim = max(set(held.values()), key=list(held.values()).count)
        orphans = [i for i, engine in held.items() if engine == victim]
        assert len(orphans) >= 2, held
        engines[int(victim[1:])].kill()
        for app in replicas:
            await eventually_async(
                lost(app, engines[int(victim[1:])].url), what="each replica seeing the engine lost"
            )
        await complete(session, second.base_url, "an unrelated new prompt " * 20)  # cursors differ
        # the next turn of each lost conversation through both replicas at once: neither has
        # seen the other's decision (no peering, no KV event yet)
        turns = await asyncio.gather(*(
            complete(session, app.base_url, history(i) + f" Question {tag}?")
            for i in orphans for app, tag in ((first, "A"), (second, "B"))
        ))  # fmt: skip
        successors = dict(zip(orphans, [turns[2 * k][0] for k in range(len(orphans))], strict=True))
        for k, i in enumerate(orphans):
            assert turns[2 * k][0] == turns[2 * k + 1][0], (i, turns[2 * k], turns[2 * k + 1])
        assert victim not in successors.values()
        assert sum(precise(app).successors.chosen for app in replicas) >= 2 * len(orphans)
        # later turns stay on the successor, whichever replica they reach
        for i in orphans:
            text = history(i) + " Question A?"
            for app in (second, first):
                engine, answer = await complete(session, app.base_url, text)
                assert engine == successors[i], (i, engine, successors[i])
                text += answer + " And another question?"


async def test_a_restarted_engine_takes_new_conversations_again_under_load() -> None:
    """Every new conversation starts with the same system prompt, which only the surviving
    engine holds after the restart: before, each was a prefix hit there (the restarted engine
    got none of them, issue 68); the bounded-load rule for shared prefixes sends the ones its
    holder is too busy for to the restarted engine."""
    engines = twins(2)
    app: RouterApp | None = None
    try:
        config = RouterConfig(
            workers=tuple(e.url for e in engines), health_check_interval_seconds=0.2,
            policy_params={"page_size": str(PAGE)},
        )  # fmt: skip
        app = await start_router(config, ready_workers=2)
        await wait_caught_up(app, [e.url for e in engines])
        engines[1].kill()
        await eventually_async(
            lambda: not next(w for w in app.registry.workers if w.name == engines[1].url).healthy,
            what="the router ejecting the killed engine",
        )
        async with aiohttp.ClientSession() as session:
            for i in range(4):
                engine, _ = await complete(session, app.base_url, SYSTEM + f"Hello {i}?")
                assert engine == "e0"
            await asyncio.to_thread(engines[1].start)
            await eventually_async(
                lambda: all(w.healthy for w in app.registry.workers),
                what="the restarted engine routable again",
            )
            await wait_caught_up(app, [engines[1].url])
            served = await asyncio.gather(*(
                complete(session, app.base_url, SYSTEM + f"A new question {i}?", max_tokens=64,
                         ignore_eos=True)
                for i in range(16)
            ))  # fmt: skip
        on_restarted = sum(1 for engine, _ in served if engine == "e1")
        assert on_restarted >= 4, [engine for engine, _ in served]  # a fair share is 8
        shared = precise(app).shared
        assert shared is not None
        assert shared.spread >= 1  # then the restarted engine holds the prefix too
    finally:
        if app is not None:
            await app.stop()
        for twin in engines:
            twin.stop()


def router_process(engines: list[EngineTwin], peer_port: int, peers: list[int]) -> RouterProcess:
    args = ["--policy", "precise", "--health-check-interval", "0.2", "--log-level", "info",
            "--policy-param", f"page_size={PAGE}", "--peer-port", str(peer_port)]  # fmt: skip
    for port in peers:
        args += ["--peer", f"tcp://127.0.0.1:{port}"]
    for engine in engines:
        args += ["--worker", engine.url]
    return RouterProcess(args)


def routable(router: RouterProcess, count: int) -> bool:
    with urllib.request.urlopen(router.url + "/workers", timeout=5) as response:
        workers = json.loads(response.read())["workers"]
    return sum(1 for w in workers if w["healthy"] and w["models"]) >= count


async def test_a_late_replica_routes_like_its_peer() -> None:
    """Replay buffers of two batches: a late replica learns the conversations only from its
    peer's snapshot, and then sends each next turn where the peer sent the conversation."""
    engines = twins(3, "--kv-events-buffer-steps", "2")
    routers: list[RouterProcess] = []
    try:
        early_port, late_port = free_port_pair(), free_port_pair()
        routers.append(router_process(engines, early_port, []).start())
        eventually(lambda: routable(routers[0], 3), what="the early replica routable")
        async with aiohttp.ClientSession() as session:
            held = {}
            for i in range(9):
                held[i], _ = await complete(session, routers[0].url, history(i))
            assert len(set(held.values())) == 3  # spread: where each went says something
            await asyncio.sleep(1.0)  # the last KV events reach the early replica
            routers.append(router_process(engines, late_port, [early_port]).start())
            eventually(lambda: routable(routers[1], 3), what="the late replica routable")
            assert "KV snapshot from tcp://" in routers[1].log()
            for i in range(9):
                engine, _ = await complete(session, routers[1].url, history(i) + " Next?")
                assert engine == held[i], (i, engine, held[i])
    finally:
        for router in routers:
            router.stop()
        for twin in engines:
            twin.stop()


def ready(router: RouterProcess) -> Callable[[], bool]:
    return lambda: routable(router, 3)


WAITED = re.compile(r"took no connection within|no answer within")


async def test_three_replicas_installed_together_do_not_wait_for_each_other(
    engines: list[EngineTwin],
) -> None:
    """Started at once, each replica asks the two others for a snapshot while they start
    too: each peer is answered for at once (its port refused the connection, or it has no
    snapshot yet, or it gave one), never by waiting out the connect bound or the snapshot
    timeout, and all three become routable."""
    ports = [free_port_pair() for _ in range(3)]
    routers = [router_process(engines, port, [p for p in ports if p != port]) for port in ports]
    try:
        await asyncio.gather(*(asyncio.to_thread(router.start) for router in routers))
        for router in routers:
            eventually(ready(router), what="routable", context=router.log)
        for router, port in zip(routers, ports, strict=True):
            log = router.log()
            assert not WAITED.search(log), log
            if re.search(r"KV snapshot from tcp://\S+: \d+ event streams", log):
                continue  # it took a peer's snapshot: the others were not asked to the end
            for peer in (p for p in ports if p != port):
                endpoint = f"tcp://127.0.0.1:{peer + 1}"
                answered = (
                    f"no KV snapshot from {endpoint}: {NOT_UP_REFUSED}" in log
                    or f"no KV snapshot from {endpoint}: it has none yet" in log
                    or f"KV snapshot from {endpoint}:" in log
                )
                assert answered, (endpoint, log)
    finally:
        for router in routers:
            router.stop()
