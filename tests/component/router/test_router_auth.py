"""Through the router with API keys: no key or a wrong one is 401, a tenant over its rate
limit 429 with Retry-After and rate-limit headers, low priority shed first under overload,
the admin API only for admin keys (or this host, by default), all counted per tenant."""

from __future__ import annotations

import asyncio
import logging
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.fakes import STUB_MODEL, StubWorker, stub_router
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp
from tpuserve_router.tenancy.auth import digest_of, key_id

pytestmark = pytest.mark.component

KEYS = {
    "critical": "sk-critical-0123456789",
    "normal": "sk-normal-0123456789ab",
    "low": "sk-low-0123456789abcdef",
    "limited": "sk-limited-0123456789ab",
    "thrifty": "sk-thrifty-0123456789ab",
    "admin": "sk-admin-0123456789abcd",
}
ENTRIES = [
    {"key": KEYS["critical"], "tenant": "acme", "priority": "critical"},
    {"key": KEYS["normal"], "tenant": "acme"},
    {"key": KEYS["low"], "tenant": "batch", "priority": "low"},
    {"key": KEYS["limited"], "tenant": "trial", "requests_per_minute": 2},
    {"key": KEYS["thrifty"], "tenant": "trial", "tokens_per_minute": 5},
    {"key": KEYS["admin"], "tenant": "ops", "admin": True},
]


def key_label(name: str) -> str:
    """How metrics name the key `KEYS[name]`: its key id, never its tenant."""
    return key_id(digest_of(KEYS[name].encode()))


def router(
    tmp_path: Path, worker: StubWorker, **settings: Any
) -> AbstractAsyncContextManager[RouterApp]:
    """`stub_router` in front of ``worker``, with `ENTRIES` as its keys file."""
    path = tmp_path / "keys.json"
    path.write_bytes(orjson.dumps({"keys": ENTRIES}))
    return stub_router(worker, api_keys_file=str(path), **settings)


async def complete(
    session: aiohttp.ClientSession, app: RouterApp, key: str | None, **headers: str
) -> tuple[int, dict[str, str], dict[str, Any]]:
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    body = {"model": STUB_MODEL, "prompt": "hi", "max_tokens": 1}
    async with session.post(app.base_url + "/v1/completions", json=body, headers=headers) as answer:
        return answer.status, dict(answer.headers), await answer.json()


def sample(app: RouterApp, name: str, **labels: str) -> float:
    return app.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_only_a_known_key_is_served(tmp_path: Path) -> None:
    worker = StubWorker()
    async with router(tmp_path, worker) as app, aiohttp.ClientSession() as session:
        status, headers, body = await complete(session, app, None)
        assert (status, headers["WWW-Authenticate"]) == (401, "Bearer")
        assert "provide an API key" in body["error"]["message"]
        status, _, body = await complete(session, app, "sk-wrong-0123456789")
        assert (status, body["error"]["message"]) == (401, "Incorrect API key provided.")
        assert (await complete(session, app, KEYS["normal"]))[0] == 200
        assert (await complete(session, app, None, **{"x-api-key": KEYS["normal"]}))[0] == 200
        async with session.get(app.base_url + "/v1/models") as answer:
            assert answer.status == 401
        async with session.get(app.base_url + "/health") as answer:
            assert answer.status == 200  # probes need no key
        assert sample(app, "tpuserve_router_auth_failures_total", reason="missing") == 2
        assert sample(app, "tpuserve_router_auth_failures_total", reason="invalid") == 1
        normal = key_label("normal")
        assert sample(
            app, "tpuserve_router_tenant_requests_total",
            key=normal, priority="normal", status="200",
        ) == 2  # fmt: skip
        assert sample(app, "tpuserve_router_tenant_tokens_total", key=normal, kind="prompt") == 6
        async with session.get(app.base_url + "/metrics") as answer:
            exposed = await answer.text()
        assert f'key="{normal}"' in exposed
        assert not [t for t in ("acme", "batch", "trial", "ops") if f'"{t}"' in exposed]
        credentials = {b"authorization", b"x-api-key"}
        assert all(not credentials & {name for name, _ in h} for h in worker.headers)


async def test_a_key_over_its_limits_gets_429_saying_when_to_return(tmp_path: Path) -> None:
    async with router(tmp_path, StubWorker()) as app, aiohttp.ClientSession() as session:
        assert [(await complete(session, app, KEYS["limited"]))[0] for _ in range(2)] == [200, 200]
        status, headers, body = await complete(session, app, KEYS["limited"])
        assert status == 429
        assert body["error"]["type"] == "rate_limit_exceeded"
        assert int(headers["Retry-After"]) >= 1
        assert headers["x-ratelimit-limit-requests"] == "2"
        assert headers["x-ratelimit-remaining-requests"] == "0"
        # 5 tokens a minute: each answer spends 4 (3 prompt + 1 completion), after it arrives
        assert (await complete(session, app, KEYS["thrifty"]))[0] == 200
        assert (await complete(session, app, KEYS["thrifty"]))[0] == 200
        status, headers, _ = await complete(session, app, KEYS["thrifty"])
        assert (status, headers["x-ratelimit-limit-tokens"]) == (429, "5")
        assert (
            sample(
                app,
                "tpuserve_router_rate_limited_total",
                key=key_label("limited"),
                limit="requests",
            )
            == 1
        )
        assert (
            sample(
                app, "tpuserve_router_rate_limited_total", key=key_label("thrifty"), limit="tokens"
            )
            == 1
        )
        assert (await complete(session, app, KEYS["normal"]))[0] == 200  # others unaffected


