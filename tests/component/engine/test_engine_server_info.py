"""`/server_info`'s `kv_events` block says where the twin's bound KV-event sockets are."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from tests.component.engine.engine_process import running_engine

pytestmark = pytest.mark.component


def server_info(url: str) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with aiohttp.ClientSession() as s, s.get(url + "/server_info") as r:
            assert r.status == 200
            body: dict[str, Any] = await r.json()
            return body

    return asyncio.run(go())


def test_kv_events_block_describes_the_bound_publisher() -> None:
    args = [
        "--time-scale", "0", "--page-size", "32", "--kv-events-topic", "kv",
        "--kv-events-endpoint", "tcp://127.0.0.1:*",
        "--kv-events-replay-endpoint", "tcp://127.0.0.1:*",
    ]  # fmt: skip
    with running_engine(args) as engine:
        info = server_info(engine.url)
    config = json.loads(info["kv_events_config"])
    publisher_port = int(config["endpoint"].rsplit(":", 1)[1])
    replay_port = int(config["replay_endpoint"].rsplit(":", 1)[1])
    assert config["bind"] is True
    assert info["kv_events"] == {
        "publisher": "zmq",
        "endpoint_host": "127.0.0.1",
        "endpoint_port_base": publisher_port,
        "topic": "kv",
        "block_size": 32,
        "dp_size": 1,
        "replay_endpoint_port_base": replay_port,
    }
    assert publisher_port != replay_port
