"""status.compileCache: the key from the spec, each Ready leader's start read and counted once,
counts kept for the same key and restarted for a new one."""

from __future__ import annotations

import asyncio
import datetime
import http.server
import json
import threading
from typing import Any

import pytest

from sglang_tpu import compile_cache
from sglang_tpu.cold_start import ColdStartReport
from tests.fake_kube import make_pod
from tpuserve_operator import labels
from tpuserve_operator.api import TPUModelServerStatus
from tpuserve_operator.cold_starts import (
    MAX_REPORT_BYTES,
    ColdStartTracker,
    LeaderStart,
    PodLister,
    cache_location,
    compile_cache_status,
    read_server_info,
)
from tpuserve_operator.observed import PodView
from tpuserve_operator.render import RenderConfig, validate_server
from tpuserve_operator.render.context import ValidServer
from tpuserve_operator.status_writer import build_status

pytestmark = pytest.mark.unit

SECONDS = {"pull": 0.0, "weights": 0.14, "compile": 3.4, "warmup": 0.05}
MISS = ColdStartReport(SECONDS, "miss")
HIT = ColdStartReport({**SECONDS, "compile": 1.35}, "hit")


def server(image: str = "ghcr.io/tpuserve/tpuserve-tpu:0.3.0") -> ValidServer:
    spec = {
        "model": {"source": "hf://Qwen/Qwen3-8B"},
        "tpu": {"generation": "v6e", "topology": "2x4"},
        "engine": {"image": image, "compileCache": {"persistentVolumeClaim": "xla"}},
    }
    return validate_server({"name": "qwen", "namespace": "ml"}, spec, RenderConfig())


def leader(name: str, uid: str, restarts: int = 0, ready: bool = True) -> PodView:
    return make_pod(
        name, role=labels.ROLE_LEADER, uid=uid, ip="127.244.0.9", restarts=restarts, ready=ready
    )


def test_the_status_key_is_the_launchers_key_of_the_rendered_contract() -> None:
    valid = server()
    location = cache_location(valid.valid.spec.engine.compile_cache)
    status = compile_cache_status(None, valid.contract, location, [])
    assert status.key == compile_cache.cache_key(valid.contract)
    assert status.key == "v6e-2x4/hf_Qwen_Qwen3-8B/ghcr.io_tpuserve_tpuserve-tpu_0.3.0"
    assert (status.location, status.hits, status.misses, status.last_cold_start) == (
        "pvc/xla", 0, 0, None,
    )  # fmt: skip


def test_starts_are_counted_and_the_last_one_is_shown_by_phase() -> None:
    contract = server().contract
    first = compile_cache_status(None, contract, "pvc/xla", [LeaderStart("qwen-r0-0", MISS)])
    second = compile_cache_status(first, contract, "pvc/xla", [LeaderStart("qwen-r1-0", HIT)])
    assert (second.hits, second.misses) == (1, 1)
    last = second.last_cold_start
    assert last is not None
    assert (last.pod, last.cache_result, last.compile_seconds) == ("qwen-r1-0", "hit", 1.35)
    assert (last.pull_seconds, last.weights_seconds, last.warmup_seconds) == (0.0, 0.14, 0.05)


def test_a_new_engine_version_is_a_new_key_with_its_own_counts() -> None:
    old = compile_cache_status(None, server().contract, "pvc/xla", [LeaderStart("a", HIT)])
    new = compile_cache_status(old, server("ghcr.io/x/engine:2").contract, "pvc/xla", [])
    assert new.key != old.key
    assert (new.hits, new.misses, new.last_cold_start) == (0, 0, None)


def test_build_status_writes_the_compile_cache() -> None:
    cache = compile_cache_status(None, server().contract, "pvc/xla", [LeaderStart("a", MISS)])
    status = build_status(
        TPUModelServerStatus(),
        [],
        now=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        generation=1,
        observed=True,
        compile_cache=cache,
    )
    dumped = status.model_dump(by_alias=True, exclude_none=True)
    assert dumped["compileCache"]["misses"] == 1
    assert dumped["compileCache"]["lastColdStart"]["cacheResult"] == "miss"
    assert dumped["compileCache"]["lastColdStart"]["compileSeconds"] == 3.4


def test_each_ready_leader_start_is_read_once() -> None:
    read: list[str] = []

    async def reader(url: str) -> ColdStartReport | None:
        read.append(url)
        return MISS

    async def scenario() -> list[list[str]]:
        tracker = ColdStartTracker()
        passes = [
            [],  # the first pass: nothing Ready yet
            [leader("r0", "u0", ready=False)],  # starting: not read
            [leader("r0", "u0")],  # Ready: read
            [leader("r0", "u0"), make_pod("r0-1", uid="w1", ip="127.244.0.8")],  # a worker
            [leader("r0", "u0", restarts=1)],  # its container restarted: a new start
        ]
        found = []
        for pods in passes:
            starts = await tracker.new_starts(pods, 30000, reader, listed(passes[0]))
            found.append([s.pod for s in starts])
        return found

    assert asyncio.run(scenario()) == [[], [], ["r0"], [], ["r0"]]
    assert read == ["http://127.244.0.9:30000", "http://127.244.0.9:30000"]


def test_after_an_operator_restart_the_leaders_already_up_are_not_counted_again() -> None:
    async def reader(url: str) -> ColdStartReport | None:
        return HIT

    async def scenario() -> tuple[int, int]:
        tracker = ColdStartTracker()
        up_before = listed([leader("r0", "u0")])
        up = await tracker.new_starts([leader("r0", "u0")], 30000, reader, up_before)
        both = [leader("r0", "u0"), leader("r1", "u1")]
        new = await tracker.new_starts(both, 30000, reader, up_before)
        return len(up), len(new)

    assert asyncio.run(scenario()) == (0, 1)


def test_after_a_restart_the_leaders_up_are_taken_from_a_list_not_the_watch_cache() -> None:
    async def reader(url: str) -> ColdStartReport | None:
        return HIT

    async def cannot_list() -> list[PodView] | None:
        return None

    async def scenario() -> list[int]:
        tracker = ColdStartTracker()
        up = listed([leader("r0", "u0")])
        return [
            len(await tracker.new_starts([], 30000, reader, cannot_list)),  # tried again
            len(await tracker.new_starts([], 30000, reader, up)),  # the cache lags the list
            len(await tracker.new_starts([leader("r0", "u0")], 30000, reader, up)),
        ]

    assert asyncio.run(scenario()) == [0, 0, 0]


def listed(pods: list[PodView]) -> PodLister:
    """A pod list from the API that returns `pods`."""

    async def lister() -> list[PodView] | None:
        return list(pods)

    return lister


class _InfoHandler(http.server.BaseHTTPRequestHandler):
    """A leader's /server_info: a redirect, an oversized body or a report."""

    def do_GET(self) -> None:
        if self.path == "/moved/server_info":
            self.send_response(302)
            self.send_header("Location", "/server_info")
            self.end_headers()
            return
        info: dict[str, Any] = {"tpuserve": {"cold_start": MISS.as_json()}}
        if self.path == "/big/server_info":
            info["padding"] = "x" * MAX_REPORT_BYTES
        body = json.dumps(info).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_report_read_follows_no_redirect_and_reads_a_bounded_body() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _InfoHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert asyncio.run(read_server_info(base)) == MISS
        assert asyncio.run(read_server_info(f"{base}/moved")) is None
        assert asyncio.run(read_server_info(f"{base}/big")) is None
    finally:
        server.shutdown()
        server.server_close()
