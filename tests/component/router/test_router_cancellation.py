"""Work nobody waits for is aborted on the worker (SGLang's /abort_request by rid): when the
client leaves, streamed or not, and when the router gives up on a slow worker; the router
names every request itself (never by the client's rid, which only its answer carries)."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from typing import Any

import orjson
import pytest

from tests.fakes import STUB_MODEL, StubWorker, stub_router
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp

pytestmark = pytest.mark.component


def router(*workers: StubWorker, **settings: Any) -> AbstractAsyncContextManager[RouterApp]:
    """A least_load router in front of started ``workers``, admitting them at once."""
    return stub_router(*workers, **{"health_check_interval_seconds": 0, **settings})


def request_bytes(body: dict[str, Any]) -> bytes:
    data = orjson.dumps(body)
    return (
        b"POST /v1/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(data)
    ) + data


async def leave_after_sending(app: RouterApp, worker: StubWorker, body: dict[str, Any]) -> None:
    """Send a request, wait until the worker has it, then close the connection."""
    _, writer = await asyncio.open_connection("127.0.0.1", app.port)
    writer.write(request_bytes(body))
    await eventually_async(lambda: worker.in_progress == 1, what="the worker holding it")
    writer.close()


def aborts(app: RouterApp, reason: str) -> float:
    value = app.metrics.registry.get_sample_value(
        "tpuserve_router_upstream_aborts_total",
        {"worker": app.registry.workers[0].name, "reason": reason},
    )
    return value or 0.0


async def test_a_client_leaving_a_plain_request_has_it_aborted_by_the_rid_it_was_given() -> None:
    hang = StubWorker("hang")
    async with router(hang) as app:
        await leave_after_sending(app, hang, {"model": STUB_MODEL, "prompt": "hi"})
        await eventually_async(lambda: hang.aborted, what="an abort sent to the worker")
        sent = orjson.loads(hang.bodies[0])
        assert hang.bodies[0].startswith(b'{"rid":"')  # named at the front, nothing else moved
        assert len(sent["rid"]) == 32
        assert sent["prompt"] == "hi"
        assert hang.aborted == [sent["rid"]]
        assert aborts(app, "client_gone") == 1


async def test_a_client_leaving_a_stream_has_it_aborted_by_the_routers_id() -> None:
    stall = StubWorker("stall")
    async with router(stall) as app:
        body = {"model": STUB_MODEL, "prompt": "hi", "stream": True, "rid": "client-rid"}
        await leave_after_sending(app, stall, body)
        await eventually_async(lambda: stall.aborted, what="an abort sent to the worker")
        ours = orjson.loads(stall.bodies[0])["rid"]
        assert len(ours) == 32  # the client's own rid never reaches the worker
        assert stall.aborted == [ours]


async def test_a_worker_the_router_gives_up_on_is_asked_to_abort() -> None:
    hang, ok = StubWorker("hang"), StubWorker()
    async with router(hang, ok, first_byte_timeout_seconds=0.2) as app:
        reader, writer = await asyncio.open_connection("127.0.0.1", app.port)
        writer.write(request_bytes({"model": STUB_MODEL, "prompt": "hi", "max_tokens": 1}))
        assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 200")  # retried on ok
        writer.close()
        await eventually_async(lambda: hang.aborted, what="an abort sent to the slow worker")
        assert hang.aborted == [orjson.loads(hang.bodies[0])["rid"]]
        assert aborts(app, "gave_up") == 1


async def test_a_batch_is_renamed_and_left_to_the_engine() -> None:
    hang = StubWorker("hang")
    async with router(hang) as app:
        body = {"model": STUB_MODEL, "prompt": ["a", "b"], "rid": "their-batch"}
        await leave_after_sending(app, hang, body)
        await eventually_async(lambda: hang.in_progress == 0, what="the upstream closed")
        sent = orjson.loads(hang.bodies[0])
        assert len(sent.pop("rid")) == 32  # one id of the router's (SGLang names each item)
        assert sent == {k: v for k, v in body.items() if k != "rid"}
        assert hang.aborted == []
