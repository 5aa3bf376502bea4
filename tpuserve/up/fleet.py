"""The fleet's child processes: start a `tpuserve` subcommand and wait for its ready line,
watch them, and stop them in order.

Children get their own session, so Ctrl-C reaches `tpuserve up` only and it stops them in
order (the router before the engines). Their pipes are drained for their whole life, so a
chatty child never blocks on a full pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from tpuserve.subprocesses import stop_processes
from tpuserve.up.errors import UpError

ENTRY = "import sys; from tpuserve.cli import main; sys.exit(main())"
START_TIMEOUT_SECONDS = 60.0
RELAYED = "cold start:"  # the engine twin's log line for each phase of its start


@dataclass
class Child:
    name: str
    proc: asyncio.subprocess.Process
    url: str = ""
    drains: list[asyncio.Task[None]] = field(default_factory=list)


async def spawn(name: str, args: Sequence[str], ready_prefix: str) -> Child:
    """Start a `tpuserve` subcommand; wait for its line starting with ``ready_prefix``."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ENTRY, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,  # Ctrl-C reaches us only; we stop children in order
    )  # fmt: skip
    child = Child(name, proc)
    stream = proc.stdout if ready_prefix == "READY" else proc.stderr
    assert stream is not None
    if stream is not proc.stderr and proc.stderr is not None:
        # An engine's cold-start phases, shown as they happen (`sglang_tpu.sim.startup`).
        child.drains.append(asyncio.ensure_future(relay(proc.stderr, name, RELAYED)))
    try:
        async with asyncio.timeout(START_TIMEOUT_SECONDS):
            while True:
                line = (await stream.readline()).decode(errors="replace")
                if not line:
                    detail = ""
                    if proc.stderr is not None and stream is not proc.stderr:
                        detail = (await proc.stderr.read()).decode(errors="replace")[-2000:]
                    raise UpError(f"{name} exited before it was ready:\n{detail}")
                if line.startswith(ready_prefix):
                    child.url = line.rsplit(" ", 1)[-1].strip()
                    break
    except TimeoutError:
        proc.kill()
        raise UpError(f"{name} was not ready within {START_TIMEOUT_SECONDS:g} s") from None
    # Keep draining the pipes so a chatty child never blocks on a full pipe.
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None and not (pipe is proc.stderr and child.drains):
            child.drains.append(asyncio.ensure_future(_drain(pipe)))
    return child


async def relay(stream: asyncio.StreamReader, name: str, marker: str) -> None:
    """Drain `stream`, printing the lines holding `marker` with the child's name."""
    with contextlib.suppress(Exception):
        while line := await stream.readline():
            text = line.decode(errors="replace").rstrip()
            if marker in text:
                print(f"{name}: {text[text.index(marker) :]}", file=sys.stderr, flush=True)


async def _drain(stream: asyncio.StreamReader) -> None:
    with contextlib.suppress(Exception):
        while await stream.read(65536):
            pass


async def stop_children(children: Sequence[Child]) -> None:
    await stop_processes([child.proc for child in children])


async def watch_children(children: Sequence[Child], stop: asyncio.Event) -> None:
    """Set `stop` as soon as any child exits."""
    await asyncio.wait(
        [asyncio.ensure_future(c.proc.wait()) for c in children],
        return_when=asyncio.FIRST_COMPLETED,
    )
    stop.set()


def exited(children: Sequence[Child]) -> list[str]:
    """Names of the children that exited with an error."""
    return [c.name for c in children if c.proc.returncode not in (None, 0)]


async def wait_routable(base_url: str) -> str:
    """Wait until the router has a routable worker; return the model it serves."""
    import aiohttp

    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(base_url + "/v1/models") as response:
                    data = (await response.json()).get("data") or []
                    if data:
                        return str(data[0]["id"])
            await asyncio.sleep(0.1)
    raise UpError(f"the router at {base_url} had no routable worker after "
                  f"{START_TIMEOUT_SECONDS:g} s")  # fmt: skip
