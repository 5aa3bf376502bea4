"""Where a worker publishes its KV events, read from its server info: one stream per DP rank.

SGLang 0.5.21 on describes its publisher in ``/server_info`` as a ``kv_events`` block
(``describe_kv_events_publisher``)::

    {"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 5557, "topic": "kv",
     "block_size": 16, "dp_size": 2, "replay_endpoint_port_base": 5558}

and, per that contract, each of ``dp_size`` ranks publishes on
``tcp://<worker URL host>:<endpoint_port_base + rank>`` (replay on
``replay_endpoint_port_base + rank``). Older engines, and 0.5.23 when the block is null
(for example an ``ipc://`` endpoint), have only the ``kv_events_config`` server argument (a
JSON string, as ``--kv-events-config`` was given): its endpoint is used as written, except
that a wildcard host (``*``, ``0.0.0.0``, ``::``) becomes the worker's host, and with
``dp_size`` ranks SGLang's publisher offsets the port by the rank
(``ZmqEventPublisher.offset_endpoint_port``). `publisher_endpoints` is that rule, pure;
`discover_publisher` fetches ``/server_info`` (then the deprecated ``/get_server_info``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
WILDCARD_HOSTS = frozenset({"*", "0.0.0.0", "::", "[::]", ""})
MAX_PORT = 65535


@dataclass(frozen=True)
class Endpoints:
    """One KV-event stream: the PUB endpoint, its replay ROUTER, topic and DP rank."""

    events: str
    replay: str | None = None
    topic: str = ""
    dp_rank: int = 0


class NoPublisher(ValueError):
    """The server info names no KV-event publisher the router can subscribe to (why)."""


def publisher_endpoints(info: Mapping[str, Any], worker_host: str) -> list[Endpoints]:
    """The streams a worker at ``worker_host`` publishes, one per DP rank, from its server
    info; `NoPublisher` says why there are none."""
    block = info.get("kv_events")
    if isinstance(block, Mapping):
        try:
            config = _kv_events_config(info)
        except NoPublisher:
            config = None  # here only a fallback for the replay port
        return _from_block(block, config, worker_host)
    config = _kv_events_config(info)
    if config is None:
        raise NoPublisher("the server info has neither a kv_events block nor kv_events_config")
    return _from_config(config, _int(info, "dp_size", 1, "dp_size"), worker_host)


def pool_pages(info: object) -> int | None:
    """The pages of one DP rank's KV pool that ``/server_info`` describes
    (``max_total_num_tokens`` / ``page_size``, SGLang's), or None when it does not say: the
    most blocks one of the worker's event streams can hold (`BlockIndex.set_worker_limit`)."""
    if not isinstance(info, Mapping):
        return None
    tokens, page = info.get("max_total_num_tokens"), info.get("page_size")
    if type(tokens) is not int or tokens < 1:
        return None
    if page is None:
        page = 1  # SGLang's default page size
    if type(page) is not int or page < 1:
        return None
    return -(-tokens // page)


async def discover_publisher(
    get_json: Callable[[str], Awaitable[object]], worker_url: str, worker_host: str
) -> list[Endpoints]:
    """Ask the worker (``/server_info``, else ``/get_server_info``) where it publishes."""
    errors = []
    for path in SERVER_INFO_PATHS:
        try:
            info = await get_json(worker_url + path)
        except Exception as err:  # an engine without the path, or not answering
            errors.append(f"{path}: {err}")
            continue
        if not isinstance(info, Mapping):
            raise NoPublisher(f"{path} did not answer a JSON object")
        return publisher_endpoints(info, worker_host)
    raise NoPublisher("no server info (" + "; ".join(errors) + ")")


def _from_block(
    block: Mapping[str, Any], config: Mapping[str, Any] | None, worker_host: str
) -> list[Endpoints]:
    publisher = block.get("publisher", "zmq")
    if publisher != "zmq":
        raise NoPublisher(f"kv_events.publisher: {publisher!r} is not supported; supported: zmq")
    base = _int(block, "endpoint_port_base", None, "kv_events.endpoint_port_base", low=1)
    ranks = _int(block, "dp_size", 1, "kv_events.dp_size")
    topic = _str(block, "topic", "kv_events.topic")
    replay_base: int | None = None
    if block.get("replay_endpoint_port_base") is not None:
        replay_base = _int(block, "replay_endpoint_port_base", None,
                           "kv_events.replay_endpoint_port_base", low=1)  # fmt: skip
    elif config is not None and isinstance(config.get("replay_endpoint"), str):
        replay_base = _tcp_port(config["replay_endpoint"])  # blocks before the replay key
    _check_range(base, ranks, "kv_events.endpoint_port_base")
    if replay_base is not None:
        _check_range(replay_base, ranks, "kv_events.replay_endpoint_port_base")
    host = _bracketed(worker_host)
    return [
        Endpoints(
            f"tcp://{host}:{base + rank}",
            f"tcp://{host}:{replay_base + rank}" if replay_base is not None else None,
            topic,
            rank,
        )
        for rank in range(ranks)
    ]


def _from_config(config: Mapping[str, Any], ranks: int, worker_host: str) -> list[Endpoints]:
    publisher = config.get("publisher", "null")  # SGLang's KVEventsConfig default
    if publisher != "zmq":
        raise NoPublisher(
            f"kv_events_config.publisher: {publisher!r} does not publish; subscribable: zmq"
        )
    endpoint = config.get("endpoint", "tcp://*:5557")  # SGLang's default
    if not isinstance(endpoint, str) or not endpoint:
        raise NoPublisher(f"kv_events_config.endpoint: {endpoint!r} is not a ZMQ endpoint")
    replay = config.get("replay_endpoint")
    if replay is not None and not isinstance(replay, str):
        raise NoPublisher(f"kv_events_config.replay_endpoint: {replay!r} is not a ZMQ endpoint")
    topic = _str(config, "topic", "kv_events_config.topic")
    if ranks > 1:
        for name, value in (("endpoint", endpoint), ("replay_endpoint", replay)):
            if value is not None:
                port = _tcp_port(value)
                if port is None:
                    raise NoPublisher(
                        f"kv_events_config.{name}: {value!r} cannot carry {ranks} DP ranks; "
                        "allowed with dp_size > 1: tcp://HOST:PORT"
                    )
                _check_range(port, ranks, f"kv_events_config.{name}")
    return [
        Endpoints(
            _dialable(_offset(endpoint, rank), worker_host),
            _dialable(_offset(replay, rank), worker_host) if replay else None,
            topic,
            rank,
        )
        for rank in range(ranks)
    ]


def _kv_events_config(info: Mapping[str, Any]) -> Mapping[str, Any] | None:
    raw = info.get("kv_events_config")
    if raw is None or raw == "":
        return None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raise NoPublisher(f"kv_events_config: {raw!r:.80} is not JSON") from None
    if not isinstance(raw, Mapping):
        raise NoPublisher(f"kv_events_config: {raw!r:.80} is not a JSON object")
    return raw


def _int(
    data: Mapping[str, Any], key: str, default: int | None, field: str, *, low: int = 1
) -> int:
    value = data.get(key, default)
    if type(value) is not int or value < low:
        raise NoPublisher(f"{field}: {value!r} is not allowed; allowed: an integer >= {low}")
    return value


def _str(data: Mapping[str, Any], key: str, field: str) -> str:
    value = data.get(key) or ""
    if not isinstance(value, str):
        raise NoPublisher(f"{field}: {value!r} is not allowed; allowed: a string")
    return value


def _check_range(base: int, ranks: int, field: str) -> None:
    if base + ranks - 1 > MAX_PORT:
        raise NoPublisher(
            f"{field}: {base} with {ranks} DP ranks runs past port {MAX_PORT}; "
            f"allowed: at most {MAX_PORT - ranks + 1}"
        )


def _tcp_port(endpoint: str) -> int | None:
    scheme, sep, rest = endpoint.partition("://")
    port = rest.rpartition(":")[2]
    if not sep or scheme != "tcp" or not port.isdigit():
        return None
    return int(port)


def _offset(endpoint: str, rank: int) -> str:
    """SGLang's per-rank endpoint: the TCP port plus the rank (rank 0: as written)."""
    if rank == 0:
        return endpoint
    address, _, port = endpoint.rpartition(":")
    return f"{address}:{int(port) + rank}"


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _dialable(endpoint: str, host: str) -> str:
    """A ZMQ endpoint the router can connect to: wildcard hosts become the worker's host."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme != "tcp":
        return endpoint
    address, _, port = rest.rpartition(":")
    if address in WILDCARD_HOSTS:
        return f"tcp://{_bracketed(host)}:{port}"
    return endpoint
