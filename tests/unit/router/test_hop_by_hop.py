"""Hop-by-hop headers on the way back: those a worker's ``Connection`` names stay here."""

from __future__ import annotations

import pytest

from tpuserve_router.pipeline.framing import response_headers as _response_headers

pytestmark = pytest.mark.unit


def test_a_response_header_its_connection_header_names_is_not_passed_on() -> None:
    """Issue 57 item 9 (RFC 9110 7.6.1), the answer side."""
    headers = [
        (b"content-type", b"application/json"),
        (b"connection", b"keep-alive, X-Hop"),
        (b"x-hop", b"worker-only"),
        (b"x-kept", b"yes"),
    ]
    assert _response_headers(headers) == b"content-type: application/json\r\nx-kept: yes\r\n"
