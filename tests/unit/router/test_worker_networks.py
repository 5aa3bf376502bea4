"""--worker-networks: the router dials only addresses inside them. Discovered pods outside are
rejected with a reason (never dialled, never silently dropped), static workers outside are a
start-up error, admin-added ones get 400; without networks any address is allowed."""

from __future__ import annotations

import argparse
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client import CollectorRegistry

from tests.fakes import StubWorker, stub_router
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp, create_router_app
from tpuserve_router.cli import build_config, configure, env_name
from tpuserve_router.config import ConfigError, RouterConfig
from tpuserve_router.engines.discovery.kubernetes import (
    ApiServer,
    PodRules,
    PodWatcher,
    classify_pods,
    workers_from_pods,
)
from tpuserve_router.engines.worker_networks import (
    endpoint_problem,
    parse_networks,
    url_problem,
)
from tpuserve_router.engines.workers import WorkerSpec
from tpuserve_router.validation import validate

pytestmark = pytest.mark.unit

LOOPBACK = parse_networks(["127.0.0.0/8", "::1/128"])
URL_ANNOTATION = "serving.tpuserve.dev/worker-url"
KV_ANNOTATION = "serving.tpuserve.dev/kv-events-endpoint"


def leader(name: str, ip: str = "10.244.0.7", **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {"serving.tpuserve.dev/role": "leader"},
            "annotations": annotations,
        },
        "spec": {"containers": [{"name": "engine"}]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


RULES = PodRules(("serving.tpuserve.dev/role", "leader"), networks=LOOPBACK)


def test_networks_parse_and_a_bad_one_is_named() -> None:
    assert [str(n) for n in parse_networks(["10.1.2.3/8", " fd00::/8 "])] == [
        "10.0.0.0/8",
        "fd00::/8",
    ]
    with pytest.raises(ValueError, match=r"worker_networks: '10\.0\.0\.0/33' is not an IP"):
        parse_networks(["10.0.0.0/33"])


def test_addresses_inside_pass_and_outside_ones_are_explained() -> None:
    assert url_problem("http://127.0.0.5:4000", LOOPBACK) is None
    assert url_problem("http://[::1]:4000", LOOPBACK) is None
    outside = url_problem("http://10.244.0.7:30000", LOOPBACK)
    assert outside == (
        "worker url http://10.244.0.7:30000: address 10.244.0.7 is outside worker_networks "
        "(127.0.0.0/8, ::1/128)"
    )
    named = url_problem("http://engine.local:4000", LOOPBACK)
    assert named is not None
    assert "'engine.local' is not an IP address" in named
    assert url_problem("http://localhost:4000", LOOPBACK) is None  # RFC 6761: loopback
    assert url_problem("http://0x0af40007:30000", LOOPBACK) == outside  # 10.244.0.7 in disguise
    assert url_problem("http://10.244.0.7:30000", ()) is None
    assert url_problem("ftp://127.0.0.1:1", ()) is not None  # a bad URL is always a problem


def test_kv_event_endpoints_are_checked_too() -> None:
    assert endpoint_problem("tcp://127.0.0.1:5557", LOOPBACK) is None
    assert endpoint_problem("tcp://[::1]:5557", LOOPBACK) is None
    problem = endpoint_problem("tcp://10.244.0.7:5557", LOOPBACK)
    assert problem is not None
    assert "10.244.0.7 is outside worker_networks" in problem
    assert endpoint_problem("ipc:///tmp/kv", LOOPBACK) is not None
    assert endpoint_problem("ipc:///tmp/kv", ()) is None


def test_pods_outside_the_networks_are_rejected_with_the_reason() -> None:
    pods = [
        leader("a-fake-ip"),
        leader("b-annotated", **{URL_ANNOTATION: "http://127.0.0.1:4000"}),
        leader(
            "c-kv-outside",
            **{URL_ANNOTATION: "http://127.0.0.1:4001", KV_ANNOTATION: "tcp://10.244.0.8:5557"},
        ),
    ]
    specs, rejected = classify_pods(pods, RULES)
    assert [s.url for s in specs] == ["http://127.0.0.1:4000"]
    assert [(r.pod, r.url) for r in rejected] == [
        ("a-fake-ip", "http://10.244.0.7:30000"),
        ("c-kv-outside", "http://127.0.0.1:4001"),
    ]
    assert "10.244.0.7 is outside worker_networks (127.0.0.0/8, ::1/128)" in rejected[0].reason
    assert "KV-event endpoint tcp://10.244.0.8:5557" in rejected[1].reason


def test_a_malformed_url_annotation_rejects_only_that_pod() -> None:
    pods = [
        leader("a", **{URL_ANNOTATION: "ftp://127.0.0.1:4000"}),
        leader("b", ip="10.0.0.2"),
    ]
    rules = PodRules(("serving.tpuserve.dev/role", "leader"))
    assert [s.url for s in workers_from_pods(pods, rules)] == ["http://10.0.0.2:30000"]
    (rejected,) = classify_pods(pods, rules)[1]
    assert rejected.pod == "a"
    assert "scheme 'ftp' is not supported" in rejected.reason


def test_the_watcher_keeps_rejections_and_logs_each_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    published: list[list[WorkerSpec]] = []
    watcher = PodWatcher(ApiServer("https://127.0.0.1:1", {}, False), "ns", {"a": "b"}, RULES,
                         published.append)  # fmt: skip
    watcher.pods.reset([leader("x"), leader("y", **{URL_ANNOTATION: "http://127.0.0.1:4000"})])
    with caplog.at_level(logging.WARNING, logger="tpuserve_router.engines.discovery.kubernetes"):
        watcher._report()
        watcher._report()
    assert [s.url for s in published[-1]] == ["http://127.0.0.1:4000"]
    assert [r.pod for r in watcher.rejected] == ["x"]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert warnings[0].startswith("pod ns/x is not routed: worker url http://10.244.0.7:30000")
    watcher.pods.apply("MODIFIED", leader("x", **{URL_ANNOTATION: "http://127.0.0.1:4001"}))
    watcher._report()
    assert watcher.rejected == []
    assert [s.url for s in published[-1]] == [
        "http://127.0.0.1:4001",
        "http://127.0.0.1:4000",
    ]  # by pod name


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(argv)


def test_the_flag_and_its_variable_give_a_tuple_of_networks() -> None:
    flagged = build_config(parse("--worker-networks", "127.0.0.0/8, ::1/128"), environ={})
    assert flagged.worker_networks == ("127.0.0.0/8", "::1/128")
    env = {env_name("--worker-networks"): "10.0.0.0/8"}
    assert build_config(parse(), environ=env).worker_networks == ("10.0.0.0/8",)
    assert build_config(parse(), environ={}).worker_networks == ()


def test_a_static_worker_outside_the_networks_or_a_bad_network_fails_at_start() -> None:
    with pytest.raises(ConfigError) as err:
        validate(
            RouterConfig(
                workers=("http://127.0.0.1:1", "http://192.168.0.9:2"),
                worker_networks=("127.0.0.0/8",),
            )
        )
    assert err.value.problems == [
        "worker url http://192.168.0.9:2: address 192.168.0.9 is outside worker_networks "
        "(127.0.0.0/8)"
    ]
    with pytest.raises(ConfigError, match="'loopback' is not an IP network"):
        validate(RouterConfig(worker_networks=("loopback",)))


@pytest.fixture
async def router() -> AsyncIterator[RouterApp]:
    config = RouterConfig(port=0, worker_networks=("127.0.0.0/8",))
    app = create_router_app(config, registry=CollectorRegistry())
    await app.start()
    yield app
    await app.stop()


async def test_admin_added_workers_outside_the_networks_get_400(router: RouterApp) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            router.base_url + "/workers", json={"url": "http://10.244.0.7:30000"}
        ) as response:
            assert response.status == 400
            error = (await response.json())["error"]
        assert error["param"] == "url"
        assert "10.244.0.7 is outside worker_networks (127.0.0.0/8)" in error["message"]
        async with session.post(
            router.base_url + "/workers",
            json={"url": "http://127.0.0.1:9", "kv_events_endpoint": "tcp://10.0.0.1:5557"},
        ) as response:
            assert response.status == 400
            assert (await response.json())["error"]["param"] == "kv_events_endpoint"
        async with session.get(router.base_url + "/workers") as response:
            assert await response.json() == {"workers": [], "rejected": []}


