"""`unix:` worker addresses and the front's unix socket (``--uds``): their one spelling, the
errors that name the value, where they are allowed, and the session that reaches them."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tpuserve_router.cli import build_config, configure
from tpuserve_router.config import ConfigError, RouterConfig
from tpuserve_router.engines.discovery.kubernetes import PodRules, classify_pods
from tpuserve_router.engines.proxy import UpstreamPool
from tpuserve_router.engines.worker_networks import parse_networks, url_problem
from tpuserve_router.engines.worker_session import WorkerSession
from tpuserve_router.engines.workers import (
    InvalidWorkerURL,
    WorkerRegistry,
    WorkerSpec,
    normalize_worker_url,
    parse_worker_flag,
)
from tpuserve_router.validation import validate

pytestmark = pytest.mark.unit


def test_a_unix_address_names_its_socket_in_one_spelling() -> None:
    assert normalize_worker_url("unix:/run/engine.sock", allow_unix=True) == (
        "unix:/run/engine.sock",
        "/run/engine.sock",
        0,
    )
    for alias in (
        "unix:///run/engine.sock",
        "unix:/run//x/../engine.sock",
        " unix:/run/engine.sock ",
    ):
        assert normalize_worker_url(alias, allow_unix=True)[0] == "unix:/run/engine.sock"
    registry = WorkerRegistry()
    first = registry.add(WorkerSpec("unix:/run/engine.sock"))
    assert registry.add(WorkerSpec("unix:///run/./engine.sock")) is first
    assert parse_worker_flag("qwen=unix:/run/engine.sock") == WorkerSpec(
        "unix:/run/engine.sock", model="qwen"
    )


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("unix:run/engine.sock", "the path is not absolute"),
        ("unix:", "the path is not absolute"),
        ("unix:/", "a socket path of 1 to 107 bytes"),
        ("unix:/" + "a" * 107, "a socket path of 1 to 107 bytes"),
        ("unix:/run/e.sock?x", "'?', '#'"),
        ("unix:/run/e.sock#x", "'?', '#'"),
        ("unix:/run/\x00e.sock", "NUL"),
    ],
)
def test_a_bad_unix_address_is_refused_naming_it(address: str, says: str) -> None:
    with pytest.raises(InvalidWorkerURL) as err:
        parse_worker_flag(address)
    assert says in str(err.value)
    assert repr(address[:80]) in str(err.value)
    assert "expected unix:/ABSOLUTE/PATH" in str(err.value)


def test_unix_addresses_are_for_the_routers_own_flags_alone() -> None:
    """A pod annotation, the admin API, a PD leg or a snapshot peer cannot name a socket."""
    with pytest.raises(InvalidWorkerURL, match="a unix socket is not allowed here"):
        normalize_worker_url("unix:/run/engine.sock")  # what PD legs and peers are read with
    problem = url_problem("unix:/run/docker.sock", ())
    assert problem is not None
    assert "only on the router's command line" in problem
    assert url_problem("unix:/run/engine.sock", (), allow_unix=True) is None
    assert (
        url_problem("unix:/run/engine.sock", parse_networks(["10.0.0.0/8"]), allow_unix=True)
        is None
    )
    pod = {
        "metadata": {"name": "p", "uid": "u", "labels": {"role": "leader"},
                     "annotations": {"serving.tpuserve.dev/worker-url": "unix:/run/docker.sock"}},
        "spec": {"containers": [{"name": "engine"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.2",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip
    specs, rejected = classify_pods([pod], PodRules(("role", "leader")))
    assert specs == []
    assert [r.pod for r in rejected] == ["p"]
    assert "only on the router's command line" in rejected[0].reason
    with pytest.raises(ConfigError, match="a unix socket is not allowed here"):
        validate(RouterConfig(prefill=("unix:/run/p.sock",), decode=("http://127.0.0.1:2",)))


def test_the_flags_take_unix_workers_and_a_socket_to_listen_on(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    sock = str(tmp_path / "router.sock")
    args = parser.parse_args(["--uds", sock, "--worker", "unix:/run/engine.sock"])
    config = build_config(args, environ={})
    assert config.uds == sock
    assert config.workers == ("unix:/run/engine.sock",)
    validate(config)


@pytest.mark.parametrize(
    ("uds", "says"),
    [
        ("router.sock", "must be an absolute path"),
        ("/no/such/folder/router.sock", "the directory '/no/such/folder' does not exist"),
        ("/" + "a" * 120, "allowed at most 107 bytes"),
    ],
)
def test_a_bad_socket_to_listen_on_is_named(uds: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(RouterConfig(uds=uds))
    assert any(p.startswith(f"uds={uds[:80]!r}") and says in p for p in err.value.problems)


def test_a_file_that_is_no_socket_is_not_replaced(tmp_path: Path) -> None:
    keep = tmp_path / "data.txt"
    keep.write_text("mine")
    with pytest.raises(ConfigError, match="exists and is not a socket"):
        validate(RouterConfig(uds=str(keep)))
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(stale))
    validate(RouterConfig(uds=str(stale)))  # a socket left by a router that died: replaced


def test_the_upstream_pool_dials_a_unix_workers_socket_with_a_local_host_header() -> None:
    pool = UpstreamPool("/run/engine.sock", 0, connect_timeout_seconds=1, max_idle=1,
                        max_head_bytes=1024, max_body_bytes=1024)  # fmt: skip
    assert pool.unix_path == "/run/engine.sock"
    assert pool.host_header == b"localhost"
    tcp = UpstreamPool("10.0.0.2", 30000, connect_timeout_seconds=1, max_idle=1,
                       max_head_bytes=1024, max_body_bytes=1024)  # fmt: skip
    assert tcp.unix_path is None
    assert tcp.host_header == b"10.0.0.2:30000"


async def test_the_session_sends_unix_urls_through_their_registered_socket(
    tmp_path: Path,
) -> None:
    """A look-up at ``unix:/PATH/v1/models`` reaches the worker on PATH as ``GET /v1/models``;
    a ``unix:`` URL of no registered worker is refused without dialling."""
    sock = str(tmp_path / "e.sock")
    seen: list[tuple[str, str, str]] = []

    async def models(request: web.Request) -> web.Response:
        seen.append((request.method, request.path_qs, request.host))
        return web.json_response({"data": [{"id": "m"}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, sock).start()
    names = ["http://127.0.0.1:9", f"unix:{sock}"]
    session = WorkerSession(5.0, lambda: names)
    try:
        async with session.get(f"unix:{sock}/v1/models?x=1") as response:
            assert response.status == 200
            assert await response.json() == {"data": [{"id": "m"}]}
        assert seen == [("GET", "/v1/models?x=1", "localhost")]
        with pytest.raises(aiohttp.InvalidUrlClientError):
            async with session.get(f"unix:{tmp_path}/other.sock/v1/models"):
                pass
        with pytest.raises(aiohttp.InvalidUrlClientError):
            async with session.get(f"unix:{sock}x/v1/models"):  # a longer name, not this one
                pass
    finally:
        await session.close()
        await runner.cleanup()
    assert len(seen) == 1
