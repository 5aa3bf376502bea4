"""Scale from zero at the router, over real HTTP: requests that arrive while no worker is
routable are held, then sent in arrival order once a stub worker appears (streams start
then); past the bound or the hold time they get 503 with Retry-After; a client that leaves is
dropped from the queue. States and counts, never time."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import aiohttp
import pytest

from tests.fakes import STUB_MODEL, StubWorker, stub_router
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp
from tpuserve_router.engines.workers import Worker, WorkerSpec
from tpuserve_router.policies.base import Decision, RouteRequest

pytestmark = pytest.mark.component

ROUTES = ("/v1/completions", "/v1/chat/completions", "/generate")


def body(route: str, text: str, stream: bool = False) -> dict[str, Any]:
    if route == "/v1/chat/completions":
        return {
            "model": STUB_MODEL,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 1,
            "stream": stream,
        }
    if route == "/generate":
        return {"text": text, "sampling_params": {"max_new_tokens": 1}, "stream": stream}
    return {"model": STUB_MODEL, "prompt": text, "max_tokens": 1, "stream": stream}


async def post(
    session: aiohttp.ClientSession, app: RouterApp, route: str, payload: dict[str, Any]
) -> tuple[int, dict[str, str], bytes]:
    async with session.post(app.base_url + route, json=payload) as answer:
        return answer.status, dict(answer.headers), await answer.read()


def sample(app: RouterApp, name: str, **labels: str) -> float:
    return app.metrics.registry.get_sample_value(name, labels) or 0.0


async def held(app: RouterApp, count: int) -> None:
    await eventually_async(lambda: app.pipeline.holds.total == count, what=f"{count} requests held")


async def bring_up(app: RouterApp, worker: StubWorker) -> None:
    """The first worker appears (as discovery would add a new leader pod)."""
    await worker.start()
    app.registry.add(WorkerSpec(worker.url))


def record_choices(app: RouterApp, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The routing text of every request, in the order the policy was asked."""
    asked: list[str] = []
    choose = app.pipeline.policy.choose

    def recording(request: RouteRequest, workers: Sequence[Worker]) -> Decision[Worker]:
        asked.append(request.text or "")
        return choose(request, workers)

    monkeypatch.setattr(app.pipeline.policy, "choose", recording)
    return asked


