"""The twin in SGLang's PD roles, in process on loopback: a prefill twin's bootstrap server
answers as SGLang's, a pair makes the colocated answer, a request without a room is refused,
and a failed transfer fails both legs and counts on both engines."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from sglang_tpu.sim.cli import build_settings, configure
from sglang_tpu.sim.server import create_app
from sglang_tpu.sim.service import SERVICE

pytestmark = pytest.mark.unit

PROMPT = "a prompt about prefill and decode engines " * 8


def settings(*argv: str) -> Any:
    parser = argparse.ArgumentParser()
    configure(parser)
    return build_settings(parser.parse_args(["--time-scale", "0", *argv]))


@dataclass
class Pair:
    prefill: TestServer
    decode: TestServer
    colocated: TestServer
    bootstrap_port: int

    def url(self, server: TestServer) -> str:
        return str(server.make_url(""))


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    prefill = TestServer(
        create_app(
            settings(
                "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0",
                "--enable-debug-endpoints",
            )
        )
    )  # fmt: skip
    decode = TestServer(create_app(settings("--disaggregation-mode", "decode")))
    colocated = TestServer(create_app(settings()))
    for server in (prefill, decode, colocated):
        await server.start_server()
    role = prefill.app[SERVICE].pd
    assert role is not None
    assert role.bound_port is not None
    yield Pair(prefill, decode, colocated, role.bound_port)
    for server in (prefill, decode, colocated):
        await server.close()


async def post(session: ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with session.post(url, json=body) as response:
        return response.status, await response.json(content_type=None)


def body(pair: Pair, room: int, max_new_tokens: int = 8) -> dict[str, Any]:
    return {
        "text": PROMPT, "sampling_params": {"max_new_tokens": max_new_tokens},
        "bootstrap_host": "127.0.0.1", "bootstrap_port": pair.bootstrap_port,
        "bootstrap_room": room,
    }  # fmt: skip


async def test_the_bootstrap_server_answers_as_sglangs(pair: Pair) -> None:
    base = f"http://127.0.0.1:{pair.bootstrap_port}"
    async with ClientSession() as session:
        async with session.get(base + "/health") as r:
            assert (r.status, await r.text()) == (200, "OK")
        info = {k: "-1" for k in ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank",
                                  "target_pp_rank")}  # fmt: skip
        async with session.get(base + "/route", params=info) as r:
            assert r.status == 200
            assert (await r.json())["dp_size"] == 1
        async with session.get(base + "/route") as r:
            assert (r.status, await r.text()) == (400, "Missing inputs for bootstrap server.")
        room = {"bootstrap_room": 7, "dp_rank": 0}
        async with session.post(base + "/register_dp_rank", json=room) as r:
            assert (r.status, await r.text()) == (200, "OK")
        status, ranks = await post(session, base + "/query_dp_ranks", {"bootstrap_rooms": [7, 8]})
        assert (status, ranks) == (200, {"7": 0})


async def test_a_pair_answers_what_a_colocated_engine_answers(pair: Pair) -> None:
    async with ClientSession() as session:
        (p_status, p_answer), (d_status, d_answer) = await asyncio.gather(
            post(session, pair.url(pair.prefill) + "/generate", body(pair, 42)),
            post(session, pair.url(pair.decode) + "/generate", body(pair, 42)),
        )
        status, colocated = await post(
            session, pair.url(pair.colocated) + "/generate",
            {"text": PROMPT, "sampling_params": {"max_new_tokens": 8}},
        )  # fmt: skip
    assert (p_status, d_status, status) == (200, 200, 200)
    assert p_answer["meta_info"]["completion_tokens"] == 1
    assert d_answer["output_ids"] == colocated["output_ids"]
    assert d_answer["output_ids"][0] == p_answer["output_ids"][0]
    prefill = pair.prefill.app[SERVICE].registry
    labels = {"engine_type": "prefill"}
    assert _sample(prefill, "sglang:kv_transfer_latency_ms_count", labels) == 1


async def test_a_request_without_a_room_is_refused_as_sglang_refuses_it(pair: Pair) -> None:
    async with ClientSession() as session:
        status, answer = await post(session, pair.url(pair.decode) + "/generate", {"text": "x"})
    assert status == 400
    assert "Disaggregated request received without bootstrap room id" in answer["error"]["message"]


async def test_a_failed_transfer_fails_both_legs(pair: Pair) -> None:
    async with ClientSession() as session:
        status, _ = await post(
            session, pair.url(pair.prefill) + "/debug/pd_fault", {"kind": "transfer_failure"}
        )
        assert status == 200
        (p_status, p_answer), (d_status, d_answer) = await asyncio.gather(
            post(session, pair.url(pair.prefill) + "/generate", body(pair, 5)),
            post(session, pair.url(pair.decode) + "/generate", body(pair, 5)),
        )
        bad, refused = await post(
            session, pair.url(pair.prefill) + "/debug/pd_fault", {"kind": "meteor", "count": 1}
        )
    assert (p_status, d_status) == (500, 500)
    assert "transfer of room 5 failed" in p_answer["error"]["message"]
    assert "transfer of room 5 failed" in d_answer["error"]["message"]
    for server, role in ((pair.prefill, "prefill"), (pair.decode, "decode")):
        registry = server.app[SERVICE].registry
        assert (
            _sample(registry, "sglang:num_transfer_failed_reqs_total", {"engine_type": role}) == 1
        )
    assert bad == 400
    assert "allowed: kind one of bootstrap_timeout" in refused["error"]["message"]


def _sample(registry: Any, name: str, labels: dict[str, str]) -> float:
    return sum(
        float(s.value)
        for family in registry.collect()
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    )
