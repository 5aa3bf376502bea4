"""The endpoint picker's cost per request against the router's own HTTP mode, in one run.

One router process (`tpuserve router --picker-port`, policy ``cache_aware``, core 1) in front
of 4 engine twins (`tpuserve engine sim --time-scale 0`, core 0) serves, in alternating
rounds, the same requests two ways:

- ``http``: the router's HTTP port, as clients use it without a gateway (it proxies);
- ``picker``: a gateway's way: an ext_proc stream per request to the picker port
  (`tests/component/router/gateway_emulator.PickerClient`: headers, body, then the request
  sent by the emulated data plane to the endpoint the picker chose, its answer streamed back
  through the picker chunk by chunk, ``FULL_DUPLEX_STREAMED``).

Measured per round and mode, closed loop at concurrency ``--concurrency``: the router
process's own CPU time per request (all threads, /proc/<pid>/task/*/schedstat) and the
end-to-end latency at the client (p50), for non-streamed completions (~2 kB prompts, 8
tokens) and streamed chat (16 tokens: every chunk crosses the picker). The emulated data
plane runs in this process on core 0, so its cost is not the router's; its latency is
Python's, not Envoy's, so the latencies compare the two paths through this harness, not a
real gateway.

Usage (from the repository root):

    python bench/picker_overhead.py [--rounds 3] [--requests 1000] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson

# Run as a script: this checkout's root (for `bench.*` and `tests.*`) first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import router_overhead as ro
from tests.component.router.gateway_emulator import PickerClient

MODES = ("http", "picker")
ENVOY_CHUNK_BYTES = 16384
"""The request body's chunks as the emulated gateway sends them (Envoy passes on what each
read of the client's connection returned: up to its 16 KiB buffer reads)."""
KINDS = ("completion", "stream")


def bodies(kind: str, seed: int, n: int) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = ro.prompt(i, rng)
        if kind == "completion":
            body = {"model": ro.MODEL, "prompt": text, "max_tokens": 8}
            out.append(("/v1/completions", orjson.dumps(body)))
        else:
            body = {"model": ro.MODEL, "messages": [{"role": "user", "content": text}],
                    "max_tokens": 16, "stream": True}  # fmt: skip
            out.append(("/v1/chat/completions", orjson.dumps(body)))
    return out


async def run_closed(
    requests: Sequence[tuple[str, bytes]],
    concurrency: int,
    one: Callable[[str, bytes], Awaitable[int]],
) -> tuple[list[float], int]:
    """Latencies (seconds) of the requests answered 200, and how many were not."""
    queue = list(reversed(requests))
    latencies: list[float] = []
    failed = 0

    async def worker() -> None:
        nonlocal failed
        while queue:
            path, body = queue.pop()
            started = time.perf_counter()
            status = await one(path, body)
            if status == 200:
                latencies.append(time.perf_counter() - started)
            else:
                failed += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, failed


async def measure(mode: str, kind: str, router: ro.Proc, picker_port: int,
                  args: argparse.Namespace, seed: int) -> dict[str, Any]:  # fmt: skip
    requests = bodies(kind, seed, args.requests)
    warm = bodies(kind, seed + 100, args.warm_up)
    async with aiohttp.ClientSession() as http:
        picker = PickerClient(f"127.0.0.1:{picker_port}", chunk_bytes=ENVOY_CHUNK_BYTES)
        try:
            if mode == "http":

                async def one(path: str, body: bytes) -> int:
                    headers = {"content-type": "application/json"}
                    async with http.post(router.url + path, data=body, headers=headers) as r:
                        await r.read()
                        return r.status
            else:

                async def one(path: str, body: bytes) -> int:
                    return (await picker.exchange(path, body)).status

            await run_closed(warm, args.concurrency, one)
            ro.wait_idle(router.popen.pid)
            before = ro.cpu_seconds(router.popen.pid)
            latencies, failed = await run_closed(requests, args.concurrency, one)
            used = ro.cpu_seconds(router.popen.pid) - before
        finally:
            await picker.close()
    ok = len(latencies)
    return {
        "mode": mode, "kind": kind, "requests": ok, "failed": failed,
        "cpu_us_per_request": used / max(ok, 1) * 1e6,
        "latency_p50_ms": statistics.median(latencies) * 1e3 if latencies else None,
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warm-up", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    engines = ro.start_engines(4)
    port, picker_port = ro.free_port(), ro.free_port()
    command = [sys.executable, "-c", ro.ENTRY, "router", "--port", str(port),
               "--picker-port", str(picker_port), "--policy", "cache_aware",
               "--log-level", "warning",
               *(a for e in engines for a in ("--worker", e.url))]  # fmt: skip
    router = ro.start("router", command, ro.ROUTER_CORE, port)
    rows: list[dict[str, Any]] = []
    try:
        ro.wait_http(router.url, "/readiness")
        for round_ in range(args.rounds):
            for kind in KINDS:
                order = MODES if round_ % 2 == 0 else tuple(reversed(MODES))
                for mode in order:
                    row = asyncio.run(measure(mode, kind, router, picker_port, args, round_ * 10))
                    row["round"] = round_
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        router.stop()
        for engine in engines:
            engine.stop()
    summary: dict[str, Any] = {}
    print(f"\n{'kind':<11} {'mode':<7} {'router CPU µs/req (median)':>27} {'p50 ms (median)':>16}")
    for kind in KINDS:
        for mode in MODES:
            mine = [r for r in rows if r["kind"] == kind and r["mode"] == mode]
            cpu = statistics.median(r["cpu_us_per_request"] for r in mine)
            p50 = statistics.median(r["latency_p50_ms"] for r in mine if r["latency_p50_ms"])
            summary[f"{kind}.{mode}"] = {"cpu_us_per_request": cpu, "latency_p50_ms": p50}
            print(f"{kind:<11} {mode:<7} {cpu:>27.0f} {p50:>16.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
