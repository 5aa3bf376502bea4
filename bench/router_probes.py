"""The hostile-client probes of issue 13 against a router process, with its RSS after each.

A `tpuserve router` (default settings, ``--metrics-port``) in front of 2 stub workers
(`bench/router_stub.py`), all on loopback. Each probe is followed by one ordinary request
(must be 200) and a look at the router's RSS (VmRSS) and its workers' health:

1. one 128 MB header; 2. eight 64 MB headers at once; 3. four ~30 MB prompts;
4. 500 slowloris connections (a head trickled one byte at a time) held past the header
   timeout; 5. ``--idle`` (default 20,000) idle connections plus 500 slowloris, opened from
   child processes (each process has its own open-file limit), while an ordinary client and
   the metrics port's ``/readiness`` are probed, and every worker must stay healthy.

With ``--stopped-engine``, only this: two engine twins on the real clock, plain requests at
concurrency 8, one engine stopped with SIGSTOP mid-load; how long until it is ejected, the
longest request, how many failed.

    python bench/router_probes.py [--idle 20000] [--json out.json] [--stopped-engine]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import router_overhead as ro
from bench.router_memory import rss_mib

HOST = "127.0.0.1"


async def exchange(port: int, data: bytes, read_seconds: float = 30) -> bytes:
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(data)
        try:
            await writer.drain()
            return await asyncio.wait_for(reader.read(), read_seconds)
        except (ConnectionError, TimeoutError):
            return b""
    finally:
        writer.close()


def status_of(data: bytes) -> int | None:
    if data.startswith(b"HTTP/1.1 "):
        return int(data[9:12])
    return None


def ordinary(port: int) -> int | None:
    body = orjson.dumps({"model": ro.MODEL, "prompt": "hello", "max_tokens": 1})
    request = (
        b"POST /v1/completions HTTP/1.1\r\nhost: r\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    ) + body
    return status_of(asyncio.run(exchange(port, request)))


def workers_healthy(url: str) -> list[bool]:
    with urllib.request.urlopen(url + "/workers", timeout=10) as response:
        return [w["healthy"] for w in json.loads(response.read())["workers"]]


def readiness(metrics_port: int) -> int:
    with urllib.request.urlopen(f"http://{HOST}:{metrics_port}/readiness", timeout=10) as r:
        return int(r.status)


async def huge_headers(port: int, count: int, size: int) -> list[int | None]:
    head = b"GET /health HTTP/1.1\r\nhost: r\r\nx-big: "
    payload = head + b"a" * size + b"\r\n\r\n"
    answers = await asyncio.gather(*(exchange(port, payload) for _ in range(count)))
    return [status_of(a) for a in answers]


async def huge_prompts(port: int, count: int, size: int) -> list[int | None]:
    body = orjson.dumps({"model": ro.MODEL, "prompt": "word " * (size // 5), "max_tokens": 1})
    request = (
        b"POST /v1/completions HTTP/1.1\r\nhost: r\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    ) + body
    answers = await asyncio.gather(*(exchange(port, request) for _ in range(count)))
    return [status_of(a) for a in answers]


async def slowloris(port: int, connections: int, seconds: float) -> int:
    """Trickle heads one byte per second on ``connections`` sockets; how many were closed."""
    head = b"POST /v1/completions HTTP/1.1\r\nhost: r\r\nx-slow: " + b"a" * 1000
    streams = [await asyncio.open_connection(HOST, port) for _ in range(connections)]
    closed = 0
    deadline = time.monotonic() + seconds
    position = 0
    while time.monotonic() < deadline and position < len(head):
        for _, writer in streams:
            if not writer.is_closing():
                writer.write(head[position : position + 1])
        await asyncio.sleep(1.0)
        position += 1
    for reader, writer in streams:
        if reader.at_eof() or writer.is_closing():
            closed += 1
            continue
        try:
            data = await asyncio.wait_for(reader.read(100), 0.01)
            closed += 1 if data.startswith(b"HTTP/1.1 408") or not data else 0
        except (TimeoutError, ConnectionError):
            pass
        writer.close()
    return closed


def hold_idle(port: int, count: int, ready: Any, release: Any) -> None:
    """A child process: open ``count`` idle connections (every 40th a half head), hold them."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    async def run() -> None:
        writers = []
        for i in range(count):
            try:
                _, writer = await asyncio.open_connection(HOST, port)
            except OSError:
                break
            if i % 40 == 0:
                writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: r\r\n")
            writers.append(writer)
        ready.put(len(writers))
        await asyncio.to_thread(release.get)  # until the parent says so
        for writer in writers:
            writer.close()

    asyncio.run(run())


