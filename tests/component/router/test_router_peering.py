"""Router replicas peering over real ZMQ on loopback (``--peer-port``, ``--peer``), in front of
engine twins: a decision made on one replica shows in the others' load views and predictions,
a peer that dies has its requests dropped at once, and a message no router could have sent is
counted and skipped."""

from __future__ import annotations

import asyncio
import functools
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pytest
import zmq
from prometheus_client import CollectorRegistry

from tests.component.router.router_fleet import ENTRY, EngineTwin, RouterProcess, start_engines
from tests.component.router.test_router_replicas import (
    LONG_ANSWER_TOKENS,
    PAGE,
    complete,
    get_json,
    routable,
    series_sum,
)
from tests.fakes import FakeWorker
from tests.waiting import eventually, eventually_async
from tpuserve.cluster.ports import free_port, free_port_pair
from tpuserve_router.metrics import RouterMetrics, create_router_metrics
from tpuserve_router.peering.peer_view import PeerView
from tpuserve_router.peering.peers import PeerNetwork, resolve_addresses
from tpuserve_router.policies import make_policy
from tpuserve_router.policies.base import Decision

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


async def requests_heard(
    session: aiohttp.ClientSession, first: RouterProcess, second: RouterProcess, count: int
) -> list[asyncio.Future[dict[str, Any]]]:
    """``count`` long requests in flight at ``first``, once ``second`` heard of them all."""
    busy = long_requests(session, first, [f"long answer {i}" for i in range(count)])
    await eventually_async(
        lambda: sum(announced(second).values()) == count, what=f"the first's {count} requests",
        timeout_seconds=10, context=second.log,
    )  # fmt: skip
    return busy


def dns_network(
    host: str,
    port: int,
    addresses: Callable[[str, int], Awaitable[list[str]]] = resolve_addresses,
    workers: dict[str, FakeWorker] | None = None,
    metrics: RouterMetrics | None = None,
) -> PeerNetwork:
    """One replica's peering, following the name ``peers.test`` (resolved by ``addresses``)."""
    known = {} if workers is None else workers
    view = PeerView(
        f"router-{host}", make_policy("precise"), known.get, clock=time.monotonic,
        max_open_per_peer=16, open_ttl_seconds=60.0,
    )  # fmt: skip
    return PeerNetwork(
        view, metrics or create_router_metrics(CollectorRegistry()), host=host, port=port,
        dns_name="peers.test", refresh_seconds=3600, addresses=addresses,
    )  # fmt: skip


def peers_connected(router: RouterProcess, least: int) -> bool:
    return series_sum(router, "tpuserve_router_peers") >= least


def peering_routers(engines: list[EngineTwin], count: int, *extra: str) -> list[RouterProcess]:
    """``count`` routers, each publishing on its own port and subscribed to every router's
    port, its own included (it must ignore itself)."""
    ports = [free_port_pair() for _ in range(count)]
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


@pytest.fixture
def trio(blind_engines: list[EngineTwin]) -> Iterator[list[RouterProcess]]:
    """Three peering routers in front of the blind engines."""
    routers = peering_routers(blind_engines, 3)
    yield routers
    for router in routers:
        router.stop()


async def test_a_decision_on_one_replica_shows_in_the_others_load_and_predictions(
    trio: list[RouterProcess],
) -> None:
    first, second, third = trio
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
                series_sum(second, "tpuserve_router_routing_decisions_total", outcome="prefix_hit")
                == 1
            )
            assert series_sum(second, "tpuserve_router_requests_total", worker=busiest) == 1
        finally:
            await asyncio.gather(*busy)
    await eventually_async(
        lambda: not any(announced(second).values()) and not any(announced(third).values()),
        what="the peers' counts back to zero once the requests ended",
    )
    for kind in ("route", "end"):
        assert series_sum(second, "tpuserve_router_peer_messages_total", kind=kind) >= 4


async def test_a_killed_peers_requests_vanish_from_the_others(trio: list[RouterProcess]) -> None:
    first, second, _third = trio
    async with aiohttp.ClientSession() as session:
        busy = await requests_heard(session, first, second, 3)
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


async def test_a_hung_peer_is_disconnected_by_heartbeats(trio: list[RouterProcess]) -> None:
    """A stopped process keeps its TCP connections open; the heartbeats tell it from a live
    one, so its requests drop and nothing more queues for it."""
    first, second, third = trio
    async with aiohttp.ClientSession() as session:
        busy = await requests_heard(session, first, second, 2)
        assert first.proc is not None
        first.proc.send_signal(signal.SIGSTOP)
        try:
            await eventually_async(
                lambda: series_sum(second, "tpuserve_router_peers") == 1
                and series_sum(third, "tpuserve_router_peers") == 1
                and sum(announced(second).values()) == 0,
                what="the stopped peer disconnected, its requests dropped",
                timeout_seconds=30, context=second.log,
            )  # fmt: skip
        finally:
            first.proc.send_signal(signal.SIGCONT)
        await eventually_async(
            lambda: series_sum(second, "tpuserve_router_peers") == 2,
            what="the peer back once it runs again", timeout_seconds=30, context=second.log,
        )  # fmt: skip
        await asyncio.gather(*busy, return_exceptions=True)


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