async def test_every_answer_to_a_limited_key_carries_its_rate_limit_headers(
    tmp_path: Path,
) -> None:
    async with router(tmp_path, StubWorker()) as app, aiohttp.ClientSession() as session:
        status, headers, _ = await complete(session, app, KEYS["limited"])
        assert status == 200
        assert headers["x-ratelimit-limit-requests"] == "2"
        assert headers["x-ratelimit-remaining-requests"] == "1"  # after taking this one
        assert headers["x-ratelimit-reset-requests"].endswith("s")
        assert "x-ratelimit-limit-tokens" not in headers  # no token limit for this key
        status, headers, _ = await complete(session, app, KEYS["thrifty"])
        assert (status, headers["x-ratelimit-limit-tokens"]) == (200, "5")
        assert headers["x-ratelimit-remaining-tokens"] == "4"  # its max_tokens, 1, reserved
        async with session.post(
            app.base_url + "/v1/completions",
            json={"model": STUB_MODEL, "prompt": 7},
            headers={"Authorization": f"Bearer {KEYS['thrifty']}"},
        ) as answer:  # refused by the router itself: the headers are there too
            assert answer.status == 400
            assert answer.headers["x-ratelimit-remaining-tokens"] == "1"
        status, headers, _ = await complete(session, app, KEYS["normal"])
        assert status == 200
        assert not [h for h in headers if h.startswith("x-ratelimit")]  # a key without limits


async def test_under_overload_the_lowest_priority_is_shed_first(tmp_path: Path) -> None:
    hang = StubWorker("hang")
    async with router(tmp_path, hang, max_in_flight=10) as app, aiohttp.ClientSession() as session:
        held = [asyncio.ensure_future(complete(session, app, KEYS["critical"])) for _ in range(7)]
        await eventually_async(lambda: hang.in_progress == 7, what="7 requests in flight")
        status, headers, _ = await complete(session, app, KEYS["low"])  # low stops at 7
        assert (status, headers["Retry-After"]) == (503, "1")
        normal = asyncio.ensure_future(complete(session, app, KEYS["normal"]))  # normal at 8
        await eventually_async(lambda: hang.in_progress == 8, what="the normal one admitted")
        assert (await complete(session, app, KEYS["normal"]))[0] == 503
        critical = asyncio.ensure_future(complete(session, app, KEYS["critical"]))
        await eventually_async(lambda: hang.in_progress == 9, what="critical still admitted")
        hang.release.set()
        answers = await asyncio.gather(*held, normal, critical)
        assert [a[0] for a in answers] == [200] * 9
        assert sample(app, "tpuserve_router_shed_total", priority="low") == 1
        assert sample(app, "tpuserve_router_shed_total", priority="normal") == 1


@pytest.mark.parametrize(
    ("mode", "key", "status"),
    [
        ("loopback", None, 200),  # this host may, by default
        ("loopback", "normal", 200),
        ("keys", None, 403),
        ("keys", "normal", 403),
        ("keys", "admin", 200),
        ("off", "admin", 403),
        ("open", None, 200),
    ],
)
async def test_the_admin_api_answers_whom_admin_allows(
    tmp_path: Path, mode: str, key: str | None, status: int
) -> None:
    async with router(tmp_path, StubWorker(), admin=mode) as app, aiohttp.ClientSession() as s:
        headers = {"Authorization": f"Bearer {KEYS[key]}"} if key else {}
        async with s.get(app.base_url + "/workers", headers=headers) as answer:
            assert answer.status == status
            if status == 403:
                assert (await answer.json())["error"]["type"] == "permission_error"


async def test_a_new_keys_file_takes_effect_without_a_restart(tmp_path: Path) -> None:
    async with router(tmp_path, StubWorker()) as app, aiohttp.ClientSession() as session:
        assert app.keys is not None
        fresh = tmp_path / "fresh.json"
        fresh.write_bytes(
            orjson.dumps({"keys": [{"key": "sk-rotated-0123456789", "tenant": "acme"}]})
        )
        fresh.replace(tmp_path / "keys.json")
        app.keys.reload_if_changed()  # what the reload timer does every few seconds
        assert (await complete(session, app, KEYS["normal"]))[0] == 401
        assert (await complete(session, app, "sk-rotated-0123456789"))[0] == 200
        assert sample(app, "tpuserve_router_api_keys") == 1
        assert sample(app, "tpuserve_router_api_key_reloads_total", result="ok") == 1


@pytest.mark.parametrize(("key", "taken"), [("admin", True), (None, False)])
async def test_a_replica_gets_its_peers_kv_snapshot_with_an_admin_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, key: str | None, taken: bool
) -> None:
    settings: dict[str, Any] = {"policy": "precise", "kv_events": True}
    async with router(tmp_path, StubWorker(), admin="keys", **settings) as peer:
        late: dict[str, Any] = {"kv_snapshot_from": peer.base_url}
        if key is not None:
            key_file = tmp_path / "snapshot-key"
            key_file.write_text(KEYS[key] + "\n")
            late["kv_snapshot_key_file"] = str(key_file)
        with caplog.at_level(logging.INFO, logger="tpuserve_router.peering.kv_snapshot"):
            async with stub_router(StubWorker(), **settings, **late):
                pass
    assert ("KV snapshot from" in caplog.text and "no KV snapshot" not in caplog.text) is taken
    assert ("Forbidden" in caplog.text) is not taken
