"""The admin API refuses what it cannot use with a 400 naming the field, never a 500, and the
aliases of one address are one worker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from tpuserve_router.app import RouterApp, create_router_app
from tpuserve_router.config import RouterConfig

pytestmark = pytest.mark.component


@pytest.fixture
async def router() -> AsyncIterator[RouterApp]:
    app = create_router_app(
        RouterConfig(host="127.0.0.1", port=0, health_check_interval_seconds=0),
        registry=CollectorRegistry(),
    )
    await app.start()
    yield app
    await app.stop()


HOSTILE_URLS = [
    "http://[::1", "http://[zz]:1", "http://h:99999", "http://h:0", "http://user:pw@h:1",
    "http://a b:1", "http://%41:1", "http://\u00e9xample:1", "ftp://h:1", "http://h:1/x",
    "http://" + "a" * 5000, "", 5, None, ["http://h:1"], {"url": "http://h:1"},
]  # fmt: skip


@pytest.mark.parametrize("url", HOSTILE_URLS)
async def test_a_malformed_worker_url_is_400_naming_the_url(router: RouterApp, url: object) -> None:
    async with aiohttp.ClientSession() as session:
        for method in ("POST", "DELETE"):
            async with session.request(
                method, router.base_url + "/workers", json={"url": url}
            ) as response:
                assert response.status == 400, (method, url, await response.text())
                assert (await response.json())["error"]["param"] == "url"
    assert router.registry.workers == []


async def test_aliases_of_one_worker_are_one_worker(router: RouterApp) -> None:
    aliases = ["http://localhost:8000", "http://127.0.0.1.:8000", "http://0x7f000001:8000"]
    async with aiohttp.ClientSession() as session:
        for alias in aliases:
            async with session.post(router.base_url + "/workers", json={"url": alias}) as answer:
                assert answer.status == 200
                assert (await answer.json())["worker"]["url"] == "http://127.0.0.1:8000"
        async with session.get(router.base_url + "/workers") as answer:
            workers = (await answer.json())["workers"]
    assert [w["url"] for w in workers] == ["http://127.0.0.1:8000"]
