"""`tpuserve router`: the prefix-aware router in front of SGLang-compatible workers.

Every flag falls back to an environment variable ``TPUSERVE_ROUTER_<FLAG>`` (upper case,
dashes as underscores; e.g. ``TPUSERVE_ROUTER_PORT``, ``TPUSERVE_ROUTER_WORKERS`` as a
comma-separated list), so a Deployment can set either. A flag and its variable obey the same
rule (`sglang_tpu.cli_types` for numbers); an empty variable for a number or a switch counts
as unset. Settings are checked once at start; every problem is reported with the setting,
its value and what is allowed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import resource
import signal
import sys
from typing import Any

from sglang_tpu.disaggregation import DEFAULT_BOOTSTRAP_PORT
from tpuserve_router.config import ConfigError, RouterConfig, parse_key_values
from tpuserve_router.options import OPTIONS
from tpuserve_router.options.option import comma_list
from tpuserve_router.validation import validate

DESCRIPTION = """Run the prefix-aware router: OpenAI and SGLang APIs in front of the workers.

Workers are engine leaders speaking SGLang's HTTP API (real SGLang, `tpuserve engine sim`,
or any compatible server): a static list (--worker URL ...) or the ready leader pods of a
Kubernetes label selector (--discovery kubernetes --selector k=v). Every flag can also be
set with the environment variable TPUSERVE_ROUTER_<FLAG> (e.g. TPUSERVE_ROUTER_POLICY).

examples:
  tpuserve router --port 8000 --worker http://127.0.0.1:30001 --worker http://127.0.0.1:30002
  tpuserve router --port 8000 --discovery kubernetes --namespace serving \\
      --selector app.kubernetes.io/instance=llama --policy cache_aware
