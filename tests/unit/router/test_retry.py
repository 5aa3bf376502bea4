"""The retry rule: which failures go to another worker, and only while retries are left,
another candidate is healthy and the retry budget allows; through the router, a retried try
is counted as a retry and never as an answer."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from tests.fakes import fake_worker
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp, create_router_app
from tpuserve_router.config import RouterConfig
from tpuserve_router.engines.proxy import UpstreamError
from tpuserve_router.front.http_request import HttpRequest
from tpuserve_router.front.server import front_limits, serve
from tpuserve_router.pipeline.client import JSON_HEADERS
from tpuserve_router.pipeline.retry import (
    RETRYABLE_STATUSES,
    Attempt,
    RetryBudget,
    free_retry,
    retryable_error,
    should_retry,
)

pytestmark = pytest.mark.unit

ROUTE = "/v1/completions"


# ---------------------------------------------------------------- the rule alone


@pytest.mark.parametrize(
    ("reason", "response_started", "retryable"),
    [
        ("connect_error", False, True),
        ("reset_before_response", False, True),
        ("stream_broken", True, True),  # a whole body broke before the client saw it
        ("request_timeout", False, True),
        ("first_byte_timeout", False, True),  # beyond the time a working engine needs
        ("stream_stalled", True, True),  # a whole body stalled before the client saw it
        ("request_timeout", True, False),  # the request's time is up
        ("response_too_large", True, False),  # another worker would answer as much
    ],
)
def test_which_worker_failures_are_retryable(
    reason: str, response_started: bool, retryable: bool
) -> None:
    err = UpstreamError(reason, "detail", response_started=response_started)
    assert retryable_error(err) is retryable


def test_overloaded_failing_or_unavailable_answers_are_retryable() -> None:
    assert frozenset({429, 500, 502, 503, 504}) == RETRYABLE_STATUSES


def unlimited() -> RetryBudget:
    return RetryBudget(100, 1000)


def test_a_retryable_failure_is_retried_while_retries_are_left() -> None:
    sick, other = fake_worker("sick"), fake_worker("other")
    assert should_retry(True, 0, 2, sick, [sick, other], unlimited(), 1)
    assert should_retry(True, 1, 2, sick, [sick, other], unlimited(), 1)
    assert not should_retry(True, 2, 2, sick, [sick, other], unlimited(), 1)
    assert not should_retry(True, 0, 0, sick, [sick, other], unlimited(), 1)


def test_a_failure_that_is_not_retryable_is_never_retried() -> None:
    sick, other = fake_worker("sick"), fake_worker("other")
    assert not should_retry(False, 0, 2, sick, [sick, other], unlimited(), 1)


def test_a_retry_needs_another_healthy_candidate() -> None:
    sick = fake_worker("sick")
    budget = unlimited()
    assert not should_retry(True, 0, 2, sick, [sick], budget, 1)
    assert not should_retry(True, 0, 2, sick, [sick, fake_worker("down", healthy=False)], budget, 1)
    up = fake_worker("up")
    assert should_retry(True, 0, 2, sick, [fake_worker("down", healthy=False), up], budget, 1)


def test_the_budget_bounds_requests_being_retried_to_a_share_of_those_in_flight() -> None:
    denied: list[int] = []
    budget = RetryBudget(20, 3, lambda: denied.append(1))
    sick, other = fake_worker("sick"), fake_worker("other")
    budget.active = 3  # the minimum is always allowed, and no more with few in flight
    assert not should_retry(True, 0, 2, sick, [sick, other], budget, 10)
    assert should_retry(True, 0, 2, sick, [sick, other], budget, 20)  # 20 % of 20 = 4 > 3
    assert should_retry(True, 1, 2, sick, [sick, other], budget, 10)  # it holds one already
    assert len(denied) == 1
    budget.active = 2
    assert should_retry(True, 0, 2, sick, [sick, other], budget, 1)


@pytest.mark.parametrize(
    ("error", "free"),
    [
        (UpstreamError("connect_error", "refused"), True),
        (UpstreamError("reset_before_response", "reset"), True),
        (UpstreamError("worker_down", "ejected"), True),
        (UpstreamError("first_byte_timeout", "no answer within 1 s"), False),  # maybe slow
        (UpstreamError("first_byte_timeout", "no answer, no probe passed", silent=True), True),
        (UpstreamError("stream_stalled", "nothing for 30 s", response_started=True), False),
    ],
)
def test_only_a_gone_or_silent_workers_failures_retry_outside_the_budget(
    error: UpstreamError, free: bool
) -> None:
    """A worker that is gone, or answered neither the request by its floor nor a health
    probe (presumed gone), has its requests retried without spending the budget; one that
    may only be slow, or a stream already started, spends it (or is not retried)."""
    assert free_retry(error) is free


def test_an_attempt_either_answered_or_goes_elsewhere() -> None:
    assert {a.name for a in Attempt} == {"ANSWERED", "RETRY"}


# ---------------------------------------------------------------- through the router

COMPLETION = (
    b'{"id":"c","object":"text_completion","choices":[{"index":0,"text":"ok",'
    b'"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}'
)

Answer = Callable[[HttpRequest], Awaitable[None]]


def answering(status: int) -> Answer:
    async def handle(request: HttpRequest) -> None:
        if request.path == "/v1/models":
            request.respond(404, JSON_HEADERS, b"{}")  # serves any model
        elif status == 200:
            request.respond(200, JSON_HEADERS, COMPLETION)
        else:
            request.respond(status, JSON_HEADERS, b'{"error":"busy"}')

    return handle


async def never_answering(request: HttpRequest) -> None:
    if request.path == "/v1/models":
        request.respond(404, JSON_HEADERS, b"{}")
        return
    await asyncio.Event().wait()  # cancelled when the router gives up and closes


def refused_url() -> str:
    """A loopback address nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@asynccontextmanager