def peer_gauge_is(metrics: RouterMetrics, count: int) -> bool:
    return metrics.peers.labels().value == count


async def test_peers_from_dns_follow_the_names_addresses() -> None:
    """Three replicas on one port at three loopback addresses, each resolving one name (a
    headless Service) to all three, itself included; an address the name stops returning is
    unsubscribed and its peer's requests dropped; a failed lookup keeps the peers known."""
    port = free_port()
    hosts = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    answer = list(hosts)

    async def addresses(name: str, _port: int) -> list[str]:
        if not answer:
            raise OSError(f"{name}: no such name")
        return list(answer)

    replicas: list[tuple[PeerNetwork, dict[str, FakeWorker], RouterMetrics]] = []
    for host in hosts:
        workers = {"w": FakeWorker("w")}
        metrics = create_router_metrics(CollectorRegistry())
        network = dns_network(host, port, addresses, workers, metrics)
        await network.start()
        replicas.append((network, workers, metrics))
    try:
        for _, _, metrics in replicas:
            await eventually_async(functools.partial(peer_gauge_is, metrics, 2), what="2 peers")
        first, second, third = (network for network, _, _ in replicas)
        workers_of_second = replicas[1][1]
        decision: Decision[FakeWorker] = Decision(
            FakeWorker("w"), "miss", pending_units=32, block_keys=[11, 12]
        )

        def heard() -> bool:  # sent again until heard: a new subscription misses the first
            first.link.routed(decision)
            return second.view.open_requests() > 0

        await eventually_async(heard, what="the second replica hearing the first's decision")
        assert workers_of_second["w"].announced_in_flight == second.view.open_requests() > 0
        answer.clear()  # the name fails to resolve: nothing changes
        await second.resolve()
        assert len(second.subscriptions) == 3
        answer.extend(hosts[1:])  # the first replica is gone from the Service
        await second.resolve()
        assert set(second.subscriptions) == {f"tcp://{h}:{port}" for h in hosts[1:]}
        assert second.view.open_requests() == 0
        assert workers_of_second["w"].in_flight == 0
        assert peer_gauge_is(replicas[1][2], 1)
        assert third.view.open_requests() > 0  # the third still follows the first
    finally:
        for network, _, _ in replicas:
            await network.stop()


@pytest.mark.parametrize(
    ("host", "answer", "followed"),
    [
        ("127.0.0.1", ["127.0.0.1", "::1"], "tcp://127.0.0.1:{port}"),
        ("::1", ["127.0.0.1", "::1"], "tcp://[::1]:{port}"),
        ("::", ["127.0.0.1"], "tcp://127.0.0.1:{port}"),  # no AAAA record: the A one
    ],
)
async def test_a_dual_stack_name_is_followed_once_per_peer(
    host: str, answer: list[str], followed: str
) -> None:
    """A name with A and AAAA records for the same peers: only --host's family is followed."""
    port = free_port()

    async def addresses(_name: str, _port: int) -> list[str]:
        return list(answer)

    network = dns_network(host, port, addresses)
    await network.start()
    try:
        assert set(network.subscriptions) == {followed.format(port=port)}
    finally:
        await network.stop()


@pytest.mark.parametrize(
    ("host", "answer", "warned"),
    [
        ("127.0.0.1", ["127.0.0.1", "10.0.0.7"], True),  # a peer elsewhere cannot reach us
        ("127.0.0.1", ["127.0.0.1", "127.244.0.7"], False),  # local pods: loopback addresses
        ("0.0.0.0", ["10.0.0.7"], False),
    ],
)  # fmt: skip
def test_a_loopback_host_with_peers_on_other_hosts_is_warned_once(
    host: str, answer: list[str], warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """--peers-from-dns with a loopback --host: warned about once the name resolves to peers
    that could not reach it (the addresses are checked, never dialled here)."""
    network = dns_network(host, free_port())
    try:
        for _ in range(2):
            network._warn_if_unreachable("peers.test", answer)
    finally:
        network.context.term()
    warnings = [r for r in caplog.records if "cannot reach" in r.getMessage()]
    assert len(warnings) == (1 if warned else 0), [r.getMessage() for r in warnings]


@pytest.mark.parametrize(
    ("offset", "kind", "message"),
    [
        (0, zmq.PUB, "--peer-port {port}: cannot publish on tcp://127.0.0.1:{port}"),
        (1, zmq.ROUTER, "--peer-port {port}: cannot answer KV snapshots on tcp://127.0.0.1:{taken}"),
    ],
    ids=["peer port", "snapshot port"],
)  # fmt: skip
def test_a_peer_port_in_use_stops_the_start_with_a_clear_message(
    offset: int, kind: int, message: str
) -> None:
    """The peer port, or the one after it where the router answers KV snapshots."""
    port = free_port_pair()
    context = zmq.Context()
    taken = context.socket(kind)
    taken.bind(f"tcp://127.0.0.1:{port + offset}")
    try:
        done = subprocess.run(
            [sys.executable, "-c", ENTRY, "router", "--port", "0", "--peer-port", str(port)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        taken.close(linger=0)
        context.term()
    assert done.returncode == 1
    assert message.format(port=port, taken=port + offset) in done.stderr
    assert "Traceback" not in done.stderr
