"""Benchmark: short requests per second one live `tpuserve engine sim` process serves.

Starts the engine at --time-scale 0 pinned to one core (taskset, when available) and a load
generator in a separate process pinned to another core: an aiohttp client keeping
--concurrency requests in flight on loopback for --seconds (bounded in time and count). Prints
one JSON line with requests/s, errors and client-side latency percentiles.

    .venv/bin/python bench/engine_live.py --seconds 10 --concurrency 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

import aiohttp

ENTRY = "import sys; from tpuserve.cli import main; sys.exit(main())"


async def load(
    url: str, seconds: float, concurrency: int, max_tokens: int, path: str
) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds
    body = (
        {"text": "short prompt for a load test", "sampling_params": {"max_new_tokens": max_tokens}}
        if path == "/generate"
        else {"prompt": "short prompt for a load test", "max_tokens": max_tokens}
    )
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as s:

        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                t = time.perf_counter()
                async with s.post(url + path, json=body) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
                latencies.append(time.perf_counter() - t)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    latencies.sort()
    n = len(latencies)
    return {
        "requests": n,
        "errors": errors,
        "wall_seconds": round(wall, 2),
        "requests_per_second": round(n / wall, 1),
        "p50_ms": round(latencies[n // 2] * 1000, 2),
        "p99_ms": round(latencies[int(n * 0.99)] * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=1)
    parser.add_argument("--path", default="/generate", choices=["/generate", "/v1/completions"])
    parser.add_argument("--loadgen", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loadgen:
        import uvloop

        result = uvloop.run(
            load(args.url, args.seconds, args.concurrency, args.max_tokens, args.path)
        )
        print(json.dumps(result))
        return
    pin = shutil.which("taskset") and (os.cpu_count() or 1) >= 2
    engine_cmd = [sys.executable, "-c", ENTRY, "engine", "sim", "--port", "0",
                  "--time-scale", "0", "--log-level", "warning"]  # fmt: skip
    if pin:
        engine_cmd = ["taskset", "-c", "0", *engine_cmd]
    engine = subprocess.Popen(engine_cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert engine.stdout is not None
        line = engine.stdout.readline()
        if not line.startswith("READY "):
            raise SystemExit(f"engine did not start: {line!r}")
        url = line.split()[1]
        gen_cmd = [sys.executable, __file__, "--loadgen", "--url", url, "--seconds",
                   str(args.seconds), "--concurrency", str(args.concurrency), "--max-tokens",
                   str(args.max_tokens), "--path", args.path]  # fmt: skip
        if pin:
            gen_cmd = ["taskset", "-c", "1", *gen_cmd]
        out = subprocess.run(gen_cmd, capture_output=True, text=True, check=True, timeout=600)
        result = json.loads(out.stdout)
        result.update(
            benchmark="engine_live", path=args.path, concurrency=args.concurrency,
            max_tokens=args.max_tokens, engine_pinned_to_one_core=bool(pin),
        )  # fmt: skip
        print(json.dumps(result))
    finally:
        engine.send_signal(signal.SIGTERM)
        engine.wait(timeout=60)


if __name__ == "__main__":
    main()