def stopped_engine() -> dict[str, Any]:
    """Two engine twins on the real clock behind a router with default settings; plain
    requests at concurrency 8; one engine is stopped (SIGSTOP) mid-load. How long until the
    router stops routing to it, the longest request, and how many failed."""
    engines = []
    for _ in range(2):
        port = ro.free_port()
        cmd = [sys.executable, "-c", ro.ENTRY, "engine", "sim", "--port", str(port),
               "--time-scale", "1", "--log-level", "warning"]  # fmt: skip
        engines.append(ro.start("engine", cmd, ro.OTHER_CORE, port))
    for engine in engines:
        ro.wait_http(engine.url, "/health")
    port = ro.free_port()
    router = ro.start(
        "router", ro.tpuserve_router("least_load").command(port, [e.url for e in engines]),
        ro.ROUTER_CORE, port,
    )  # fmt: skip
    url = f"http://{HOST}:{port}"
    try:
        ro.wait_http(url, "/readiness")
        time.sleep(2.0)
        return asyncio.run(_stop_one_under_load(port, url, engines[0]))
    finally:
        os.kill(engines[0].popen.pid, signal.SIGCONT)
        router.stop()
        for engine in engines:
            engine.stop()


async def _stop_one_under_load(port: int, url: str, victim: ro.Proc) -> dict[str, Any]:
    body = orjson.dumps({"model": ro.MODEL, "prompt": "hello there", "max_tokens": 20})
    request = (
        b"POST /v1/completions HTTP/1.1\r\nhost: r\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    ) + body
    durations: list[float] = []
    failed = 0
    stop_at = time.monotonic() + 40.0

    async def client() -> None:
        nonlocal failed
        while time.monotonic() < stop_at:
            started = time.monotonic()
            status = status_of(await exchange(port, request, read_seconds=120))
            durations.append(time.monotonic() - started)
            failed += status != 200

    clients = [asyncio.ensure_future(client()) for _ in range(8)]
    await asyncio.sleep(5.0)
    os.kill(victim.popen.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    ejected = None
    while time.monotonic() < stopped + 60:
        healthy = await asyncio.to_thread(workers_healthy, url)
        if not healthy[0]:
            ejected = time.monotonic() - stopped
            break
        await asyncio.sleep(0.1)
    await asyncio.gather(*clients)
    return {
        "requests": len(durations),
        "failed": failed,
        "longest_request_seconds": round(max(durations), 1),
        "ejected_after_seconds": None if ejected is None else round(ejected, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, default=20_000)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--stopped-engine", action="store_true", help="only the SIGSTOP probe (engine twins)"
    )
    args = parser.parse_args()
    if args.stopped_engine:
        row = stopped_engine()
        print(f"stopped engine: {json.dumps(row)}")
        return 0
    stubs = ro.start_stubs(2)
    port, metrics_port = ro.free_port(), ro.free_port()
    kind = ro.tpuserve_router("cache_aware")
    cmd = [*kind.command(port, [s.url for s in stubs]), "--metrics-port", str(metrics_port)]
    router = ro.start("router", cmd, ro.ROUTER_CORE, port)
    url = f"http://{HOST}:{port}"
    report: dict[str, Any] = {}

    def record(name: str, **extra: Any) -> None:
        row = {
            "rss_mib": round(rss_mib(router.popen.pid), 1),
            "ordinary_request": ordinary(port),
            "workers_healthy": workers_healthy(url),
            **extra,
        }
        report[name] = row
        print(f"{name}: {json.dumps(row)}", file=sys.stderr, flush=True)

    try:
        ro.wait_http(url, "/readiness")
        time.sleep(1.0)
        record("start")
        record("one 128 MB header", statuses=asyncio.run(huge_headers(port, 1, 128 << 20)))
        record("eight 64 MB headers", statuses=asyncio.run(huge_headers(port, 8, 64 << 20)))
        record("four 30 MB prompts", statuses=asyncio.run(huge_prompts(port, 4, 30 << 20)))
        record("500 slowloris for 15 s", closed=asyncio.run(slowloris(port, 500, 15)))
        ready: Any = multiprocessing.Queue()
        release: Any = multiprocessing.Queue()
        per_child = 5000
        children = [
            multiprocessing.Process(target=hold_idle, args=(port, per_child, ready, release))
            for _ in range((args.idle + per_child - 1) // per_child)
        ]
        for child in children:
            child.start()
        held = sum(ready.get(timeout=300) for _ in children)
        record(
            f"{args.idle} idle connections (every 40th a slowloris)",
            held_by_clients=held,
            readiness_on_metrics_port=readiness(metrics_port),
        )
        for _ in children:
            release.put(True)
        for child in children:
            child.join(60)
        time.sleep(2.0)
        record("after the idle connections left")
    finally:
        router.stop()
        for stub in stubs:
            stub.stop()
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    ok = all(
        row["ordinary_request"] == 200 and all(row["workers_healthy"]) for row in report.values()
    )
    print("every probe: ordinary request served, no worker ejected:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    os.sched_setaffinity(0, {int(ro.OTHER_CORE)})
    raise SystemExit(main())
