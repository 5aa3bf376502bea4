"""`tpuserve up` shows each engine's cold-start phases: only those log lines, with its name."""

from __future__ import annotations

import asyncio

import pytest

from tpuserve.up import fleet

pytestmark = pytest.mark.unit


def test_only_cold_start_lines_are_relayed_with_the_childs_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def relay() -> None:
        stream = asyncio.StreamReader()
        stream.feed_data(
            b"2026-12-01 INFO sglang_tpu.sim.startup: cold start: compile took 3.42 s "
            b"(340.0 s at real scale, compile cache miss)\n"
            b"2026-12-01 INFO sglang_tpu.sim.cli: engine twin serving\n"
        )
        stream.feed_eof()
        await fleet.relay(stream, "engine 0", fleet.RELAYED)

    asyncio.run(relay())
    assert capsys.readouterr().err.splitlines() == [
        "engine 0: cold start: compile took 3.42 s (340.0 s at real scale, compile cache miss)"
    ]