async def router_in_front_of(
    first: Answer | str, second: Answer, **settings: float
) -> AsyncIterator[RouterApp]:
    """A least_load router (ties go to the first listed) in front of two workers; ``first``
    is a handler to serve or a URL to use as it is."""
    servers = []
    urls = []
    for worker in (first, second):
        if isinstance(worker, str):
            urls.append(worker)
            continue
        server = await serve(worker, "127.0.0.1", 0, front_limits(RouterConfig()))
        servers.append(server)
        urls.append(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    config = RouterConfig(
        host="127.0.0.1",
        port=0,
        workers=tuple(urls),
        policy="least_load",
        health_check_interval_seconds=0,  # admitted at once, never probed
    ).replace(**settings)
    app = create_router_app(config, registry=CollectorRegistry())
    await app.start()
    try:
        await eventually_async(
            lambda: all(w.healthy for w in app.registry.workers), what="both workers routable"
        )
        yield app
    finally:
        await app.stop()
        for server in servers:
            server.close()
            await server.wait_closed()


async def complete(app: RouterApp) -> int:
    async with aiohttp.ClientSession() as session:
        body = {"model": "m", "prompt": "hello", "max_tokens": 1}
        async with session.post(app.base_url + ROUTE, json=body) as response:
            await response.read()
            return response.status


def value(app: RouterApp, name: str, **labels: str) -> float:
    return app.metrics.registry.get_sample_value(name, labels) or 0.0


def answered(app: RouterApp, worker: int, status: str) -> float:
    return value(
        app,
        "tpuserve_router_requests_total",
        model="",  # the stubs list no models: a name they never reported is no label value
        worker=app.registry.workers[worker].name,
        route=ROUTE,
        status=status,
    )


async def test_a_retryable_status_goes_to_the_other_worker_and_counts_once() -> None:
    async with router_in_front_of(answering(503), answering(200)) as app:
        assert await complete(app) == 200
        busy = app.registry.workers[0].name
        assert value(app, "tpuserve_router_retries_total", route=ROUTE) == 1
        assert (
            value(
                app, "tpuserve_router_upstream_errors_total", worker=busy, reason="retryable_status"
            )
            == 1
        )
        assert (answered(app, 0, "503"), answered(app, 1, "200")) == (0, 1)
        assert all(w.in_flight == 0 for w in app.registry.workers)


async def test_without_retries_left_the_status_reaches_the_client() -> None:
    async with router_in_front_of(answering(503), answering(200), max_retries=0) as app:
        assert await complete(app) == 503
        assert value(app, "tpuserve_router_retries_total", route=ROUTE) == 0
        assert (answered(app, 0, "503"), answered(app, 1, "200")) == (1, 0)


async def test_a_refused_connection_is_retried_on_the_other_worker() -> None:
    async with router_in_front_of(refused_url(), answering(200)) as app:
        assert await complete(app) == 200
        refused = app.registry.workers[0].name
        assert value(app, "tpuserve_router_retries_total", route=ROUTE) == 1
        assert (
            value(
                app, "tpuserve_router_upstream_errors_total", worker=refused, reason="connect_error"
            )
            == 1
        )


async def test_no_answer_within_the_derived_time_is_retried_on_the_other_worker() -> None:
    async with router_in_front_of(
        never_answering,
        answering(200),
        first_byte_timeout_seconds=0.2,
        first_byte_timeout_floor_seconds=0.1,
    ) as app:
        assert await complete(app) == 200
        assert value(app, "tpuserve_router_retries_total", route=ROUTE) == 1
        assert (answered(app, 0, "504"), answered(app, 1, "200")) == (0, 1)


async def test_without_retries_left_no_answer_in_time_is_504() -> None:
    async with router_in_front_of(
        never_answering,
        answering(200),
        first_byte_timeout_seconds=0.2,
        first_byte_timeout_floor_seconds=0.1,
        max_retries=0,
    ) as app:
        assert await complete(app) == 504
        assert (answered(app, 0, "504"), answered(app, 1, "200")) == (1, 0)
