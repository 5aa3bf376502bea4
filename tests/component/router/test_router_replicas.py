"""Router replicas as processes in front of the same engine twins: a replica started late
learns what the engines hold from their KV-event replay, and every replica's load view
converges on the engines' real load (its own requests plus the others', from /v1/loads)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
from tpuserve.cluster.ports import free_port_pair
from tpuserve_router.peering.peer_snapshot import NOT_UP_REFUSED

pytestmark = pytest.mark.component

PAGE = 16
LONG_ANSWER_TOKENS = 400  # at the twin's modelled speed, seconds in flight


@pytest.fixture
def engines() -> Iterator[list[EngineTwin]]:
    fleet = start_engines(2, ["--page-size", str(PAGE)])
    yield fleet
    for engine in fleet:
        engine.stop()


@pytest.fixture
def forgetful_engines() -> Iterator[list[EngineTwin]]:
    """Engines whose replay buffers keep only the last few batches (they wrap at once)."""
    fleet = start_engines(2, ["--page-size", str(PAGE), "--kv-events-buffer-steps", "2"])
    yield fleet
    for engine in fleet:
        engine.stop()


def router_args(engines: list[EngineTwin], *extra: str) -> list[str]:
    args = ["--policy", "precise", "--health-check-interval", "0.2", *extra]
    for engine in engines:
        args += ["--worker", engine.url]
    return args


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def series_sum(router: RouterProcess, sample_name: str, **labels: str) -> float:
    """The sum of the samples named so on the router's /metrics that carry ``labels``."""
    with urllib.request.urlopen(router.url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def confirmed_blocks(router: RouterProcess) -> int:
    return int(series_sum(router, "tpuserve_router_prefix_index_size", kind="confirmed_blocks"))


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


def start_routers(engines: list[EngineTwin], count: int, *extra: str) -> list[RouterProcess]:
    routers: list[RouterProcess] = []
    try:
        for _ in range(count):
            routers.append(RouterProcess(router_args(engines, *extra)).start())
            eventually(lambda: routable(routers[-1], len(engines)), what="routable workers",
                       timeout_seconds=20, context=routers[-1].log)  # fmt: skip
    except BaseException:
        for router in routers:
            router.stop()
        raise
    return routers


async def fill_caches(router: RouterProcess) -> int:
    """Twelve conversations of many pages each through ``router``; the blocks its index holds."""
    async with aiohttp.ClientSession() as session:
        prompts = [
            f"conversation {i}: " + f"the shared history of turn {i}. " * 30 for i in range(12)
        ]
        for prompt in prompts:  # one at a time: a batch of KV events each, at least
            await complete(session, router, prompt, 8)
    held = await eventually_async(
        lambda: confirmed_blocks(router) or None,
        what="blocks in the early router's index",
        context=router.log,
    )
    assert held >= 12 * 10  # each prompt is hundreds of tokens: many pages each
    return held


async def holds_what_the_other_holds(late: RouterProcess, early: RouterProcess) -> None:
    await eventually_async(
        lambda: confirmed_blocks(late) == confirmed_blocks(early),
        what="the late router's index holding what the early one holds",
        context=late.log,
    )


async def test_a_late_replica_learns_the_engines_blocks_from_their_replay(
    engines: list[EngineTwin],
) -> None:
    (early,) = start_routers(engines, 1)
    try:
        held = await fill_caches(early)
        (late,) = start_routers(engines, 1)
        try:
            await holds_what_the_other_holds(late, early)
            assert confirmed_blocks(late) >= held
        finally:
            late.stop()
    finally:
        early.stop()


async def test_a_late_replica_starts_from_a_peers_snapshot_when_replay_is_not_enough(
    forgetful_engines: list[EngineTwin],
) -> None:
    engines = forgetful_engines
    (early,) = start_routers(engines, 1)
    try:
        held = await fill_caches(early)
        (blind,) = start_routers(engines, 1)
        try:  # replay alone: the last 2 batches, whose parents it never saw
            await eventually_async(
                lambda: series_sum(blind, "tpuserve_router_kv_event_replays_total", result="ok")
                >= len(engines),
                what="the blind router's replays", context=blind.log,
            )  # fmt: skip
            assert confirmed_blocks(blind) < held / 2
        finally:
            blind.stop()
        (late,) = start_routers(engines, 1, "--kv-snapshot-from", early.url)
        try:
            await holds_what_the_other_holds(late, early)
            assert "blocks from a peer router's snapshot" in late.log()
        finally:
            late.stop()
    finally:
        early.stop()


def starts_without_a_snapshot(engines: list[EngineTwin], source: str, logged: str) -> None:
    """A router given ``--kv-snapshot-from source`` logs ``logged`` and starts ready anyway."""
    (router,) = start_routers(engines, 1, "--kv-snapshot-from", source)
    try:
        assert logged in router.log()
        assert get_json(router.url + "/readiness")
    finally:
        router.stop()


def test_the_first_replica_starts_with_no_peer_to_take_a_snapshot_from(
    engines: list[EngineTwin],
) -> None:
    """--kv-snapshot-from a router Service with no ready pod yet (the first replica): the
    fetch fails and the router starts as usual."""
    with socket.socket() as probe:  # a loopback port nobody listens on once closed
        probe.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{probe.getsockname()[1]}"
    starts_without_a_snapshot(engines, nobody, f"no KV snapshot from {nobody}")


class UnreadableSnapshot(BaseHTTPRequestHandler):
    """A peer whose ``GET /kv_snapshot`` is msgpack no snapshot can be read from: a map keyed
    by an array (msgpack raises TypeError for it, not an unpack error)."""

    def do_GET(self) -> None:
        body = b"\x81\x91\x01\x01"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_snapshot_that_cannot_be_read_does_not_stop_the_start(
    engines: list[EngineTwin],
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), UnreadableSnapshot)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    peer = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        starts_without_a_snapshot(
            engines, peer, f"no KV snapshot from {peer}: not a msgpack snapshot"
        )
    finally:
        server.shutdown()
        server.server_close()