async def test_requests_held_at_zero_are_sent_in_arrival_order_once_a_worker_appears(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker = StubWorker()
    total = 9
    async with stub_router(
        policy="cache_aware", hold_max_requests=total, hold_models=(STUB_MODEL,)
    ) as app:
        asked = record_choices(app, monkeypatch)
        async with aiohttp.ClientSession() as session:
            async with session.get(app.base_url + "/readiness") as ready:
                assert ready.status == 200  # ready at zero: it takes requests to hold
            tasks = []
            for i in range(total):  # one at a time, so their arrival order is known
                route = ROUTES[i % 2]  # the OpenAI routes name the model: one queue
                tasks.append(
                    asyncio.ensure_future(post(session, app, route, body(route, f"req{i:02d}")))
                )
                await held(app, i + 1)
            assert sample(app, "tpuserve_router_held_requests", model=STUB_MODEL) == total
            assert worker.generation_requests == 0
            await bring_up(app, worker)
            answers = await asyncio.gather(*tasks)
        assert [status for status, _, _ in answers] == [200] * total
        assert [a[a.index("req") : a.index("req") + 5] for a in asked] == [
            f"req{i:02d}" for i in range(total)
        ]
        assert worker.generation_requests == total
        assert (
            sample(
                app, "tpuserve_router_hold_outcomes_total", model=STUB_MODEL, outcome="dispatched"
            )
            == total
        )
        assert sample(app, "tpuserve_router_held_requests", model=STUB_MODEL) == 0
        assert sample(app, "tpuserve_router_hold_seconds_count", model=STUB_MODEL) == total


async def test_held_streams_start_once_a_worker_appears() -> None:
    worker = StubWorker("stream")
    async with stub_router(hold_max_requests=8) as app, aiohttp.ClientSession() as session:
        tasks = [
            asyncio.ensure_future(
                post(session, app, route, body(route, f"stream {route}", stream=True))
            )
            for route in ROUTES
        ]
        await held(app, len(ROUTES))
        # No worker has said which models it serves: they wait as `other`.
        assert sample(app, "tpuserve_router_held_requests", model="other") == len(ROUTES)
        await bring_up(app, worker)
        answers = await asyncio.gather(*tasks)
    for status, headers, content in answers:
        assert status == 200
        assert headers["Content-Type"] == "text/event-stream"
        assert content.endswith(b"data: [DONE]\n\n")


async def test_past_the_bound_a_request_gets_503_with_retry_after_at_once() -> None:
    worker = StubWorker()
    async with stub_router(hold_max_requests=2, hold_models=(STUB_MODEL,)) as app:
        route = "/v1/completions"
        async with aiohttp.ClientSession() as session:
            first = [
                asyncio.ensure_future(post(session, app, route, body(route, f"held {i}")))
                for i in range(2)
            ]
            await held(app, 2)
            status, headers, content = await post(session, app, route, body(route, "third"))
            assert status == 503
            assert headers["Retry-After"]
            assert b"--hold-max-requests 2" in content
            assert app.pipeline.holds.total == 2  # the two before it still wait
            await bring_up(app, worker)
            assert [s for s, _, _ in await asyncio.gather(*first)] == [200, 200]
        assert (
            sample(
                app, "tpuserve_router_hold_outcomes_total", model=STUB_MODEL, outcome="queue_full"
            )
            == 1
        )


async def test_past_the_hold_time_a_request_gets_503_with_retry_after() -> None:
    async with stub_router(hold_max_requests=4, hold_max_seconds=0.2) as app:
        route = "/v1/chat/completions"
        async with aiohttp.ClientSession() as session:
            status, headers, content = await post(session, app, route, body(route, "alone"))
        assert status == 503
        assert headers["Retry-After"]
        assert b"--hold-max-seconds" in content
        assert (
            sample(app, "tpuserve_router_hold_outcomes_total", model="other", outcome="timeout")
            == 1
        )
        assert app.pipeline.holds.total == 0


async def test_a_client_that_leaves_is_removed_from_the_queue() -> None:
    async with stub_router(hold_max_requests=4, hold_models=(STUB_MODEL,)) as app:
        route = "/v1/completions"
        async with aiohttp.ClientSession() as session:
            leaving = asyncio.ensure_future(post(session, app, route, body(route, "bye")))
            await held(app, 1)
            leaving.cancel()  # closes its connection: the router sees the client go
        await held(app, 0)
        await eventually_async(
            lambda: (
                sample(
                    app,
                    "tpuserve_router_hold_outcomes_total",
                    model=STUB_MODEL,
                    outcome="client_gone",
                )
                == 1
            ),
            what="the departure counted",
        )


async def test_without_holding_a_router_with_no_worker_is_not_ready() -> None:
    async with stub_router() as app, aiohttp.ClientSession() as session:
        async with session.get(app.base_url + "/readiness") as ready:
            assert ready.status == 503
        route = "/v1/completions"
        status, _headers, _ = await post(session, app, route, body(route, "now"))
        assert status == 404  # no worker reported any model: as before holding existed


async def test_a_request_for_an_adapter_no_worker_has_is_answered_at_once_not_held() -> None:
    """Its model has a routable worker: held, it would block the model's queue until the
    hold time passed; it gets its 404 and the next request is served."""
    worker = StubWorker()
    async with (
        stub_router(
            worker, hold_max_requests=8, hold_models=(STUB_MODEL,), hold_max_seconds=2
        ) as app,
        aiohttp.ClientSession() as session,
    ):
        route = "/v1/completions"
        typo = {**body(route, "typo"), "lora_path": "typo"}
        status, _headers, content = await post(session, app, route, typo)
        assert status == 404, content
        assert b"typo" in content
        status, _headers, content = await post(session, app, route, body(route, "next"))
        assert status == 200, content
        assert (
            sample(app, "tpuserve_router_hold_outcomes_total", model=STUB_MODEL, outcome="timeout")
            == 0
        )


async def test_a_router_stopping_refuses_held_requests_with_503_and_retry_after() -> None:
    async with stub_router(hold_max_requests=4, hold_models=(STUB_MODEL,)) as app:
        route = "/v1/completions"
        async with aiohttp.ClientSession() as session:
            waiting = asyncio.ensure_future(post(session, app, route, body(route, "held")))
            await held(app, 1)
            await app.stop()  # stub_router's own stop afterwards finds nothing left to do
            status, headers, content = await waiting
        assert status == 503
        assert headers["Retry-After"]
        assert b"stopping" in content
        assert (
            sample(app, "tpuserve_router_hold_outcomes_total", model=STUB_MODEL, outcome="shutdown")
            == 1
        )


async def test_held_requests_do_not_count_toward_max_in_flight() -> None:
    """A burst for a model at zero must not shed the requests of a model that is up."""
    worker = StubWorker()
    async with stub_router(
        worker, max_in_flight=1, hold_max_requests=4, hold_models=(STUB_MODEL, "zeroed")
    ) as app:
        route = "/v1/completions"
        async with aiohttp.ClientSession() as session:
            zeroed = {**body(route, "held"), "model": "zeroed"}
            waiting = asyncio.ensure_future(post(session, app, route, zeroed))
            await held(app, 1)
            status, _headers, content = await post(session, app, route, body(route, "up"))
            assert status == 200, content
            assert app.pipeline.in_flight == 0
            waiting.cancel()
        await held(app, 0)


async def test_held_requests_leave_within_their_models_share_none_refused() -> None:
    """Held past its model's --max-in-flight-per-model, a request waits in the queue for its
    model's room, as for the router's: released all at once, the excess would get 429."""
    worker = StubWorker()
    total, share = 6, 2
    async with stub_router(
        hold_max_requests=total, hold_models=(STUB_MODEL,), max_in_flight_per_model=share
    ) as app:
        async with aiohttp.ClientSession() as session:
            route = "/v1/completions"
            tasks = [
                asyncio.ensure_future(post(session, app, route, body(route, f"req{i}")))
                for i in range(total)
            ]
            await held(app, total)
            await bring_up(app, worker)
            answers = await asyncio.gather(*tasks)
        assert [status for status, _, _ in answers] == [200] * total
        assert worker.generation_requests == total
