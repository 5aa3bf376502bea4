"""The endpoint picker's memory and file descriptors under floods (issue 57, item 2).

One `tpuserve router --picker-port` process (no worker, ``--max-buffered-bytes``
``--budget-mib``, 128 by default, optionally ``--picker-token-file``) takes, from this process
on loopback:

- ``--streams`` ext_proc streams over 10 connections, each sending one request-headers
  message of ``--headers`` headers of 1,000 bytes (4,000: about 4 MB), until each has ended;
- then ``--connections`` raw TCP connections to the picker port that send nothing.

It prints how the streams ended, the router's RSS at rest and its peak (VmHWM), its open
files during the connection flood, and whether its HTTP port answered ``/health`` during
each flood. A benchmark, not a test: the figures depend on the machine.

Usage (from the repository root; raise ``ulimit -n`` for many connections):

    python bench/picker_floods.py [--streams 150] [--headers 4000] [--connections 3000]
        [--budget-mib 128] [--token-file FILE]

The component test ``test_router_hostile_picker.py`` runs its stream flood.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc

CHANNELS = 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def memory_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def answers(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
            return "yes" if reply.status == 200 else f"no ({reply.status})"
    except OSError as err:
        return f"no ({err})"


def start_router(
    port: int, picker: int, token_file: str | None, budget_mib: int = 128
) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "tpuserve", "router", "--port", str(port),
               "--picker-port", str(picker),
               "--max-buffered-bytes", str(budget_mib << 20),
               # the picker's share (a quarter) and the HTTP port's each hold one body
               "--max-request-bytes", str(min(32 << 20, (budget_mib << 20) // 4))]  # fmt: skip
    if token_file:
        command += ["--picker-token-file", token_file]
    router = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while answers(port) != "yes":
        if time.monotonic() > deadline:
            router.kill()
            raise RuntimeError("the router did not start")
        time.sleep(0.1)
    time.sleep(1)  # settled: its RSS at rest
    return router


async def stream_flood(picker: int, streams: int, header_count: int) -> dict[str, int]:
    """Open ``streams`` ext_proc streams to the picker on ``picker`` over `CHANNELS`
    connections, each sending one request-headers message of ``header_count`` headers of
    1,000 bytes; wait for every one to end. How they ended, by gRPC status."""
    headers = [base_pb2.HeaderValue(key=":path", raw_value=b"/v1/completions")]
    headers += [
        base_pb2.HeaderValue(key=f"x-flood-{i}", raw_value=b"f" * 1000) for i in range(header_count)
    ]
    message = ext_proc.ProcessingRequest(
        request_headers=ext_proc.HttpHeaders(headers=base_pb2.HeaderMap(headers=headers))
    )
    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_send_message_length", -1)]
    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{picker}", options=options) for _ in range(CHANNELS)
    ]
    try:
        calls = []
        for i in range(streams):
            call = ext_proc_grpc.ExternalProcessorStub(channels[i % CHANNELS]).Process()
            calls.append(call)
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await call.write(message)
        ended: dict[str, int] = {}
        for call in calls:
            outcome = str((await call.code()).name)
            ended[outcome] = ended.get(outcome, 0) + 1
        return ended
    finally:
        for channel in channels:
            await channel.close()


async def flood(
    args: argparse.Namespace, router: subprocess.Popen[bytes], port: int, picker: int
) -> None:
    at_rest = memory_bytes(router.pid, "VmRSS")
    ended = await stream_flood(picker, args.streams, args.headers)
    during_streams = answers(port)
    peak = memory_bytes(router.pid, "VmHWM")
    sockets = []
    for _ in range(args.connections):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", picker))
        sockets.append(s)
    await asyncio.sleep(3)
    files = len(os.listdir(f"/proc/{router.pid}/fd"))
    during_connections = answers(port)
    for s in sockets:
        s.close()
    size = args.headers * 1000 / 1e6
    print(f"{args.streams} streams x {size:.1f} MB of headers: {ended}")
    growth = (peak - at_rest) / 2**20
    print(f"  router RSS at rest {at_rest / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB "
          f"(+{growth:.0f} MiB); HTTP /health answered: {during_streams}")  # fmt: skip
    print(f"{args.connections} idle TCP connections: router open files {files}; "
          f"HTTP /health answered: {during_connections}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=150)
    parser.add_argument("--headers", type=int, default=4000, help="headers of 1,000 bytes")
    parser.add_argument("--connections", type=int, default=3000)
    parser.add_argument("--budget-mib", type=int, default=128, help="--max-buffered-bytes")
    parser.add_argument("--token-file", help="start the router with --picker-token-file")
    args = parser.parse_args()
    port, picker = free_port(), free_port()
    router = start_router(port, picker, args.token_file, args.budget_mib)
    try:
        asyncio.run(flood(args, router, port, picker))
    finally:
        router.terminate()
        router.wait(10)


if __name__ == "__main__":
    main()