async def test_a_late_replica_takes_a_peers_snapshot_over_peering_with_no_key(
    forgetful_engines: list[EngineTwin],
) -> None:
    """Engines whose replay wraps at once: only the early replica's snapshot, asked on its
    peer port + 1, gives the late one what the engines hold."""
    engines = forgetful_engines
    early_port, late_port = free_port_pair(), free_port_pair()
    (early,) = start_routers(engines, 1, "--peer-port", str(early_port))
    try:
        held = await fill_caches(early)
        (late,) = start_routers(engines, 1, "--peer-port", str(late_port),
                                "--peer", f"tcp://127.0.0.1:{early_port}")  # fmt: skip
        try:
            await holds_what_the_other_holds(late, early)
            assert confirmed_blocks(late) >= held
            assert f"KV snapshot from tcp://127.0.0.1:{early_port + 1}: 2 event streams" in (
                late.log()
            )
            assert "blocks from a peer router's snapshot" in late.log()
        finally:
            late.stop()
    finally:
        early.stop()


def test_a_replica_whose_peers_give_no_snapshot_starts_as_usual(
    engines: list[EngineTwin],
) -> None:
    """One peer has none yet (it has heard no KV events), one is not up (nothing listens on
    its port: the connection is refused, so it is passed over at once, without waiting out
    the connect bound or --kv-snapshot-timeout): both are asked at once, then the router
    starts."""
    empty_port, silent_port, own_port = free_port_pair(), free_port_pair(), free_port_pair()
    empty = RouterProcess(["--policy", "precise", "--peer-port", str(empty_port)]).start()
    try:
        (late,) = start_routers(
            engines, 1, "--peer-port", str(own_port), "--kv-snapshot-timeout", "1",
            "--peer", f"tcp://127.0.0.1:{empty_port}", "--peer", f"tcp://127.0.0.1:{silent_port}",
        )  # fmt: skip
        try:
            log = late.log()
            assert f"no KV snapshot from tcp://127.0.0.1:{empty_port + 1}: it has none yet" in log
            not_up = f"no KV snapshot from tcp://127.0.0.1:{silent_port + 1}: {NOT_UP_REFUSED}"
            assert not_up in log
            assert "no answer within" not in log
            assert "no KV snapshot from any peer" in log
            assert get_json(late.url + "/readiness")
        finally:
            late.stop()
    finally:
        empty.stop()


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
