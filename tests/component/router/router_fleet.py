"""Engine twins as real processes on loopback, and a router in the test's event loop.

`EngineTwin` runs `tpuserve engine sim` on a fixed free port (so a test can kill it and
start it again on the same address, KV-event sockets included). `Fleet` starts N of them
and a `RouterApp` in front, in the test's own event loop, so tests can read the router's
state (in-flight counts, health, decisions) while talking to it over real HTTP.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from prometheus_client import CollectorRegistry

from tests.waiting import eventually, eventually_async
from tpuserve.cluster.ports import free_port
from tpuserve_router.app import RouterApp, create_router_app
from tpuserve_router.config import RouterConfig

ENTRY = "import sys; from tpuserve.cli import main; sys.exit(main())"
START_TIMEOUT_SECONDS = 30.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # what the twin serves by default


STDERR_TAIL_CHARS = 2000
START_ATTEMPTS = 3


class EngineExited(RuntimeError):
    """The twin exited before serving; ``stderr`` is the end of what it wrote."""

    def __init__(self, returncode: int, stderr: str) -> None:
        super().__init__(f"engine exited with {returncode} before serving; stderr:\n{stderr}")
        self.stderr = stderr

    @property
    def port_taken(self) -> bool:
        """One of its ports was bound by another process between their choice and its bind."""
        return "address already in use" in self.stderr.lower()


@dataclass
class EngineTwin:
    """One `tpuserve engine sim` process with fixed HTTP and KV-event ports."""

    args: Sequence[str] = ()
    port: int = field(default_factory=free_port)
    kv_port: int = field(default_factory=free_port)
    replay_port: int = field(default_factory=free_port)
    kv_events: bool = True
    proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def kv_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.kv_port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    def start(self) -> EngineTwin:
        cmd = [sys.executable, "-c", ENTRY, "engine", "sim", "--port", str(self.port)]
        cmd += ["--log-level", "warning"]  # its stderr, kept for a failed start, stays small
        cmd += ["--enable-cache-report", *self.args]  # cached tokens in usage, as the launcher
        if self.kv_events:
            cmd += [
                "--kv-events-endpoint", self.kv_endpoint,
                "--kv-events-replay-endpoint", self.replay_endpoint,
            ]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with tempfile.TemporaryFile("w+") as stderr:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env
            )
            assert self.proc.stdout is not None
            selector = selectors.DefaultSelector()
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + START_TIMEOUT_SECONDS
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    stderr.seek(0)
                    raise EngineExited(self.proc.returncode, stderr.read()[-STDERR_TAIL_CHARS:])
                if selector.select(timeout=0.2) and self.proc.stdout.readline().startswith("READY"):
                    return self
        self.kill()
        raise RuntimeError("engine twin did not become ready in time")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        stop_process(self.proc)


def stop_process(proc: subprocess.Popen[str] | None) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 10 s."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_engines(n: int, args: Sequence[str] = (), kv_events: bool = True) -> list[EngineTwin]:
    """``n`` twins, each on ports of its own. A twin whose port another process took between
    its choice and the twin's bind (the ports are only known free when chosen) starts again on
    new ones; any other failure is raised with the twin's stderr."""
    engines: list[EngineTwin] = []
    try:
        for _ in range(n):
            for attempt in range(START_ATTEMPTS):
                engine = EngineTwin(args, kv_events=kv_events)
                try:
                    engines.append(engine.start())
                    break
                except EngineExited as exited:
                    if not exited.port_taken or attempt == START_ATTEMPTS - 1:
                        raise
    except Exception:
        for engine in engines:
            engine.kill()
        raise
    return engines


async def start_router(config: RouterConfig, ready_workers: int = 0) -> RouterApp:
    """A started router on a free loopback port; with `ready_workers`, once that many workers
    are routable (stopped again if they are not: a leaked router's servers are collected in a
    later test, which then fails on their unraisable warnings)."""
    app = create_router_app(config.replace(host="127.0.0.1", port=0), registry=CollectorRegistry())
    await app.start()
    if ready_workers:
        try:
            await wait_ready(app, ready_workers)
        except BaseException:
            await app.stop()
            raise
    return app


async def wait_ready(app: RouterApp, workers: int, timeout_seconds: float = 15.0) -> None:
    def ready() -> bool:
        return sum(1 for w in app.registry.workers if w.healthy and w.models) >= workers

    await eventually_async(
        ready, what=f"{workers} routable workers", timeout_seconds=timeout_seconds
    )


async def wait_caught_up(
    app: RouterApp, workers: Sequence[str], timeout_seconds: float = 30.0
) -> None:
    """Until the router is subscribed to each worker's KV events and the catch-up replay it
    asks for on connecting has answered: an event published before the connection is in that
    replay, one after it on the stream (a request sent before the handshake was done, under
    load, could otherwise lose its events)."""

    def caught_up() -> bool:
        hub = app.kv
        assert hub is not None, "the policy subscribes to KV events"
        return all(
            hub.subscriptions(url)
            and sample(app, "tpuserve_router_kv_event_replays_total",
                       {"worker": url, "result": "ok"}) >= 1
            for url in workers
        )  # fmt: skip

    await eventually_async(
        caught_up,
        what="KV-event subscriptions and their catch-up replays",
        timeout_seconds=timeout_seconds,
    )


def sample(app: RouterApp, name: str, labels: dict[str, str] | None = None) -> float:
    """The value of one series on the router's registry (0 if absent)."""
    value = app.metrics.registry.get_sample_value(name, labels or {})
    return value or 0.0


def requests_by_worker(app: RouterApp, route: str = "/v1/completions") -> dict[str, float]:
    counts: dict[str, float] = {}
    for family in app.metrics.registry.collect():
        if family.name != "tpuserve_router_requests":
            continue
        for s in family.samples:
            if s.name.endswith("_total") and s.labels["route"] == route:
                worker = s.labels["worker"]
                counts[worker] = counts.get(worker, 0) + s.value
    return counts


ROUTER_START_TIMEOUT_SECONDS = 30.0


@dataclass
class RouterProcess:
    """One `tpuserve router` process on a free loopback port (router replicas are processes);
    its log goes to a temporary file (``log()`` reads it)."""

    args: Sequence[str] = ()
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[str] | None = None
    log_file: IO[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return Path(self.log_file.name).read_text() if self.log_file is not None else ""

    def start(self) -> RouterProcess:
        cmd = [sys.executable, "-c", ENTRY, "router", "--port", str(self.port), *self.args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # open for the process's life, closed (and removed) by stop()
        self.log_file = tempfile.NamedTemporaryFile("w", prefix="router-", suffix=".log")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=self.log_file, text=True, env=env
        )
        proc = self.proc

        def listening() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"router exited with {proc.returncode}:\n{self.log()}")
            return "listening on" in self.log()

        try:
            eventually(
                listening, what="the router listening", context=self.log,
                timeout_seconds=ROUTER_START_TIMEOUT_SECONDS, interval_seconds=0.1,
            )  # fmt: skip
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        stop_process(self.proc)
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None
