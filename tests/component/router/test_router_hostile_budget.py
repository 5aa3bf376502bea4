"""Hostile clients against the buffer budget (issue 57, item 3): bodies sent to routes that take
none, and one client (an address, or a key's tenant) holding large bodies half sent, while
other clients' requests go on. Real HTTP on loopback to a router in front of an engine twin;
the victims use the official ``openai`` client without retries, so one 503 fails the test.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import openai
import orjson
import pytest

from tests.component.router.router_fleet import (
    MODEL,
    EngineTwin,
    sample,
    start_engines,
    start_router,
)
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig

pytestmark = pytest.mark.component

MIB = 1024 * 1024
BUDGET_BYTES = 128 * MIB
DECLARED_BYTES = 32 * MIB
SENT_BYTES = 16 * MIB  # of each flooding body: sent, then held (never finished)
KEYS = {"tenant": "sk-tenant-0123456789abcdef", "flooder": "sk-flooder-0123456789abcde"}


@pytest.fixture(scope="module")
def twin() -> Iterator[EngineTwin]:
    [engine] = start_engines(1, ["--time-scale", "0"], kv_events=False)
    yield engine
    engine.stop()


async def router_for(twin: EngineTwin, tmp_path: Path, *, keys: bool) -> RouterApp:
    settings: dict[str, object] = {}
    if keys:
        path = tmp_path / "keys.json"
        entries = [
            {"key": KEYS["tenant"], "tenant": "acme"},
            {"key": KEYS["flooder"], "tenant": "flood", "priority": "low"},
        ]
        path.write_bytes(orjson.dumps({"keys": entries}))
        settings["api_keys_file"] = str(path)
    config = RouterConfig(
        workers=(twin.url,),
        policy="round_robin",
        health_check_interval_seconds=0.5,
        max_buffered_bytes=BUDGET_BYTES,
        max_request_bytes=DECLARED_BYTES,
        **settings,  # type: ignore[arg-type]
    )
    app = await start_router(config, ready_workers=1)
    return app


@pytest.fixture
async def keyed(twin: EngineTwin, tmp_path: Path) -> AsyncIterator[RouterApp]:
    app = await router_for(twin, tmp_path, keys=True)
    yield app
    await app.stop()


@pytest.fixture
async def keyless(twin: EngineTwin, tmp_path: Path) -> AsyncIterator[RouterApp]:
    app = await router_for(twin, tmp_path, keys=False)
    yield app
    await app.stop()


class HeldUpload:
    """A POST declaring `DECLARED_BYTES` whose body stops after `SENT_BYTES`: the client keeps
    the connection open without finishing (or reading) until `close`."""

    def __init__(self, app: RouterApp, path: str, key: str | None, source: str) -> None:
        self.app = app
        self.path = path
        self.key = key
        self.source = source
        self.writer: asyncio.StreamWriter | None = None
        self.reader: asyncio.StreamReader | None = None

    async def send(self) -> str:
        """Send the head and `SENT_BYTES` of the body; the status line if one came back by
        then (the router answered at the head), else ""."""
        self.reader, self.writer = await asyncio.open_connection(
            "127.0.0.1", self.app.port, local_addr=(self.source, 0)
        )
        auth = f"authorization: Bearer {self.key}\r\n" if self.key else ""
        self.writer.write(
            f"POST {self.path} HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\n"
            f"{auth}content-length: {DECLARED_BYTES}\r\n\r\n".encode()
        )
        chunk = b"x" * MIB
        try:
            for _ in range(SENT_BYTES // MIB):
                self.writer.write(chunk)
                await self.writer.drain()
        except ConnectionError:
            pass
        with contextlib.suppress(TimeoutError, ConnectionError):
            line = await asyncio.wait_for(self.reader.readline(), 0.5)
            return line.decode().strip()
        return ""

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def completions(app: RouterApp, key: str, count: int) -> list[str]:
    """``count`` small completions one after another, without retries: each one's outcome."""
    outcomes = []
    async with openai.AsyncOpenAI(
        base_url=app.base_url + "/v1", api_key=key, max_retries=0, timeout=60
    ) as oa:
        for _ in range(count):
            try:
                answer = await oa.completions.create(model=MODEL, prompt="hello", max_tokens=2)
                outcomes.append("ok" if answer.choices else "empty")
            except openai.APIStatusError as err:
                outcomes.append(str(err.status_code))
    return outcomes


async def test_bodies_to_routes_that_take_none_are_refused_unread(keyed: RouterApp) -> None:
    """16 keyless 32 MiB POSTs to ``/nope`` and ``/health`` (16 MiB sent, then held)."""
    flood = [
        HeldUpload(keyed, "/nope" if i % 2 else "/health", None, "127.0.0.1") for i in range(16)
    ]
    try:
        answers = await asyncio.gather(*(upload.send() for upload in flood))
        served = await completions(keyed, KEYS["tenant"], 8)
        held = keyed.book.buffers.used
    finally:
        for upload in flood:
            upload.close()
    assert served == ["ok"] * 8
    assert held == 0  # none of the flood's bytes were charged
    assert sorted(set(answers)) == ["HTTP/1.1 404 Not Found", "HTTP/1.1 405 Method Not Allowed"]
    assert (
        sample(keyed, "tpuserve_router_connections_closed_total", {"reason": "unexpected_body"})
        == 16
    )


async def test_a_keys_tenant_holds_at_most_its_share_of_the_budget(keyed: RouterApp) -> None:
    """A ``low`` key's 8 half-sent 32 MiB completions: the tenant's share (a quarter of the
    budget) fills, the rest are 503 naming the share, and another tenant is served."""
    flood = [HeldUpload(keyed, "/v1/completions", KEYS["flooder"], "127.0.0.1") for _ in range(8)]
    try:
        answers = await asyncio.gather(*(upload.send() for upload in flood))
        held = keyed.book.buffers.used
        served = await completions(keyed, KEYS["tenant"], 8)
    finally:
        for upload in flood:
            upload.close()
    assert served == ["ok"] * 8
    assert held <= keyed.config.client_buffer_bytes() < BUDGET_BYTES
    assert answers.count("HTTP/1.1 503 Service Unavailable") >= 8 - 2


async def test_one_address_holds_at_most_its_share_of_the_budget(keyless: RouterApp) -> None:
    """Without keys, one address's 8 half-sent 32 MiB completions do not lock out a client
    at another address (127.0.0.2)."""
    flood = [HeldUpload(keyless, "/v1/completions", None, "127.0.0.1") for _ in range(8)]
    try:
        answers = await asyncio.gather(*(upload.send() for upload in flood))
        held = keyless.book.buffers.used
        other = HeldUpload(keyless, "/v1/completions", None, "127.0.0.2")
        reply = await other.send()  # half sent: it holds its bytes too, under its own share
        other.close()
    finally:
        for upload in flood:
            upload.close()
    assert reply == ""  # no refusal: its body is being read
    assert held <= keyless.config.client_buffer_bytes() < BUDGET_BYTES
    assert answers.count("HTTP/1.1 503 Service Unavailable") >= 8 - 2
