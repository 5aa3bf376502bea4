"""The router over unix sockets: `unix:` workers (an engine twin serving on a socket file) and
the router's own `--uds` listener, real HTTP both ways (what a sidecar deployment and the TPU
lane's machine, which refuses TCP sockets, need)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import openai
import pytest
from aiohttp import web
from openai.types.chat import ChatCompletionMessageParam

from sglang_tpu.sim import cli as sim_cli
from sglang_tpu.sim.server import create_app
from sglang_tpu.sim.service import SERVICE
from tests.component.router.router_fleet import start_router
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig

pytestmark = pytest.mark.component

ENTRY = "import sys; from tpuserve.cli import main; sys.exit(main())"
ROUTER = [sys.executable, "-c", ENTRY, "router"]
PROMPT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "a prompt long enough to share its first blocks " * 8}
]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory with a short path: a socket's path holds at most 107 bytes, and pytest's
    tmp_path can be longer."""
    with tempfile.TemporaryDirectory(prefix="uds-", dir="/tmp") as folder:
        yield Path(folder)


RUNNERS: dict[Path, web.AppRunner] = {}


@pytest.fixture
async def twin(short_tmp: Path) -> AsyncIterator[Path]:
    """An engine twin (`tpuserve engine sim`'s app, time scale 0) serving on a unix socket
    (its runner in `RUNNERS`, for a test that stops it)."""
    parser = argparse.ArgumentParser()
    sim_cli.configure(parser)
    settings = sim_cli.build_settings(
        parser.parse_args(["--time-scale", "0", "--enable-cache-report"])
    )
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    path = short_tmp / "engine.sock"
    await web.UnixSite(runner, str(path)).start()
    await asyncio.wait_for(app[SERVICE].up.wait(), 30)
    RUNNERS[path] = runner
    yield path
    if RUNNERS.pop(path, None) is not None:
        await runner.cleanup()


@pytest.fixture
async def router(twin: Path) -> AsyncIterator[RouterApp]:
    config = RouterConfig(
        workers=(f"unix:{twin}",), policy="cache_aware", health_check_interval_seconds=0.5
    )
    app = await start_router(config, ready_workers=1)  # routable, and its models learned
    yield app
    await app.stop()


async def test_a_unix_worker_answers_through_the_router(router: RouterApp, twin: Path) -> None:
    name = f"unix:{twin}"
    (worker,) = router.registry.workers
    assert worker.name == name
    assert worker.models
    client = openai.AsyncOpenAI(base_url=router.base_url + "/v1", api_key="unused", max_retries=0)
    model = worker.models[0]
    first = await client.chat.completions.create(model=model, messages=PROMPT, max_tokens=8)
    assert first.choices[0].message.content
    again = await client.chat.completions.create(model=model, messages=PROMPT, max_tokens=8)
    assert again.usage is not None
    assert again.usage.prompt_tokens_details is not None
    assert (again.usage.prompt_tokens_details.cached_tokens or 0) > 0  # the twin kept the prefix
    chunks = [
        c.choices[0].delta.content or ""
        async for c in await client.chat.completions.create(
            model=model,
            messages=PROMPT,
            max_tokens=8,
            stream=True,
        )
        if c.choices
    ]
    assert "".join(chunks)
    await client.close()
    async with aiohttp.ClientSession() as session:
        async with session.get(router.base_url + "/workers") as response:
            listed = await response.json()
        assert [w["url"] for w in listed["workers"]] == [name]
        async with session.post(router.base_url + "/flush_cache") as response:
            flushed = await response.json()  # sent to the worker over its socket
        assert response.status == 200
        assert flushed["workers"][name]["status"] == 200
        async with session.get(router.base_url + "/metrics") as response:
            metrics = await response.text()
    assert f'worker="{name}"' in metrics


async def test_a_unix_worker_that_goes_away_is_ejected_by_its_health_checks(
    router: RouterApp, twin: Path
) -> None:
    await RUNNERS.pop(twin).cleanup()  # its connections closed, its socket file gone
    (worker,) = router.registry.workers
    await eventually_async(
        lambda: not worker.healthy, what="the worker ejected", timeout_seconds=15
    )


async def test_the_router_listens_on_a_unix_socket(twin: Path, short_tmp: Path) -> None:
    """`tpuserve router --uds PATH --worker unix:ENGINE`: the socket file (mode 0660) answers
    readiness and a streamed chat; SIGTERM stops the router and removes the file."""
    sock = short_tmp / "router.sock"
    proc = await asyncio.create_subprocess_exec(
        *ROUTER, "--uds", str(sock), "--worker", f"unix:{twin}", "--health-check-interval", "0.5",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        line = await asyncio.wait_for(proc.stderr.readline(), 60)
        while b"listening on" not in line:
            assert line, "the router exited before listening"
            line = await asyncio.wait_for(proc.stderr.readline(), 60)
        assert f"unix:{sock}".encode() in line
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o660
        connector = aiohttp.UnixConnector(path=str(sock))
        async with aiohttp.ClientSession(connector=connector) as session:

            async def ready() -> bool:
                async with session.get("http://localhost/readiness") as response:
                    if (await response.json())["healthy_workers"] != 1:
                        return False
                # the worker's models are learned by a poll of their own, after its health
                async with session.get("http://localhost/v1/models") as response:
                    return bool((await response.json())["data"])

            await eventually_async(ready, what="a routable unix worker", timeout_seconds=30)
            async with session.get("http://localhost/v1/models") as response:
                model = (await response.json())["data"][0]["id"]
            body = {"model": model, "messages": PROMPT, "max_tokens": 4, "stream": True}
            async with session.post("http://localhost/v1/chat/completions", json=body) as response:
                assert response.status == 200
                events = [line async for line in response.content if line.startswith(b"data:")]
        assert events[-1].strip() == b"data: [DONE]"
        assert len(events) >= 2
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        assert not sock.exists()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (
            ["--worker", "unix:engine.sock"],
            "worker url 'unix:engine.sock': the path is not absolute",
        ),
        (["--uds", "router.sock"], "uds='router.sock': must be an absolute path"),
    ],
)
def test_a_bad_socket_flag_exits_2_naming_it(flags: list[str], named: str) -> None:
    result = subprocess.run([*ROUTER, *flags], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert named in result.stderr
