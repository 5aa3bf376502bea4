"""`tpuserve up`: a local fleet on loopback: engine twins, the router, and optional load.

It starts ``--workers`` `tpuserve engine sim` processes (each with its KV-event and replay
sockets) and one `tpuserve router` process in front of them, all bound to 127.0.0.1 on free
ports (the router on ``--port``), waits until the router has a routable worker and prints
the OpenAI base URL. With ``--load NAME`` it also drives traffic through the router and
shows, live: requests/s, output tokens/s, prefix-cache hit rate (cached / prompt tokens,
from the responses' usage) and p50/p99 time to first token. Ctrl-C (or SIGTERM) stops the
load, then the router and the engines, and exits 0.

Loads are traces of requests with arrival times (`LoadRequest`). ``shared-prefix`` is
built in; `register_load` adds more, and the benchmark's workloads (W0-W8 of
`tpuserve.bench.workloads`) are offered when that module is installed. A trace is
rescaled to ``--rate`` requests per second and replayed in a loop until ``--requests``
or ``--duration`` is reached, or Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sglang_tpu import cli_types

DESCRIPTION = """Run a local fleet on loopback: engine twins and the router (and optional load).

Starts --workers engine twins (`tpuserve engine sim`) and a router (`tpuserve router`) in
front of them, prints the OpenAI base URL, and with --load drives traffic through the router
with a live display of requests/s, tokens/s, prefix hit rate and p50/p99 time to first
token. Ctrl-C stops everything.

examples:
  tpuserve up                                    # 4 engines + router on http://127.0.0.1:8000
  tpuserve up --workers 2 --policy precise --load shared-prefix --rate 20
  tpuserve up --load W1 --rate 10 --duration 60  # a benchmark workload, when installed
  tpuserve up --load shared-prefix --prometheus  # + Prometheus with the chart's rules on :9090
"""

ENTRY = "import sys; from tpuserve.cli import main; sys.exit(main())"
START_TIMEOUT_SECONDS = 60.0
STOP_GRACE_SECONDS = 10.0
WINDOW_SECONDS = 10.0  # rates and percentiles shown over this trailing window


class UpError(Exception):
    """A problem `tpuserve up` reports and exits on (message names the flag or process)."""


# ====================================================================== loads (the hook)


class LoadRequest(Protocol):
    """One request of a load trace (`tpuserve.bench.workloads.TraceRequest` fits)."""

    @property
    def t(self) -> float:
        """Arrival time in seconds from the start of the trace."""
        ...

    def body(self) -> tuple[str, dict[str, Any]]:
        """The route and JSON body that send it (without model and stream)."""
        ...


LoadFactory = Callable[[int, int | None], Sequence[LoadRequest]]
"""``factory(seed, requests)``: a trace (``requests`` None: the load's own length)."""

_LOADS: dict[str, tuple[str, LoadFactory]] = {}


def register_load(name: str, description: str, factory: LoadFactory) -> None:
    """Offer ``--load name``: ``factory(seed, requests)`` returns the trace."""
    _LOADS[name] = (description, factory)


def load_names() -> list[str]:
    return sorted(_LOADS) + _bench_workload_names()


def make_load(name: str, seed: int, requests: int | None) -> Sequence[LoadRequest]:
    entry = _LOADS.get(name)
    if entry is not None:
        return entry[1](seed, requests)
    if name in _bench_workload_names():
        from tpuserve.bench import workloads

        trace: Sequence[LoadRequest] = workloads.generate(name, seed=seed, requests=requests)
        return trace
    raise UpError(f"--load: {name!r} is not allowed; allowed: {', '.join(load_names())}")


def _bench_workload_names() -> list[str]:
    try:
        from tpuserve.bench import workloads
    except ImportError:
        return []
    names: list[str] = workloads.workload_names()
    return names


@dataclass(frozen=True, slots=True)
class BuiltinRequest:
    t: float
    route: str
    payload: dict[str, Any]

    def body(self) -> tuple[str, dict[str, Any]]:
        return self.route, dict(self.payload)


def shared_prefix_load(seed: int, requests: int | None) -> list[BuiltinRequest]:
    """16 groups, each a ~1,000-token system prompt shared by short questions; Poisson
    arrivals at 10/s (rescaled by --rate). Words are letters only, one token each in the
    engine twin's default tokenizer, so every router sees the same prefixes."""
    rng = random.Random(seed)
    n = requests or 2000
    letters = "abcdefghijklmnopqrstuvwxyz"

    def words(count: int) -> str:
        return "".join(" " + "".join(rng.choice(letters) for _ in range(3)) for _ in range(count))

    systems = [f"group{g}:" + words(1000) for g in range(16)]
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(10.0)
        group = min(int(rng.paretovariate(1.2)) - 1, 15)  # a few hot groups, a long tail
        messages = [
            {"role": "system", "content": systems[group]},
            {"role": "user", "content": f"question {i}:" + words(rng.randint(20, 60))},
        ]
        payload = {"messages": messages, "max_tokens": rng.randint(16, 64)}
        out.append(BuiltinRequest(t, "/v1/chat/completions", payload))
    return out


register_load(
    "shared-prefix",
    "16 groups of ~1,000-token system prompts with short questions (chat)",
    shared_prefix_load,
)


# ====================================================================== processes


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
        if pipe is not None:
            child.drains.append(asyncio.ensure_future(_drain(pipe)))
    return child


async def _drain(stream: asyncio.StreamReader) -> None:
    with contextlib.suppress(Exception):
        while await stream.read(65536):
            pass


async def stop_children(children: Sequence[Child]) -> None:
    for child in children:
        if child.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)
    for child in children:
        try:
            await asyncio.wait_for(child.proc.wait(), STOP_GRACE_SECONDS)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                child.proc.kill()
            await child.proc.wait()


