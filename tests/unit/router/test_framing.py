"""The headers passed on through the router, framed natively (`_native.pass_on`), against the
Python that framed them before (kept here as the reference): the same bytes for every
request and answer, hop-by-hop headers and those a ``Connection`` header names dropped."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from tpuserve_router._native import pass_on
from tpuserve_router.pipeline.framing import CREDENTIALS, HOP_BY_HOP, response_headers

pytestmark = pytest.mark.unit


def python_connection_named(headers: Sequence[tuple[bytes, bytes]]) -> frozenset[bytes]:
    named: frozenset[bytes] = frozenset()
    for name, value in headers:
        if name == b"connection":
            tokens = (token.strip().lower() for token in value.split(b","))
            named = named.union(token for token in tokens if token)
    return named


def python_pass_on(
    headers: Sequence[tuple[bytes, bytes]], dropped: frozenset[bytes], body: bytes | None = None
) -> bytes:
    """`forwarded_headers` (with ``body``) and `response_headers` (without) as they were."""
    named = python_connection_named(headers)
    if named:
        dropped = dropped | named
    kept = [name + b": " + value + b"\r\n" for name, value in headers if name not in dropped]
    if body is None:
        return b"".join(kept)
    return b"".join([*kept, b"content-length: ", str(len(body)).encode(), b"\r\n\r\n", body])


NAMES = [
    b"content-type", b"connection", b"keep-alive", b"x-hop", b"x-kept", b"host",
    b"content-length", b"authorization", b"x-api-key", b"te", b"transfer-encoding",
    b"upgrade", b"accept", b"x-request-id",
]  # fmt: skip
CONNECTION_VALUES = [
    b"keep-alive", b"close", b"X-Hop", b" x-hop , Keep-Alive ", b",,", b"", b"\tX-KEPT\x0b",
    b"upgrade, te", b"x-hop,x-request-id", b"\x0cAccept\r\n",
]  # fmt: skip


def random_headers(rng: random.Random) -> list[tuple[bytes, bytes]]:
    headers = []
    for _ in range(rng.randrange(0, 9)):
        name = rng.choice(NAMES)
        if name == b"connection":
            value = rng.choice(CONNECTION_VALUES)
        else:
            value = bytes(rng.randrange(32, 127) for _ in range(rng.randrange(0, 12)))
        headers.append((name, value))
    return headers


def test_a_request_is_framed_as_python_framed_it() -> None:
    rng = random.Random(69)
    for _ in range(3000):
        headers = random_headers(rng)
        dropped = rng.choice([HOP_BY_HOP, HOP_BY_HOP | CREDENTIALS, frozenset[bytes]()])
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        assert pass_on(headers, dropped, body) == python_pass_on(headers, dropped, body), headers


def test_an_answer_is_framed_as_python_framed_it() -> None:
    rng = random.Random(70)
    for _ in range(3000):
        headers = random_headers(rng)
        assert response_headers(headers) == python_pass_on(headers, HOP_BY_HOP), headers


def test_a_connection_header_drops_what_it_names_and_itself() -> None:
    headers = [
        (b"connection", b" X-Hop ,, keep-alive"),
        (b"x-hop", b"1"),
        (b"keep-alive", b"timeout=5"),
        (b"accept", b"*/*"),
    ]
    assert pass_on(headers, HOP_BY_HOP, b"{}") == b"accept: */*\r\ncontent-length: 2\r\n\r\n{}"


def test_headers_of_another_shape_are_a_type_error_naming_the_rule() -> None:
    for bad in ([(b"a", "text")], [(b"a",)], [b"a: b"], [("a", b"b")]):
        with pytest.raises(TypeError, match=r"\(name, value\) tuple of bytes"):
            pass_on(bad, HOP_BY_HOP)  # type: ignore[arg-type]
