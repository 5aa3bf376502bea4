"""`tpuserve up`'s flags and its run: start the fleet, print where it is, drive the load, stop."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Any

from sglang_tpu import cli_types
from sglang_tpu.tasks import cancel_and_wait
from tpuserve.up.errors import UpError
from tpuserve.up.fleet import (
    Child,
    exited,
    spawn,
    stop_children,
    wait_routable,
    watch_children,
)
from tpuserve.up.load_driver import LoadStats, drive
from tpuserve.up.loads import load_names, make_load
from tpuserve.up.status import LOAD_INTERVAL_SECONDS, StatusLines, render

ENGINES = ("sim", "sglang-jax")
DEFAULT_WORKERS = {"sim": 4, "sglang-jax": 1}

DESCRIPTION = """Run a local fleet on loopback: engine twins and the router (and optional load).

Starts --workers engine twins (`tpuserve engine sim`) and a router (`tpuserve router`) in
front of them, prints the OpenAI base URL, and with --load drives traffic through the router
with a live display of requests/s, tokens/s, prefix hit rate and p50/p99 time to first
token. --json also writes the fleet's URLs and the load's numbers as JSON lines on stdout.
Ctrl-C stops everything.

examples:
  tpuserve up                                    # 4 engines + router on http://127.0.0.1:8000
  tpuserve up --workers 2 --policy precise --load shared-prefix --rate 20
  tpuserve up --load W1 --rate 10 --duration 60  # a benchmark workload, when installed
  tpuserve up --load shared-prefix --prometheus  # + Prometheus with the chart's rules on :9090
  tpuserve up --load shared-prefix --requests 100 --json | jq -c 'select(.event == "load")'
  tpuserve up --engine sglang-jax                # a real SGLang-JAX engine on CPU (opt-in build)
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="sim",
        help="The engines: `sim`, engine twins (default); `sglang-jax`, real SGLang-JAX "
        "engines on CPU with a tiny model, from the opt-in build (scripts/build-sglang-jax.sh; "
        "docs/sglang-jax.md). The twins' time flags do not apply to them.",
    )
    parser.add_argument(
        "--workers",
        type=cli_types.positive_int,
        default=None,
        help="Engines (default 4 twins, or 1 SGLang-JAX engine: ~1.3 GB of memory each).",
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
        "--startup-time-scale",
        type=cli_types.non_negative_float,
        default=0.01,
        help="Engine twins' cold-start time scale: pull, weights, XLA compile (cold: no "
        "compile cache) and warmup at TPU figures times this, each phase shown as it ends; "
        "0 = instant (default 0.01: a 6-minute TPU cold start in about 4 s).",
    )
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="Extra argument for every engine, e.g. --engine-arg=--cache-tokens=65536.",
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
    parser.add_argument(
        "--json",
        action="store_true",
        help="Also write JSON lines on stdout: ready (URLs, model), load (every second and "
        "at the end), stopped (exit code); see docs/router.md.",
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
    if args.workers is None:
        args.workers = DEFAULT_WORKERS[args.engine]
    if args.engine == "sglang-jax":
        from tpuserve.up.sglang_jax import find_build

        find_build()  # UpError saying how to build it


def run(args: argparse.Namespace) -> int:
    status = StatusLines(args.json)
    try:
        check_args(args)
    except UpError as err:
        print(f"tpuserve up: {err}", file=sys.stderr)
        status.error(str(err))
        return 2
    import uvloop

    try:
        return uvloop.run(up(args, status))
    except UpError as err:
        print(f"tpuserve up: {err}", file=sys.stderr)
        status.error(str(err))
        return 1


async def up(args: argparse.Namespace, status: StatusLines) -> int:
    from rich.console import Console

    console = Console(stderr=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    children: list[Child] = []
    prometheus: Any = None
    result: int | None = None  # set once the fleet stopped on its own terms
    dead: list[str] = []
    try:
        if args.engine == "sglang-jax":
            engines = await _start_sglang_jax(args, children, console)
        else:
            with console.status(f"starting {args.workers} engine twins"):
                engines = await _start_twins(args)
            children.extend(engines)
        router_args = ["router", "--host", "127.0.0.1", "--port", str(args.port)]
        for engine in engines:
            router_args += ["--worker", engine.url]
        # No --kv-events: the router subscribes when its policy uses them (every twin publishes).
        if args.engine == "sglang-jax":
            router_args += _sglang_jax_router_args(args)
        elif args.policy:
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
        workers = [e.url for e in engines]
        console.print(f"[bold]OpenAI base URL: {base}/v1[/bold]  (model {model!r})")
        console.print(f"  workers: {', '.join(workers)}")
        console.print(f"  metrics: {base}/metrics    workers: {base}/workers")
        console.print(
            f"  try: curl {base}/v1/chat/completions -H 'content-type: application/json' "
            f'-d \'{{"model": "{model}", "messages": [{{"role": "user", '
            '"content": "hello"}]}\''
        )
        console.print("Ctrl-C stops everything.")
        status.ready(base, model, workers, prometheus.url if prometheus is not None else None)
        if args.duration is not None:
            loop.call_later(args.duration, stop.set)
        watch = asyncio.ensure_future(watch_children(children, stop))
        if args.load is None:
            await stop.wait()
        else:
            await _run_load(args, base, model, stop, status, console)
        await cancel_and_wait([watch])
        dead = exited(children)
        if dead:
            console.print(f"[red]stopped because {', '.join(dead)} exited[/red]")
        result = 1 if dead else 0
        return result
    finally:
        with console.status("stopping"):
            if prometheus is not None:
                await prometheus.stop()
            await stop_children(list(reversed(children)))
        if result is not None:
            status.stopped(result, dead)


async def _start_twins(args: argparse.Namespace) -> list[Child]:
    return list(await asyncio.gather(*(
        spawn(f"engine {i}", [
            "engine", "sim", "--host", "127.0.0.1", "--port", "0",
            "--time-scale", str(args.time_scale),
            "--startup-time-scale", str(args.startup_time_scale),
            "--enable-cache-report",  # cached tokens in usage, as launched engines
            # ZMQ picks free ports (the twin reports them in /get_server_info,
            # where the router reads them): no window for another socket to take
            # a port chosen here first
            "--kv-events-endpoint", "tcp://127.0.0.1:*",
            "--kv-events-replay-endpoint", "tcp://127.0.0.1:*",
            *args.engine_arg,
        ], "READY")
        for i in range(args.workers)
    )))  # fmt: skip


async def _start_sglang_jax(
    args: argparse.Namespace, children: list[Child], console: Any
) -> list[Child]:
    """Real SGLang-JAX engines from the opt-in build, one after another (each loads JAX and
    compiles on a CPU: 1-3 min); each joins `children` as soon as it runs."""
    from tpuserve.cluster.ports import free_ports
    from tpuserve.up import sglang_jax

    build = sglang_jax.find_build()
    console.print(f"SGLang-JAX: {build.python} with the model {build.model}")
    engines = []
    for i, port in enumerate(free_ports(args.workers)):
        with console.status(f"starting SGLang-JAX engine {i} (loading JAX, 1-3 min on a CPU)"):
            engine = await sglang_jax.spawn_engine(f"engine {i}", build, port, args.engine_arg)
        children.append(engine)
        engines.append(engine)
    return engines


def _sglang_jax_router_args(args: argparse.Namespace) -> list[str]:
    """The router in front of SGLang-JAX: its type said, the model's tokenizer, no KV events."""
    from tpuserve.up import sglang_jax

    build = sglang_jax.find_build()
    extra = ["--engine-type", "sglang-jax", "--tokenizer", str(build.model / "tokenizer.json")]
    policy = ["--policy", args.policy] if args.policy else []
    defaults = list(sglang_jax.ROUTER_ARGS)
    if policy:
        defaults[defaults.index("--policy") : defaults.index("--policy") + 2] = policy
    return [*extra, *defaults]


async def _run_load(
    args: argparse.Namespace,
    base: str,
    model: str,
    stop: asyncio.Event,
    status: StatusLines,
    console: Any,
) -> None:
    """Drive ``--load`` until it ends or `stop`, showing it live (and as JSON lines)."""
    from rich.live import Live

    trace = make_load(args.load, args.seed, None)
    stats = LoadStats()
    policy = args.policy or "default"
    driver = asyncio.ensure_future(drive(base, model, trace, args.rate, stats, args.requests, stop))
    loop = asyncio.get_running_loop()
    next_line = loop.time() + LOAD_INTERVAL_SECONDS
    with Live(render(stats.snapshot(), args.load, policy, base), console=console,
              refresh_per_second=4) as live:  # fmt: skip
        while not driver.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(driver), 0.25)
            snapshot = stats.snapshot()
            live.update(render(snapshot, args.load, policy, base))
            if loop.time() >= next_line and not driver.done():
                status.load(snapshot, args.load, policy)
                next_line = loop.time() + LOAD_INTERVAL_SECONDS
    stop.set()
    await driver
    status.load(stats.snapshot(), args.load, policy)
