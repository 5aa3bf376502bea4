"""A router replica started late: how soon it knows what the engines hold, and its hit rate.

Live, on loopback: ``--engines`` engine twins (KV events with a replay buffer of
``--buffer-steps`` batches), router A (`tpuserve router`, the default policy) and the first
turns of ``--conversations`` conversations through it (a shared system prompt, then a history
of ~1,000 tokens of each conversation's own). Then router B starts. Measured from B's process
start: when B has every worker routable, when its block index holds what A's holds (the
``confirmed_blocks`` of ``tpuserve_router_prefix_index_size`` within 1 %), and the hit rate
(cached / prompt tokens, from the engines' usage) of the conversations' second turns, sent
alternately through A and B from the moment B is routable.

    python bench/router_replicas.py [--engines 4] [--conversations 64] [--buffer-steps 10000]
                                    [--snapshot [peer|http]] [--json out.json]

``--buffer-steps`` small enough that the first turns overflow the engines' replay buffers shows
what replay alone cannot give a late replica; ``--snapshot`` (or ``--snapshot peer``) makes A
and B peer (``--peer-port``, B with ``--peer`` A), so B asks A for its block index over
peering before it follows the engines' replay from there, as the operator's router pods do;
``--snapshot http`` starts B with ``--kv-snapshot-from`` A instead (A's admin route).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tpuserve.bench.live_runner import (
    LiveConfig,
    Proc,
    send_request,
    start_engine,
    start_router,
    wait_router_ready,
)
from tpuserve.bench.report import RequestRecord
from tpuserve.bench.sim_config import SimConfig
from tpuserve.bench.traces import TraceRequest
from tpuserve.cluster.ports import free_port_pair

SYSTEM = "You are the support assistant of a large company; answer briefly and politely. " * 8
POLL_SECONDS = 0.05
CONVERGED_SHARE = 0.99


def first_turn(i: int) -> str:
    return SYSTEM + f"Conversation {i}. " + f"History of conversation {i}, line by line. " * 80


def confirmed_blocks(router: Proc) -> int:
    with urllib.request.urlopen(router.url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "tpuserve_router_prefix_index_size":
            for sample in family.samples:
                if sample.labels.get("kind") == "confirmed_blocks":
                    return int(sample.value)
    return 0


def routable(router: Proc, count: int) -> bool:
    try:
        with urllib.request.urlopen(router.url + "/workers", timeout=5) as response:
            workers = json.loads(response.read())["workers"]
    except OSError:
        return False
    return sum(1 for w in workers if w["healthy"] and w["models"]) >= count


async def send_all(
    session: aiohttp.ClientSession, router: Proc, prompts: list[tuple[int, str]], t0: float
) -> list[RequestRecord]:
    records = []
    for i, prompt in prompts:  # one at a time: routing, not queueing, decides the hit
        rec = RequestRecord(str(i), router.role, 0.0, 0)
        await send_request(session, router.url, TraceRequest(str(i), 0.0, 4, prompt), rec, t0)
        records.append(rec)
    return records


def hit_rate(records: list[RequestRecord]) -> float:
    prompt = sum(r.prompt_tokens for r in records if r.ok)
    return sum(r.cached_tokens for r in records if r.ok) / prompt if prompt else 0.0


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    config = LiveConfig(
        SimConfig(cache_tokens=args.cache_tokens), time_scale=args.time_scale,
        engine_args=("--kv-events-buffer-steps", str(args.buffer_steps)),
    )  # fmt: skip
    procs: list[Proc] = []
    try:
        engines = [start_engine(i, config, kv_events=True) for i in range(args.engines)]
        procs += engines
        urls = [e.url for e in engines]
        early_peer_port = free_port_pair()
        early_args = ("--peer-port", str(early_peer_port)) if args.snapshot == "peer" else ()
        early = start_router("precise", urls, dataclasses.replace(config, router_args=early_args))
        early.role = "A"
        procs.append(early)
        await wait_router_ready(early, len(urls), 60)
        firsts = [(i, first_turn(i)) for i in range(args.conversations)]
        async with aiohttp.ClientSession() as session:
            loop = asyncio.get_running_loop()
            await asyncio.gather(
                *(send_all(session, early, firsts[k::8], loop.time()) for k in range(8))
            )
            held = confirmed_blocks(early)
            while True:  # until the last events have reached A
                await asyncio.sleep(0.5)
                now_held = confirmed_blocks(early)
                if now_held == held:
                    break
                held = now_held
            started = time.monotonic()
            late_args = {
                None: (),
                "http": ("--kv-snapshot-from", early.url),
                "peer": ("--peer-port", str(free_port_pair()),
                         "--peer", f"tcp://127.0.0.1:{early_peer_port}"),
            }[args.snapshot]  # fmt: skip
            late = start_router("precise", urls, dataclasses.replace(config, router_args=late_args))
            late.role = "B"
            procs.append(late)
            routable_at = converged_at = None
            blocks_at_routable = 0
            while time.monotonic() - started < args.timeout:
                if routable_at is None and routable(late, len(urls)):
                    routable_at = time.monotonic() - started
                    blocks_at_routable = confirmed_blocks(late)
                if routable_at is not None and confirmed_blocks(late) >= CONVERGED_SHARE * held:
                    converged_at = time.monotonic() - started
                    break
                await asyncio.sleep(POLL_SECONDS)
            late_blocks = confirmed_blocks(late)
            seconds = [
                (i, first_turn(i) + " And a follow-up question?") for i in range(len(firsts))
            ]
            t0 = loop.time()
            via_a, via_b = await asyncio.gather(
                send_all(session, early, seconds[0::2], t0),
                send_all(session, late, seconds[1::2], t0),
            )
        return {
            "engines": args.engines, "conversations": args.conversations,
            "buffer_steps": args.buffer_steps, "snapshot": args.snapshot, "blocks_early": held,
            "blocks_late_at_routable": blocks_at_routable, "blocks_late": late_blocks,
            "late_routable_seconds": routable_at, "late_converged_seconds": converged_at,
            "second_turn_hit_rate_early": round(hit_rate(via_a), 3),
            "second_turn_hit_rate_late": round(hit_rate(via_b), 3),
            "failed": sum(1 for r in via_a + via_b if not r.ok),
        }  # fmt: skip
    finally:
        for proc in reversed(procs):
            proc.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--buffer-steps", type=int, default=10_000)
    parser.add_argument("--cache-tokens", type=int, default=200_000)
    parser.add_argument("--time-scale", type=float, default=0.0)
    parser.add_argument("--timeout", type=float, default=60.0, help="Most seconds to wait for B.")
    parser.add_argument(
        "--snapshot", nargs="?", const="peer", choices=("peer", "http"),
        help="B starts from A's index, then replays from there: over peering (peer, the "
        "default: A and B peer) or from A's GET /kv_snapshot (http, --kv-snapshot-from).",
    )  # fmt: skip
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = asyncio.run(measure(args))
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