# ====================================================================== load driver


@dataclass
class LoadStats:
    started: float = field(default_factory=time.monotonic)
    sent: int = 0
    done: int = 0
    failed: int = 0
    in_flight: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    last_error: str = ""
    recent: deque[tuple[float, float | None, int]] = field(
        default_factory=lambda: deque(maxlen=20_000)
    )
    """(finish time, TTFT seconds or None, output tokens) of recent requests."""

    def window(self) -> tuple[float, float, list[float]]:
        now = time.monotonic()
        span = min(WINDOW_SECONDS, max(now - self.started, 1e-9))
        cutoff = now - span
        rows = [r for r in self.recent if r[0] >= cutoff]
        ttfts = sorted(r[1] for r in rows if r[1] is not None)
        return len(rows) / span, sum(r[2] for r in rows) / span, ttfts


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


async def drive(
    base_url: str,
    model: str,
    trace: Sequence[LoadRequest],
    rate: float,
    stats: LoadStats,
    max_requests: int | None,
    stop: asyncio.Event,
) -> None:
    """Replay ``trace`` (in a loop) at ``rate`` requests/s, streaming every request."""
    import aiohttp

    if not trace:
        raise UpError("--load: the trace is empty")
    span = trace[-1].t - trace[0].t
    scale = ((len(trace) - 1) / span) / rate if span > 0 and len(trace) > 1 else 1.0 / rate
    connector = aiohttp.TCPConnector(limit=0)
    tasks: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(
        base_url, connector=connector, timeout=aiohttp.ClientTimeout(total=600)
    ) as session:
        loop = asyncio.get_running_loop()
        start = loop.time()
        offset = 0.0
        while not stop.is_set():
            for item in trace:
                if stop.is_set() or (max_requests is not None and stats.sent >= max_requests):
                    break
                due = start + offset + (item.t - trace[0].t) * scale
                delay = due - loop.time()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    if stop.is_set():
                        break
                stats.sent += 1
                task = asyncio.ensure_future(_one(session, model, item, stats))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            else:
                offset += span * scale + 1.0 / rate
                continue
            break
        if tasks and not stop.is_set():
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _one(session: Any, model: str, item: LoadRequest, stats: LoadStats) -> None:
    import orjson

    route, body = item.body()
    body.update(model=model, stream=True, stream_options={"include_usage": True})
    stats.in_flight += 1
    began = time.monotonic()
    ttft: float | None = None
    usage: dict[str, Any] | None = None
    try:
        async with session.post(route, json=body) as response:
            if response.status != 200:
                stats.failed += 1
                stats.last_error = f"HTTP {response.status}: {(await response.text())[:200]}"
                return
            async for line in response.content:
                if not line.startswith(b"data: {"):
                    continue
                if ttft is None:
                    ttft = time.monotonic() - began
                if b'"usage"' in line:
                    event = orjson.loads(line[6:])
                    if event.get("usage"):
                        usage = event["usage"]
                    elif event.get("error"):
                        stats.failed += 1
                        stats.last_error = str(event["error"].get("message"))[:200]
                        return
        stats.done += 1
        output = 0
        if usage:
            output = int(usage.get("completion_tokens") or 0)
            stats.output_tokens += output
            stats.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            stats.cached_tokens += int(details.get("cached_tokens") or 0)
        stats.recent.append((time.monotonic(), ttft, output))
    except Exception as err:
        stats.failed += 1
        stats.last_error = f"{type(err).__name__}: {err}"[:200]
    finally:
        stats.in_flight -= 1


