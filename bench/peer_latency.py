"""How late a router replica hears its peer's decisions: two processes peering on loopback.

A publisher process runs the router's `PeerNetwork` and announces ``--messages`` routing
decisions (``--keys`` block keys each, one every ``--interval`` seconds) through its `PeerLink`;
a subscriber process runs another `PeerNetwork` and notes when its `PeerView` applied each one.
Both read the system's monotonic clock, so the difference is the delay from the publisher's
``routed`` to the subscriber's state (encoding, ZMQ over loopback TCP, the subscriber's event
loop, decoding, applying). Prints the median, p90 and p99 in microseconds: the ``--peer-delay``
the routing benchmark's replica model assumes is to be read against it.

    python bench/peer_latency.py [--messages 2000] [--keys 64] [--interval 0.001]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import statistics
import sys
import time
from multiprocessing.connection import Connection

from prometheus_client import CollectorRegistry

from tpuserve.cluster.ports import free_port
from tpuserve_router.engines.workers import WorkerRegistry, WorkerSpec
from tpuserve_router.metrics import create_router_metrics
from tpuserve_router.peering.peer_view import PeerMessage, PeerView
from tpuserve_router.peering.peers import PeerNetwork, peer_endpoint
from tpuserve_router.policies import make_policy
from tpuserve_router.policies.base import Decision

WORKER = "http://127.0.0.1:30000"


def network(router: str, port: int, peers: list[str]) -> tuple[PeerNetwork, WorkerRegistry]:
    registry = WorkerRegistry()
    registry.add(WorkerSpec(WORKER))
    view = PeerView(
        router, make_policy("precise"), registry.get, clock=time.monotonic,
        max_open_per_peer=100_000, open_ttl_seconds=600.0,
    )  # fmt: skip
    metrics = create_router_metrics(CollectorRegistry())
    return PeerNetwork(view, metrics, host="127.0.0.1", port=port, peers=peers), registry


async def subscribe(port: int, peer_port: int, count: int, results: Connection) -> None:
    net, _ = network("subscriber", port, [peer_endpoint("127.0.0.1", peer_port)])
    heard: dict[int, float] = {}
    apply = net.view.apply
    all_heard = asyncio.Event()

    def noting(message: PeerMessage) -> bool:
        applied = apply(message)
        if message.kind == "route":
            heard[message.request] = time.monotonic()
            if message.request >= count:  # the last one (ZMQ keeps the order)
                all_heard.set()
        return applied

    net.view.apply = noting  # type: ignore[method-assign]
    await net.start()
    results.send("ready")
    with contextlib.suppress(TimeoutError):  # some lost (the first, as it subscribed)
        await asyncio.wait_for(all_heard.wait(), timeout=120)
    results.send(heard)
    await net.stop()


def run_subscriber(port: int, peer_port: int, count: int, results: Connection) -> None:
    asyncio.run(subscribe(port, peer_port, count, results))


async def publish(
    port: int, warmup: int, count: int, keys: int, interval: float
) -> dict[int, float]:
    net, registry = network("publisher", port, [])
    await net.start()
    worker = registry.workers[0]
    sent: dict[int, float] = {}
    for i in range(warmup + count):
        decision = Decision(worker, "miss", pending_units=keys * 16, block_keys=range(i, i + keys))
        at = time.monotonic()
        net.link.routed(decision)
        if i >= warmup:
            sent[i + 1] = at
        net.link.ended(decision)
        await asyncio.sleep(interval)
    await asyncio.sleep(0.5)
    await net.stop()
    return sent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=64, help="block keys per decision")
    parser.add_argument("--interval", type=float, default=0.001)
    args = parser.parse_args()
    warmup = 200  # the subscription is set up while the first ones go out
    pub_port, sub_port = free_port(), free_port()
    ours, theirs = multiprocessing.Pipe()
    sub = multiprocessing.Process(
        target=run_subscriber, args=(sub_port, pub_port, warmup + args.messages, theirs)
    )
    sub.start()
    ours.recv()
    sent = asyncio.run(publish(pub_port, warmup, args.messages, args.keys, args.interval))
    heard: dict[int, float] = ours.recv()
    sub.join()
    delays = sorted((heard[n] - at) * 1e6 for n, at in sent.items() if n in heard)
    if not delays:
        print("nothing heard", file=sys.stderr)
        return 1
    quantiles = statistics.quantiles(delays, n=100)
    print(
        f"{len(delays)} of {len(sent)} decisions heard ({args.keys} keys each): "
        f"median {statistics.median(delays):.0f} us, p90 {quantiles[89]:.0f} us, "
        f"p99 {quantiles[98]:.0f} us"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
