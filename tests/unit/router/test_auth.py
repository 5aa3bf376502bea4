"""API keys: the file's problems are named, only digests are kept, keys are compared in
constant time and reread when the file changes; buckets limit requests and tokens per
minute and say when to come back; priority classes are shed lowest first."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
from pathlib import Path
from typing import cast

import orjson
import pytest
from prometheus_client import CollectorRegistry

from tpuserve_router.app import create_router_app
from tpuserve_router.config import RouterConfig
from tpuserve_router.front.http_request import HttpRequest
from tpuserve_router.front.server import HttpConnection
from tpuserve_router.tenancy.auth import (
    MAX_KEY_LABELS,
    OTHER_KEY,
    KeysFileError,
    KeyStore,
    parse_keys,
    presented_key,
)
from tpuserve_router.tenancy.quotas import Quotas, Reservation, TokenWindow, in_flight_limits

pytestmark = pytest.mark.unit

KEY = "sk-test-0123456789abcdef"


def keys_file(tmp_path: Path, *entries: dict[str, object]) -> Path:
    path = tmp_path / "keys.json"
    path.write_bytes(orjson.dumps({"keys": list(entries)}))
    return path


def test_a_key_in_clear_or_as_its_sha256_is_kept_as_its_digest_only() -> None:
    hashed = hashlib.sha256(b"sk-other-0123456789abcdef").hexdigest()
    keys = parse_keys(
        orjson.dumps({"keys": [
            {"key": KEY, "tenant": "acme", "priority": "high", "requests_per_minute": 60},
            {"key_sha256": hashed, "tenant": "ops", "admin": True},
        ]}),
        "keys.json",
    )  # fmt: skip
    assert set(keys) == {hashlib.sha256(KEY.encode()).digest(), bytes.fromhex(hashed)}
    assert KEY.encode() not in repr(keys).encode()
    acme = keys[hashlib.sha256(KEY.encode()).digest()]
    assert (acme.tenant, acme.priority, acme.requests_per_minute, acme.admin) == (
        "acme", "high", 60, False,
    )  # fmt: skip


def test_every_problem_of_the_file_is_named() -> None:
    with pytest.raises(KeysFileError) as err:
        parse_keys(
            orjson.dumps({"keys": [
                {"key": "short", "tenant": "a"},
                {"key": KEY, "key_sha256": "00", "tenant": "b"},
                {"key": KEY + "x", "tenant": "no spaces", "priority": "urgent"},
                {"key": KEY + "y", "tenant": "c", "requests_per_minute": 0, "admin": "yes"},
                {"key": KEY + "z", "tenant": "d", "color": "red"},
            ]}),
            "keys.json",
        )  # fmt: skip
    text = str(err.value)
    for expected in (
        "keys[0].key: allowed: a string of at least 16 characters",
        "keys[1]: exactly one of key and key_sha256 is required",
        "keys[2].tenant: 'no spaces' is not allowed",
        "keys[2].priority: 'urgent' is not allowed; allowed: critical, high, normal, low",
        "keys[3].requests_per_minute: 0 is not allowed",
        "keys[3].admin: 'yes' is not allowed",
        "keys[4]: unknown field(s) color",
    ):
        assert expected in text
    with pytest.raises(KeysFileError, match="not JSON"):
        parse_keys(b"{", "keys.json")


def test_key_labels_are_bounded_and_name_no_tenant() -> None:
    entries = [{"key": f"{KEY}-{i:04d}", "tenant": f"t{i:04d}"} for i in range(150)]
    keys = parse_keys(orjson.dumps({"keys": entries}), "keys.json")
    labels = {k.label for k in keys.values()}
    assert len(labels) == MAX_KEY_LABELS + 1
    assert OTHER_KEY in labels
    assert {k.label for k in keys.values() if k.label != OTHER_KEY} == {
        digest.hex()[:12] for digest in sorted(keys)[:MAX_KEY_LABELS]
    }
    assert not {k.tenant for k in keys.values()} & labels


def test_the_bearer_key_or_x_api_key_is_presented() -> None:
    assert presented_key(b"Bearer  abc ", None) == b"abc"
    assert presented_key(b"bearer abc", b"def") == b"abc"
    assert presented_key(None, b"def") == b"def"
    assert presented_key(b"Basic abc", None) is None


def test_the_store_rereads_a_changed_file_and_keeps_its_keys_on_a_bad_one(
    tmp_path: Path,
) -> None:
    results: list[tuple[str, int]] = []
    path = keys_file(tmp_path, {"key": KEY, "tenant": "acme"})
    store = KeyStore(str(path), 10, lambda result, keys: results.append((result, len(keys))))
    assert store.authenticate(KEY.encode()) is not None
    assert store.authenticate(KEY.encode() + b"x") is None
    assert store.authenticate(None) is None
    store.reload_if_changed()
    assert results == []  # unchanged: not read again
    replacement = tmp_path / "new.json"
    replacement.write_bytes(orjson.dumps({"keys": [{"key": KEY + "-new", "tenant": "acme"}]}))
    os.replace(replacement, path)  # as a Secret update swaps the file
    store.reload_if_changed()
    assert store.authenticate(KEY.encode()) is None
    assert store.authenticate(KEY.encode() + b"-new") is not None
    path.write_text("{not json")
    store.reload_if_changed()
    assert store.authenticate(KEY.encode() + b"-new") is not None  # the keys in force stay
    assert results == [("ok", 1), ("failed", 1)]


def test_buckets_refuse_over_the_limits_and_say_when_to_return() -> None:
    keys = parse_keys(
        orjson.dumps({"keys": [{"key": KEY, "tenant": "acme", "requests_per_minute": 2}]}),
        "keys.json",
    )
    (requests_key,) = keys.values()
    quotas = Quotas()
    assert quotas.admit(requests_key, 0.0) is None
    assert quotas.admit(requests_key, 0.0) is None
    refused = quotas.admit(requests_key, 0.0)
    assert refused is not None
    refusal, headers = refused
    assert (refusal.limit, headers["retry-after"]) == ("requests", "30")  # 1 of 2 per minute
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"] == "60s"
    assert quotas.admit(requests_key, 30.0) is None  # one request refilled


def test_tokens_are_reserved_up_front_and_settled_at_what_they_cost() -> None:
    keys = parse_keys(
        orjson.dumps({"keys": [{"key": KEY, "tenant": "acme", "tokens_per_minute": 60}]}),
        "keys.json",
    )
    (key,) = keys.values()
    quotas = Quotas()
    assert quotas.admit(key, 0.0) is None
    quota = quotas.of(key, 0.0)
    first = quota.reserve(50, 0.5, "max_tokens")
    assert isinstance(first, Reservation)
    assert quotas.admit(key, 1.0) is None  # 10 tokens left: admitted, then reserved
    refused = quota.reserve(20, 1.0, "max_tokens")  # 50 + 20 > 60: not while the 50 are held
    assert not isinstance(refused, Reservation)
    refusal, headers = refused
    assert (refusal.limit, headers["retry-after"]) == ("tokens", "60")  # second 0 leaves at 61
    assert headers["x-ratelimit-remaining-tokens"] == "10"
    quota.settle(first, 30, 2.0)  # it cost 30: 20 go back
    quota.settle(first, 0, 2.0)  # settled once only
    assert isinstance(quota.reserve(20, 2.0, "max_tokens"), Reservation)  # 30 + 20
    too_large = quota.reserve(61, 2.0, "max_tokens")
    assert not isinstance(too_large, Reservation)
    refusal, headers = too_large
    assert refusal.retry_after_seconds is None
    assert "retry-after" not in headers
    assert refusal.param == "max_tokens"
    assert "more than the 60 its key may take in a minute; lower max_tokens" in refusal.message
    assert quotas.of(key, 61.0).tokens is not None
    assert quota.tokens is not None
    assert quota.tokens.room(61.0) == 40


def test_no_60_seconds_ever_hold_more_than_the_limit() -> None:
    """Random reservations, settlements above and below them, over five minutes: the
    charges of every 60-second span (each at the time it was taken) stay within the limit
    but for what settlements charged over their reservations."""
    rng = random.Random(7)
    window = TokenWindow(200, 0.0)
    taken: list[tuple[float, int]] = []  # (when, tokens) as finally charged
    open_: list[tuple[float, int, int, int]] = []  # (when, second, reserved, index)
    now = 0.0
    while now < 300.0:
        now += rng.random() * 2
        ask = rng.randint(0, 120)
        if window.room(now) >= ask:
            open_.append((now, window.take(ask, now), ask, len(taken)))
            taken.append((now, ask))
        if open_ and rng.random() < 0.6:
            when, second, reserved, index = open_.pop(rng.randrange(len(open_)))
            charged = rng.randint(0, reserved)
            window.settle(second, reserved, charged, now)
            taken[index] = (when, charged)
        assert 0 <= window.used <= 200
    for start, _ in taken:
        assert sum(t for when, t in taken if start <= when < start + 60) <= 200


def test_lower_classes_are_shed_first() -> None:
    assert in_flight_limits(100) == {"critical": 100, "high": 95, "normal": 85, "low": 70}
    assert in_flight_limits(1) == {"critical": 1, "high": 1, "normal": 1, "low": 1}


class FakeTransport:
    def __init__(self, peer: tuple[str, int]) -> None:
        self.peer = peer

    def get_extra_info(self, name: str) -> object:
        return self.peer if name == "peername" else None


@pytest.mark.parametrize(
    ("peer", "local", "refused"),
    [
        ("127.0.0.1", True, False),  # through a listener bound to loopback: this pod's own
        ("10.0.0.5", True, False),
        ("127.0.0.1", False, True),  # a proxy in the pod dials from loopback: not trusted
        ("127.0.0.6", False, True),  # Istio's sidecar's inbound address
        ("::1", False, True),
        ("10.0.0.5", False, True),
    ],
)
async def test_by_default_the_admin_api_trusts_the_listener_never_the_client_address(
    peer: str, local: bool, refused: bool
) -> None:
    app = create_router_app(RouterConfig(), registry=CollectorRegistry())
    conn = HttpConnection(
        app.routes.handle, app.limits, app.book, asyncio.get_running_loop(), local=local
    )
    conn.transport = cast(asyncio.Transport, FakeTransport((peer, 40000)))
    request = HttpRequest(conn, b"GET", b"/workers", [], b"", True, 0.0)
    assert (request.local, request.peer_host) == (local, peer)
    refusal = app.routes.admin_refusal(None, request.local)
    assert (refusal is not None) is refused
    if refusal is not None:
        assert (refusal.status, refusal.error_type) == (403, "permission_error")


@pytest.mark.parametrize("name", [b"authorization", b"x-api-key"])
@pytest.mark.parametrize("path", [b"/v1/completions", b"/workers"])
async def test_two_credential_headers_are_refused_wherever_a_key_is_read(
    tmp_path: Path, name: bytes, path: bytes
) -> None:
    """Generation and admin read one credential; two of a kind (which a proxy in front and
    the router could each read differently) are a 400 naming the header, at the head."""
    keys = keys_file(tmp_path, {"key": "sk-good-0123456789", "tenant": "t", "admin": True})
    app = create_router_app(RouterConfig(api_keys_file=str(keys)), registry=CollectorRegistry())
    good = b"Bearer sk-good-0123456789" if name == b"authorization" else b"sk-good-0123456789"
    assert app.routes.head_check(b"POST", path, [(name, good)], False) is None
    for second in (good, b"Bearer sk-other-0123456789"):
        refusal = app.routes.head_check(b"POST", path, [(name, good), (name, second)], False)
        assert refusal is not None
        assert (refusal.status, refusal.param) == (400, name.decode())
        assert f"more than one {name.decode()} header" in refusal.message
