"""Router hygiene: a request a worker has read is never sent to it again on a fresh
connection, and a native /generate without a prompt never reaches a worker."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.fakes import STUB_COMPLETION, STUB_MODEL, StubWorker, stub_router
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp, create_router_app
from tpuserve_router.config import RouterConfig
from tpuserve_router.pipeline.request_body import GENERATION_ROUTES

pytestmark = pytest.mark.component

MODELS = b'{"object":"list","data":[{"id":"%s","object":"model"}]}' % STUB_MODEL.encode()


class HalfAnsweringWorker:
    """Answers the first generation request of each connection in full (keep-alive), then
    starts a head for the next one and hangs up: it read that request."""

    def __init__(self) -> None:
        self.generation_requests = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                     if line.startswith(b"content-length:")), 0,
                )  # fmt: skip
                await reader.readexactly(length)
                path = head.split(b" ")[1]
                if path != b"/v1/completions":  # probes, /v1/models, /server_info
                    body = MODELS if path == b"/v1/models" else b"{}"
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
                    )
                    continue
                self.generation_requests += 1
                if answered:
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-le")  # read it, then hung up
                    await writer.drain()
                    break
                answered += 1
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d"
                    b"\r\n\r\n%s" % (len(STUB_COMPLETION), STUB_COMPLETION)
                )
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


async def complete(session: aiohttp.ClientSession, app: RouterApp) -> int:
    body = {"model": STUB_MODEL, "prompt": "hi", "max_tokens": 1}
    async with session.post(app.base_url + "/v1/completions", json=body) as answer:
        await answer.read()
        return answer.status


async def test_a_request_the_worker_read_is_not_resent_to_it() -> None:
    worker = HalfAnsweringWorker()
    url = await worker.start()
    app = create_router_app(
        RouterConfig(host="127.0.0.1", port=0, workers=(url,), health_check_interval_seconds=0.05),
    )
    await app.start()
    try:
        await eventually_async(
            lambda: all(w.healthy for w in app.registry.workers), what="worker routable"
        )
        async with aiohttp.ClientSession() as session:
            assert await complete(session, app) == 200
            # the pooled connection is reused; the worker reads the request and breaks off
            assert await complete(session, app) == 502
        assert worker.generation_requests == 2  # not a third time on a fresh connection
    finally:
        await app.stop()
        await worker.stop()


@pytest.mark.parametrize(
    "body",
    [{"text": ""}, {"text": [""]}, {"text": ["a", ""]}, {}, {"sampling_params": {}}],
    ids=["empty", "empty-in-list", "one-empty", "no-prompt", "only-params"],
)
async def test_a_generate_without_a_prompt_is_refused_naming_text(body: dict[str, object]) -> None:
    assert "/generate" in GENERATION_ROUTES
    worker = StubWorker()
    async with stub_router(worker) as app, aiohttp.ClientSession() as session:
        async with session.post(app.base_url + "/generate", json=body) as answer:
            assert answer.status == 400
            error = (await answer.json())["error"]
        assert error["param"] == "text"
        assert worker.generation_requests == 0