def render(stats: LoadStats, load: str, policy: str, base_url: str) -> Any:
    from rich.table import Table

    rps, tps, ttfts = stats.window()
    p50, p99 = percentile(ttfts, 0.5), percentile(ttfts, 0.99)
    hit = stats.cached_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.0f} ms"

    table = Table(title=f"tpuserve up: load {load}, policy {policy}, {base_url}/v1")
    for column in ("requests/s", "output tokens/s", "prefix hit rate", "TTFT p50",
                   "TTFT p99", "in flight", "done", "failed"):  # fmt: skip
        table.add_column(column, justify="right")
    table.add_row(f"{rps:.1f}", f"{tps:.0f}", f"{hit:.1%}", ms(p50), ms(p99),
                  str(stats.in_flight), str(stats.done), str(stats.failed))  # fmt: skip
    if stats.last_error:
        table.caption = f"last error: {stats.last_error}"
    table.caption = (table.caption or "") + f"  (rates and TTFT over the last {WINDOW_SECONDS:g} s)"
    return table


# ====================================================================== the command


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workers", type=cli_types.positive_int, default=4, help="Engine twins (default 4)."
    )
    parser.add_argument(
        "--port",
        type=cli_types.port,
        default=8000,
        help="Router port; 0 picks a free one (default 8000).",
    )
    parser.add_argument("--policy", default=None, help="Routing policy (default: the router's).")
    parser.add_argument(
        "--time-scale",
        type=cli_types.non_negative_float,
        default=1.0,
        help="Engine twins' time scale: 1 = modelled TPU time, 0 = instant (default 1).",
    )
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="Extra argument for every engine twin, e.g. --engine-arg=--cache-tokens=65536.",
    )
    parser.add_argument(
        "--router-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="Extra argument for the router, e.g. --router-arg=--policy-param=load_factor=1.5.",
    )
    parser.add_argument(
        "--load", default=None, metavar="NAME", help="Drive traffic: shared-prefix, or W0..W8."
    )
    parser.add_argument(
        "--rate",
        type=cli_types.positive_float,
        default=10.0,
        help="Load requests per second (default 10).",
    )
    parser.add_argument(
        "--requests", type=cli_types.positive_int, default=None, help="Stop the load after N."
    )
    parser.add_argument(
        "--duration", type=cli_types.duration_seconds, default=None, help="Stop after S seconds."
    )
    parser.add_argument(
        "--seed", type=cli_types.non_negative_int, default=0, help="Seed of the load (default 0)."
    )
    parser.add_argument(
        "--prometheus",
        action="store_true",
        help="Also run Prometheus on loopback (tpuserve.observability.local_prometheus): "
        "scrapes engines and router every second, evaluates the chart's rules and alerts.",
    )
    parser.add_argument(
        "--prometheus-port",
        type=cli_types.nonzero_port,
        default=9090,
        help="Prometheus port (default 9090).",
    )
    parser.add_argument(
        "--prometheus-target",
        action="append",
        default=[],
        metavar="JOB=URL",
        help="Another /metrics for that Prometheus to scrape, e.g. an exporter (repeatable).",
    )


