"""engine sim CLI: --help documents every flag, bad flags get clear errors, SIGTERM drains."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import aiohttp
import pytest

from tests.component.engine.engine_process import ENTRY, start_engine
from tests.waiting import eventually_async

pytestmark = pytest.mark.component

FLAGS = (
    "--host", "--port", "--tpu", "--topology", "--model-profile", "--served-model-name",
    "--tokenizer", "--cache-tokens", "--page-size", "--time-scale", "--kv-events-endpoint",
    "--kv-events-replay-endpoint", "--max-running-requests", "--chunked-prefill-size",
    "--max-queued-requests", "--context-length", "--seed", "--drain-grace-seconds",
)  # fmt: skip


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", ENTRY, "engine", "sim", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_help_documents_every_flag() -> None:
    out = run_cli("--help")
    assert out.returncode == 0
    for flag in FLAGS:
        assert flag in out.stdout, flag


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topology", "3x3"], "--topology: '3x3' is not allowed"),
        (["--tpu", "v9"], "invalid choice: 'v9'"),
        (["--page-size", "0"], "--page-size"),
        (["--time-scale", "-1"], "--time-scale"),
        (["--model-profile", "gpt-9"], "--model-profile: 'gpt-9' is not allowed"),
        (["--model-profile", "llama-3.3-70b"], "short by"),
        (["--kv-events-endpoint", "localhost:1"], "--kv-events-endpoint"),
        (["--cache-tokens", "100", "--context-length", "200"], "--context-length: 200"),
    ],
)
def test_bad_flags_exit_2_with_the_flag_named(args: list[str], message: str) -> None:
    out = run_cli(*args)
    assert out.returncode == 2
    assert message in out.stderr


def test_sigterm_fails_health_finishes_in_flight_requests_and_exits_zero() -> None:
    engine = start_engine(["--time-scale", "0.5", "--drain-grace-seconds", "60"])

    async def scenario() -> tuple[int, int]:
        async with aiohttp.ClientSession() as s:
            body = {"prompt": "drain me", "max_tokens": 40, "stream": True}
            async with s.post(engine.url + "/v1/completions", json=body) as r:
                await r.content.readline()  # the first token is out: the request is in flight
                engine.proc.send_signal(15)

                async def unhealthy() -> int | None:
                    async with s.get(engine.url + "/health") as h:
                        return None if h.status == 200 else h.status

                health = await eventually_async(
                    unhealthy, what="/health to fail once draining", timeout_seconds=20
                )
                chunks = [line async for line in r.content if line.startswith(b"data: ")]
            assert chunks[-1] == b"data: [DONE]\n"
            return health, r.status

    health, status = asyncio.run(scenario())
    assert (health, status) == (503, 200)
    assert engine.proc.wait(timeout=60) == 0