async def test_kv_event_endpoints_a_worker_names_elsewhere_are_not_dialled_by_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 57 item 7: without --worker-networks, a KV-event endpoint a worker's
    /server_info names at another host is dialled only inside the private ranges: the
    metadata server's link-local address and a public one are refused (logged, never
    subscribed), the worker's own host (SGLang's ``tcp://*:PORT``) and a pod's private address
    are taken."""
    names = {
        "own": "tcp://*:25557",
        "private": "tcp://10.244.0.9:5557",
        "metadata": "tcp://169.254.169.254:5557",
        "public": "tcp://8.8.8.8:5557",
    }
    stubs = {name: StubWorker() for name in names}
    for name, endpoint in names.items():
        stubs[name].server_info = {
            "kv_events_config": orjson.dumps({"publisher": "zmq", "endpoint": endpoint}).decode()
        }
    with caplog.at_level(logging.WARNING, logger="tpuserve_router.engines.admission"):
        async with stub_router(*stubs.values(), policy="precise") as app:
            kv = app.kv
            assert kv is not None
            workers = {n: app.registry.get(stubs[n].url) for n in names}
            await eventually_async(
                lambda: all(kv.subscriptions(stubs[n].url) for n in ("own", "private")),
                what="the own host's and the private address's streams",
            )
            assert not kv.subscriptions(stubs["metadata"].url)
            assert not kv.subscriptions(stubs["public"].url)
            assert all(workers.values())
    refused = [r.getMessage() for r in caplog.records if "not subscribing" in r.getMessage()]
    assert len(refused) == 2
    assert any("169.254.169.254 is outside worker_networks (127.0.0.0/8" in m for m in refused)
    assert any("8.8.8.8 is outside worker_networks" in m for m in refused)