def check_args(args: argparse.Namespace) -> None:
    """Checks across flags and against registries (numbers are checked as they are parsed)."""
    problems = []
    if args.policy is not None:
        from tpuserve_router.policies import registered_policy_names

        if args.policy not in registered_policy_names():
            allowed = ", ".join(registered_policy_names())
            problems.append(f"--policy {args.policy!r}: allowed {allowed}")
    if args.load is not None and args.load not in load_names():
        problems.append(f"--load {args.load!r}: allowed {', '.join(load_names())}")
    for target in args.prometheus_target:
        from tpuserve.observability.local_prometheus import parse_target

        try:
            parse_target(target)
        except ValueError as err:
            problems.append(str(err))
    if problems:
        raise UpError("\n  ".join(problems))


def run(args: argparse.Namespace) -> int:
    try:
        check_args(args)
    except UpError as err:
        print(f"tpuserve up: {err}", file=sys.stderr)
        return 2
    import uvloop

    try:
        return uvloop.run(up(args))
    except UpError as err:
        print(f"tpuserve up: {err}", file=sys.stderr)
        return 1


async def up(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    console = Console(stderr=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    children: list[Child] = []
    prometheus: Any = None
    try:
        with console.status(f"starting {args.workers} engine twins"):
            engines = await asyncio.gather(*(
                spawn(f"engine {i}", [
                    "engine", "sim", "--host", "127.0.0.1", "--port", "0",
                    "--time-scale", str(args.time_scale),
                    # ZMQ picks free ports (the twin reports them in /get_server_info,
                    # where the router reads them): no window for another socket to take
                    # a port chosen here first
                    "--kv-events-endpoint", "tcp://127.0.0.1:*",
                    "--kv-events-replay-endpoint", "tcp://127.0.0.1:*",
                    *args.engine_arg,
                ], "READY")
                for i in range(args.workers)
            ))  # fmt: skip
            children.extend(engines)
        router_args = ["router", "--host", "127.0.0.1", "--port", str(args.port)]
        for engine in engines:
            router_args += ["--worker", engine.url]
        # No --kv-events: the router subscribes when its policy uses them (every twin publishes).
        if args.policy:
            router_args += ["--policy", args.policy]
        router_args += args.router_arg
        with console.status("starting the router"):
            router = await spawn("router", router_args, "tpuserve router: listening on")
            children.append(router)
            model = await wait_routable(router.url)
        if args.prometheus:
            from tpuserve.observability import local_prometheus

            with console.status("starting Prometheus"):
                prometheus = await local_prometheus.start_for_fleet(
                    [e.url for e in engines], router.url, args.prometheus_port,
                    args.prometheus_target,
                )  # fmt: skip
            console.print(f"  prometheus: {prometheus.url}  (rules and alerts: /rules)")
        base = router.url
        console.print(f"[bold]OpenAI base URL: {base}/v1[/bold]  (model {model!r})")
        console.print(f"  workers: {', '.join(e.url for e in engines)}")
        console.print(f"  metrics: {base}/metrics    workers: {base}/workers")
        console.print(
            f"  try: curl {base}/v1/chat/completions -H 'content-type: application/json' "
            f'-d \'{{"model": "{model}", "messages": [{{"role": "user", '
            '"content": "hello"}]}\''
        )
        console.print("Ctrl-C stops everything.")
        if args.duration is not None:
            loop.call_later(args.duration, stop.set)
        watch = asyncio.ensure_future(_watch_children(children, stop))
        if args.load is None:
            await stop.wait()
        else:
            trace = make_load(args.load, args.seed, None)
            stats = LoadStats()
            policy = args.policy or "default"
            driver = asyncio.ensure_future(
                drive(base, model, trace, args.rate, stats, args.requests, stop)
            )
            with Live(render(stats, args.load, policy, base), console=console,
                      refresh_per_second=4) as live:  # fmt: skip
                while not driver.done():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(driver), 0.25)
                    live.update(render(stats, args.load, policy, base))
            stop.set()
            await driver
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        dead = [c.name for c in children if c.proc.returncode not in (None, 0)]
        if dead:
            console.print(f"[red]stopped because {', '.join(dead)} exited[/red]")
            return 1
        return 0
    finally:
        with console.status("stopping"):
            if prometheus is not None:
                await prometheus.stop()
            await stop_children(list(reversed(children)))


async def _watch_children(children: Sequence[Child], stop: asyncio.Event) -> None:
    await asyncio.wait(
        [asyncio.ensure_future(c.proc.wait()) for c in children],
        return_when=asyncio.FIRST_COMPLETED,
    )
    stop.set()


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