"""

ENV_PREFIX = "TPUSERVE_ROUTER_"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--worker",
        dest="workers",
        action="append",
        metavar="[MODEL=]URL",
        help="A worker's base URL, http://HOST:PORT, optionally with the served model it "
        "belongs to (MODEL=URL; else read from its /v1/models); repeat for more "
        "(env: comma-separated).",
    )
    parser.add_argument(
        "--prefill",
        dest="prefill",
        action="append",
        nargs="+",
        metavar="URL [BOOTSTRAP_PORT]",
        help="PD mode: a prefill worker's base URL and its bootstrap port (SGLang's "
        f"--disaggregation-bootstrap-port; default {DEFAULT_BOOTSTRAP_PORT}, 'none' alike); "
        "repeat for more (env: comma-separated 'URL PORT').",
    )
    parser.add_argument(
        "--decode",
        dest="decode",
        action="append",
        metavar="URL",
        help="PD mode: a decode worker's base URL; repeat for more (env: comma-separated).",
    )
    parser.add_argument(
        "--peer",
        dest="peers",
        action="append",
        metavar="tcp://HOST:PORT",
        help="A peer router replica's --peer-port endpoint (HOST: an IPv4 address, a DNS "
        "name or [IPv6 address]); repeat for more "
        "(env TPUSERVE_ROUTER_PEERS: comma-separated); needs --peer-port.",
    )
    parser.add_argument(
        "--policy-param",
        dest="policy_params",
        action="append",
        metavar="NAME=VALUE",
        help="A policy parameter, e.g. cache_threshold=0.5; repeat for more "
        "(see docs/router.md for each policy's parameters).",
    )
    for option in OPTIONS:
        if option.switch:
            pair = parser.add_mutually_exclusive_group()
            pair.add_argument(
                option.flag, dest=option.field, action="store_const", const=True,
                default=None, help=option.help,
            )  # fmt: skip
            pair.add_argument(
                "--no-" + option.flag.removeprefix("--"), dest=option.field,
                action="store_const", const=False, help=f"The opposite of {option.flag}.",
            )  # fmt: skip
            continue
        parser.add_argument(
            option.flag,
            dest=option.field,
            type=option.kind,
            default=None,
            metavar=option.metavar,
            choices=option.choices,
            help=option.help,
        )


def env_name(flag: str) -> str:
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")


def build_config(args: argparse.Namespace, environ: dict[str, str] | None = None) -> RouterConfig:
    """Flags first, then ``TPUSERVE_ROUTER_*`` variables, then defaults; raises ConfigError."""
    env = dict(os.environ if environ is None else environ)
    problems: list[str] = []
    values: dict[str, Any] = {}
    for option in OPTIONS:
        value = getattr(args, option.field, None)  # argparse has converted and checked it
        if value is None:
            name = env_name(option.flag)
            raw = env.get(name)
            if raw is None or (option.kind is not str and not raw.strip()):
                continue
            try:
                value = option.kind(raw)
            except argparse.ArgumentTypeError as err:
                problems.append(f"{name}: {err}")
                continue
            if option.choices is not None and value not in option.choices:
                problems.append(f"{name}={raw!r}: allowed {', '.join(option.choices)}")
                continue
        values[option.field] = value
    if "selector" in values:
        try:
            values["selector"] = parse_key_values(values["selector"], "selector")
        except ValueError as err:
            problems.append(str(err))
    workers = args.workers
    if workers is None and env.get(env_name("--workers")):
        workers = [w for w in env[env_name("--workers")].replace(" ", ",").split(",") if w]
    if workers:
        values["workers"] = tuple(workers)
    prefill = [" ".join(values) for values in args.prefill] if args.prefill else None
    if prefill is None and env.get(env_name("--prefill")):
        prefill = list(comma_list(env[env_name("--prefill")]))
    if prefill:
        values["prefill"] = tuple(prefill)
    decode = args.decode
    if decode is None and env.get(env_name("--decode")):
        decode = list(comma_list(env[env_name("--decode")]))
    if decode:
        values["decode"] = tuple(decode)
    peers = args.peers
    if peers is None and env.get(env_name("--peers")):
        peers = comma_list(env[env_name("--peers")])
    if peers:
        values["peers"] = tuple(peers)
    params = args.policy_params
    if params is None and env.get(env_name("--policy-params")):
        params = env[env_name("--policy-params")].split(",")
    if params:
        try:
            values["policy_params"] = parse_key_values(",".join(params), "policy-param")
        except ValueError as err:
            problems.append(str(err))
    config = RouterConfig(**values)
    try:
        validate(config)
    except ConfigError as err:
        problems += err.problems
    if problems:
        raise ConfigError(problems)
    return config


def run(args: argparse.Namespace) -> int:
    try:
        config = build_config(args)
    except ConfigError as err:
        print(f"tpuserve router: {err}", file=sys.stderr)
        return 2
    import uvloop

    return uvloop.run(serve_until_signalled(config))


async def serve_until_signalled(config: RouterConfig) -> int:
    from tpuserve_router.app import create_router_app

    raise_open_file_limit()
    return_large_blocks()
    app = create_router_app(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await app.start()
    except OSError as err:  # a port in use, an address not on this host
        print(f"tpuserve router: {err}", file=sys.stderr)
        return 1
    if os.environ.get("TPUSERVE_ROUTER_GC_TUNE", "1") == "1":
        tune_garbage_collector()
    print(f"tpuserve router: listening on {app.base_url}", file=sys.stderr, flush=True)
    await stop.wait()
    logging.getLogger(__name__).info("stopping")
    await app.stop()
    return 0


def raise_open_file_limit() -> None:
    """Raise the soft open-file limit to the hard one: every client connection, upstream
    connection and health check is a file descriptor (the app sizes its connection budget
    from the result)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as err:
            logging.getLogger(__name__).warning("could not raise the open-file limit: %s", err)


MMAP_THRESHOLD_BYTES = 128 * 1024
"""glibc's default threshold above which malloc maps a block of its own (and unmaps it when
freed); `return_large_blocks` pins it there."""
_M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)


def return_large_blocks() -> None:
    """Keep large blocks (request bodies, answers) out of the heap, so their memory goes back
    to the system when they are freed. glibc otherwise raises its mmap threshold each time
    such a block is freed, up to 32 MiB, and later bodies then land in the heap between small
    objects, where freed memory stays with the process: 40 clients sending 30 MB bodies in
    turn left the router 90 MB above its buffer budget. Setting the threshold turns that
    adjustment off. Nothing happens on a C library without mallopt."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    except (OSError, AttributeError):
        logging.getLogger(__name__).debug("mallopt unavailable: large blocks stay in the heap")


def tune_garbage_collector() -> None:
    """Move start-up objects out of the collector's way and collect the young generation
    less often: a request allocates a few hundred short-lived objects, and the default
    threshold (700) would run a collection every few requests."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 100)
