"""Low load, new conversations: how routers spread them and what they hit, same run.

Four engine twins (modelled time, KV events), one router in front: tpuserve's default policy
(``precise``), sglang-router 0.3.2 ``cache_aware`` (unless ``--skip-anchor``) and, with
``--baseline DIR``, the default policy of another checkout (before/after a change). For each
``--clients`` count (default 1 and 2) and each router, fresh engines (empty caches) and the
router start, then every client runs ``--conversations`` new conversations one after the
other, closed loop: each opens with a system prompt no other conversation shares (~600
tokens), then ``--turns`` turns, each the whole conversation so far plus a new user message,
streamed through the official ``openai`` client (``max_tokens`` 32), after one warm-up
request straight to each engine and one through the router (`warm_up`, `warm_up_client`:
first requests pay one-off costs). Per router: the hit
rate (cached prompt tokens / prompt tokens, as the engines report them in usage), TTFT p50
and p99 (first content chunk, at the client) and the requests each engine served (its
``sglang:num_requests_total``). The routers take turns in alternating order, so the host's
drift hits both.

Usage (from the repository root; ~1 minute per router and client count):

    bench/routing_anchor_venv.sh                      # once: installs sglang-router 0.3.2
    .venv/bin/python bench/routing_low_load.py [--clients 1,2] [--conversations 8]
        [--turns 4] [--baseline DIR] [--skip-anchor] [--json out.jsonl]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.router_overhead import (
    ENTRY,
    MODEL,
    OTHER_CORE,
    ROUTER_CORE,
    Proc,
    RouterKind,
    anchor_python,
    free_port,
    sglang_router,
    start,
    tpuserve_router,
    wait_caught_up,
    wait_http,
)

ENGINES = 4
MAX_TOKENS = 32
WORDS = [
    "".join(random.Random(i).choice("abcdefghijklmnopqrstuvwxyz") for _ in range(5))
    for i in range(2000)
]


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def start_engines(time_scale: float) -> list[Proc]:
    engines = []
    for i in range(ENGINES):
        port = free_port()
        cmd = [sys.executable, "-c", ENTRY, "engine", "sim", "--port", str(port),
               "--time-scale", repr(time_scale), "--log-level", "warning",
               "--enable-cache-report",
               "--kv-events-endpoint", f"tcp://127.0.0.1:{free_port()}",
               "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{free_port()}"]  # fmt: skip
        engines.append(start(f"engine{i}", cmd, OTHER_CORE, port))
    for engine in engines:
        wait_http(engine.url, "/health")
    return engines


def warm_up(url: str, label: str) -> None:
    """One short chat request straight to an engine, not measured: a process's first request
    may pay one-off costs its later ones do not, which would otherwise be the p99 of a few
    dozen requests. Each engine gets one, so each caches the same few blocks and none looks
    fuller to the router."""
    message = {"role": "user", "content": f"warm-up {label}"}
    body = json.dumps({"model": MODEL, "messages": [message], "max_tokens": 1}).encode()
    request = urllib.request.Request(
        url + "/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()


def warm_up_client(url: str) -> None:
    """One streamed chat through the router with the official client, not measured: the
    client's first streamed answer pays one-off costs in this process too (the first run of
    a first version of this script measured a p99 of 0.2-0.9 s for whichever router ran
    first, 0.05-0.1 s for the others)."""

    async def one() -> None:
        rows: list[dict[str, float]] = []
        await client(url, -1, 1, 1, rows)

    asyncio.run(one())


def served(engine: Proc) -> float:
    """Requests ``engine`` has served (its ``sglang:num_requests_total``, all labels)."""
    with urllib.request.urlopen(engine.url + "/metrics", timeout=5) as response:
        page = response.read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(page)
        if family.name == "sglang:num_requests"
        for s in family.samples
        if s.name.endswith("_total")
    )


async def client(base_url: str, index: int, conversations: int, turns: int,
                 rows: list[dict[str, float]]) -> None:  # fmt: skip
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0) as oa:
        for c in range(conversations):
            rng = random.Random(f"low-load:{index}:{c}")
            messages: list[Any] = [{"role": "system", "content": text(rng, 300)}]
            for _ in range(turns):
                messages.append({"role": "user", "content": text(rng, 40)})
                start = time.perf_counter()
                first = None
                answer = []
                usage = None
                stream = await oa.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=MAX_TOKENS, stream=True,
                    stream_options={"include_usage": True},
                )  # fmt: skip
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        if first is None:
                            first = time.perf_counter() - start
                        answer.append(chunk.choices[0].delta.content)
                    if chunk.usage is not None:
                        usage = chunk.usage
                if usage is None or first is None:
                    raise RuntimeError("a streamed answer came without content or usage")
                details = usage.prompt_tokens_details
                rows.append({
                    "ttft": first,
                    "prompt": usage.prompt_tokens,
                    "cached": (details.cached_tokens or 0) if details else 0,
                })  # fmt: skip
                messages.append({"role": "assistant", "content": "".join(answer)})


def run_one(kind: RouterKind, clients: int, args: argparse.Namespace) -> dict[str, Any]:
    engines = start_engines(args.time_scale)
    for i, engine in enumerate(engines):
        warm_up(engine.url, f"engine {i}")
    port = free_port()
    router = start(kind.label, kind.command(port, [e.url for e in engines]), ROUTER_CORE, port,
                   kind.tree)  # fmt: skip
    try:
        wait_http(router.url, kind.ready_path)
        time.sleep(1.0)  # the router's start-up health checks
        if kind.label.startswith("tpuserve"):  # (sglang-router's /metrics is on another port)
            wait_caught_up(router.url, ENGINES)
        warm_up_client(router.url)
        before = [served(e) for e in engines]
        rows: list[dict[str, float]] = []

        async def all_clients() -> None:
            await asyncio.gather(*(
                client(router.url, i, args.conversations, args.turns, rows)
                for i in range(clients)
            ))  # fmt: skip

        asyncio.run(all_clients())
        per_engine = sorted(
            (int(served(e) - b) for e, b in zip(engines, before, strict=True)), reverse=True
        )
    finally:
        router.stop()
        for engine in engines:
            engine.stop()
    ttft = sorted(r["ttft"] for r in rows)
    return {
        "router": kind.label,
        "clients": clients,
        "requests": len(rows),
        "hit_rate": sum(r["cached"] for r in rows) / sum(r["prompt"] for r in rows),
        "ttft_p50": statistics.median(ttft),
        "ttft_p99": ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))],
        "requests_per_engine": per_engine,
        "conversations_per_client": args.conversations,
        "turns": args.turns,
        "time_scale": args.time_scale,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", default="1,2")
    parser.add_argument("--conversations", type=int, default=8, help="per client")
    parser.add_argument("--turns", type=int, default=4, help="per conversation")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="engines' real seconds per modelled second")  # fmt: skip
    parser.add_argument("--baseline", type=Path, action="append", default=[],
                        help="another checkout whose precise runs too")  # fmt: skip
    parser.add_argument("--skip-anchor", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="append every row here")
    args = parser.parse_args()
    kinds = [tpuserve_router("precise")]
    kinds += [tpuserve_router("precise", tree=tree.resolve()) for tree in args.baseline]
    if not args.skip_anchor:
        kinds.append(sglang_router(anchor_python()))
    print("| router | clients | requests | hit rate | TTFT p50 / p99 (ms) | requests per engine |")
    print("|---|---|---|---|---|---|")
    for n, clients in enumerate(int(c) for c in args.clients.split(",")):
        order = kinds if n % 2 == 0 else kinds[::-1]
        for kind in order:
            row = run_one(kind, clients, args)
            print(f"| {row['router']} | {clients} | {row['requests']} | {row['hit_rate']:.3f} | "
                  f"{row['ttft_p50'] * 1e3:.0f} / {row['ttft_p99'] * 1e3:.0f} | "
                  f"{', '.join(map(str, row['requests_per_engine']))} |", flush=True)  # fmt: skip
            if args.json is not None:
                with args.json.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
