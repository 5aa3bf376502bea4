"""The router finds a worker's KV-event streams in its server info, one per DP rank."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sglang_tpu.sim.kv_publisher import KVEventPublisher
from tpuserve_router.kv.kv_publishers import (
    Endpoints,
    NoPublisher,
    discover_publisher,
    publisher_endpoints,
)

pytestmark = pytest.mark.unit

OBSERVED_0_5_23 = {  # /server_info of a real 0.5.23 engine (docs/../real-sglang.md)
    "publisher": "zmq", "endpoint_host": "127.0.0.1", "endpoint_port_base": 5557,
    "topic": "kv", "block_size": 16, "dp_size": 1,
}  # fmt: skip


def info(**fields: Any) -> dict[str, Any]:
    return {"model_path": "m", "dp_size": 1, **fields}


def test_a_0_5_23_block_gives_the_port_on_the_workers_host() -> None:
    assert publisher_endpoints(info(kv_events=OBSERVED_0_5_23), "10.0.0.5") == [
        Endpoints("tcp://10.0.0.5:5557", None, "kv", 0)
    ]


def test_one_stream_per_dp_rank_on_consecutive_ports() -> None:
    block = {**OBSERVED_0_5_23, "endpoint_host": "*", "dp_size": 3,
             "replay_endpoint_port_base": 6000}  # fmt: skip
    assert publisher_endpoints(info(kv_events=block, dp_size=3), "h") == [
        Endpoints(f"tcp://h:{5557 + r}", f"tcp://h:{6000 + r}", "kv", r) for r in range(3)
    ]


def test_a_block_without_a_replay_port_takes_it_from_the_config() -> None:
    config = json.dumps({"publisher": "zmq", "endpoint": "tcp://*:5557",
                         "replay_endpoint": "tcp://*:5558"})  # fmt: skip
    found = publisher_endpoints(info(kv_events=OBSERVED_0_5_23, kv_events_config=config), "h")
    assert found == [Endpoints("tcp://h:5557", "tcp://h:5558", "kv", 0)]


def test_an_ipv6_worker_host_is_bracketed() -> None:
    found = publisher_endpoints(info(kv_events=OBSERVED_0_5_23), "fd00::5")
    assert found[0].events == "tcp://[fd00::5]:5557"


def test_without_a_block_the_config_endpoints_are_used() -> None:
    config = {"publisher": "zmq", "endpoint": "tcp://127.0.0.1:7000",
              "replay_endpoint": "tcp://0.0.0.0:7001", "topic": "t"}  # fmt: skip
    for given in (config, json.dumps(config)):  # a JSON string, as SGLang reports it, or parsed
        assert publisher_endpoints(info(kv_events=None, kv_events_config=given), "w") == [
            Endpoints("tcp://127.0.0.1:7000", "tcp://w:7001", "t", 0)
        ]


def test_the_config_of_a_dp_engine_is_offset_per_rank() -> None:
    config = json.dumps({"publisher": "zmq", "endpoint": "tcp://*:7000"})
    found = publisher_endpoints(info(kv_events_config=config, dp_size=2), "w")
    assert [e.events for e in found] == ["tcp://w:7000", "tcp://w:7001"]
    assert [e.dp_rank for e in found] == [0, 1]


def test_an_ipc_endpoint_serves_one_rank_only() -> None:
    config = {"publisher": "zmq", "endpoint": "ipc:///tmp/kv"}
    assert publisher_endpoints(info(kv_events_config=config), "w") == [
        Endpoints("ipc:///tmp/kv", None, "", 0)
    ]
    with pytest.raises(NoPublisher, match=r"kv_events_config.endpoint: 'ipc:///tmp/kv' cannot"):
        publisher_endpoints(info(kv_events_config=config, dp_size=2), "w")


@pytest.mark.parametrize(
    ("server_info", "message"),
    [
        (info(), "neither a kv_events block nor kv_events_config"),
        (info(kv_events=None, kv_events_config=""), "neither"),
        (info(kv_events_config="{not json"), "kv_events_config: '{not json' is not JSON"),
        (info(kv_events_config='{"endpoint": "tcp://*:1"}'), "publisher: 'null' does not"),
        (info(kv_events={**OBSERVED_0_5_23, "publisher": "kafka"}), "'kafka' is not supported"),
        (info(kv_events={**OBSERVED_0_5_23, "dp_size": 0}), "kv_events.dp_size: 0 is not"),
        (info(kv_events={**OBSERVED_0_5_23, "endpoint_port_base": "5557"}), "port_base: '5557'"),
        (info(kv_events={**OBSERVED_0_5_23, "endpoint_port_base": 65535, "dp_size": 2}),
         "runs past port 65535; allowed: at most 65534"),
        (info(kv_events={**OBSERVED_0_5_23, "topic": 3}), "kv_events.topic: 3 is not allowed"),
    ],
)  # fmt: skip
def test_what_cannot_be_subscribed_says_why(server_info: dict[str, Any], message: str) -> None:
    with pytest.raises(NoPublisher, match=message.replace("(", r"\(").replace("[", r"\[")):
        publisher_endpoints(server_info, "w")


async def test_discovery_falls_back_to_the_deprecated_path() -> None:
    asked: list[str] = []

    async def get_json(url: str) -> object:
        asked.append(url)
        if url.endswith("/get_server_info"):
            return info(kv_events=OBSERVED_0_5_23)
        raise RuntimeError("404 Not Found")

    found = await discover_publisher(get_json, "http://w:1", "w")
    assert found == [Endpoints("tcp://w:5557", None, "kv", 0)]
    assert asked == ["http://w:1/server_info", "http://w:1/get_server_info"]


async def test_discovery_without_any_server_info_names_both_paths() -> None:
    async def get_json(url: str) -> object:
        raise RuntimeError("refused")

    with pytest.raises(NoPublisher, match=r"/server_info: refused; /get_server_info: refused"):
        await discover_publisher(get_json, "http://w:1", "w")


async def test_the_twins_description_names_the_sockets_it_bound() -> None:
    publisher = KVEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", topic="kv")
    try:
        block = publisher.describe(block_size=16)
        assert block is not None
        assert (block["block_size"], block["dp_size"], block["topic"]) == (16, 1, "kv")
        found = publisher_endpoints(info(kv_events=block), "127.0.0.1")
        assert found == [Endpoints(publisher.endpoint, publisher.replay_endpoint, "kv", 0)]
    finally:
        await publisher.close()


async def test_a_twin_without_a_tcp_endpoint_has_no_description(tmp_path: Path) -> None:
    publisher = KVEventPublisher(f"ipc://{tmp_path}/kv")
    try:
        assert publisher.describe(block_size=16) is None
    finally:
        await publisher.close()
