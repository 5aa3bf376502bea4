"""Stand-ins for what cannot exist on this machine, for the live Prometheus proof. Each honours
the real contract it replaces.

- `FakeTpuDevicePlugin`: FAKE of GKE's TPU device plugin exporter (no TPU here). Serves GKE's
  metric names and labels (`tpuserve/observability/device_metrics.py`: `make="cloud-tpu"`,
  `model` = the GKE accelerator type, `tpu_topology`, `accelerator_id`) for one v6e 2x4 node.
- `OverloadedWorker`: an SGLang server at its queue limit (what `--max-queued-requests` does):
  healthy, lists its model, and answers every generation request with 503 + Retry-After, so a
  router in front of it records upstream errors and retries.
- `GappyPublisher`: the publishing side of SGLang's KV events on real ZMQ sockets that can lose
  a batch, so the router records a KV-event gap.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import zmq
import zmq.asyncio
from aiohttp import web

from sglang_tpu.kv_events import EventBatch, encode_batch, page_stores, pub_frames
from sglang_tpu.topology import lookup
from tests.fakes import FakeModelServer
from tpuserve.observability import device_metrics as dm


class FakeTpuDevicePlugin:
    """FAKE GKE TPU device plugin exporter: one v6e 2x4 node, 8 accelerators. Served from its
    own thread, so a test's event loop never delays a scrape."""

    def __init__(self) -> None:
        self.shape = lookup("v6e", "2x4")
        body = self.exposition().encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> str:
        self._thread.start()
        return self.url

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def exposition(self) -> str:
        hbm = self.shape.generation.hbm_bytes_per_chip
        values: dict[str, Callable[[int], float]] = {
            dm.TENSORCORE_UTILIZATION: lambda i: 40.0 + i,
            dm.MEMORY_BANDWIDTH_UTILIZATION: lambda i: 60.0 + i,
            dm.DUTY_CYCLE: lambda i: 90.0,
            dm.MEMORY_USED: lambda i: hbm * 0.8,
            dm.MEMORY_TOTAL: lambda i: float(hbm),
        }
        lines = []
        for name, (unit, meaning) in dm.DEVICE_PLUGIN_METRICS.items():
            lines += [f"# HELP {name} {meaning} ({unit})", f"# TYPE {name} gauge"]
            for i in range(self.shape.chips_per_host):
                labels = (
                    f'make="{dm.MAKE}",model="{self.shape.generation.accelerator}",'
                    f'tpu_topology="{self.shape.topology}",accelerator_id="{i}"'
                )
                lines.append(f"{name}{{{labels}}} {values[name](i)}")
        return "\n".join(lines) + "\n"


class OverloadedWorker(FakeModelServer):
    """An SGLang server whose waiting queue is full: 503 + Retry-After on generation."""

    def __init__(self, model: str) -> None:
        self.refused = 0
        super().__init__(model, [web.post("/{tail:.*}", self._refuse)])

    async def _refuse(self, request: web.Request) -> web.Response:
        await request.read()
        self.refused += 1
        body = {"object": "error", "message": "The waiting queue is full.", "type": "Service "
                "Unavailable", "param": None, "code": 503}  # fmt: skip
        return web.json_response(body, status=503, headers={"Retry-After": "1"})


class GappyPublisher:
    """SGLang's KV-event PUB socket (XPUB, to know when the router subscribed), no replay."""

    def __init__(self) -> None:
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.bind("tcp://127.0.0.1:*")
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)

    async def wait_subscribed(self) -> None:
        assert await self.pub.poll(10_000), "the router never subscribed to the KV events"
        await self.pub.recv()

    async def publish_stored(self, seq: int, tokens: list[int], page: int) -> None:
        payload = encode_batch(EventBatch(0.0, [*page_stores(tokens, page)]))
        await self.pub.send_multipart(pub_frames(b"", seq, payload))

    def close(self) -> None:
        self.pub.close(linger=0)
        self.ctx.term()
