"""Router CPU per request, two routers at a time on the same core under the same arrivals:
side by side in time, not only in one run.

`bench/router_overhead.py` measures the routers one after another; on a shared VM the host's
load moves between those runs, and its rounds spread by ±30 % for the same code
(CHANGELOG.md, router CPU pass 13), more than most steps of a change. Here each tpuserve
router (each ``--policies`` entry) is paired in turn with the same policy from each
``--baseline`` checkout and with sglang-router 0.3.2 ``cache_aware`` (unless
``--skip-anchor``). For a pair, both routers start in front of 4 upstreams, both on the
router core: the same 4 engine twins (``--engines shared``, the default), 4 of its own each
(``--engines own``) or the same 4 stubs that answer at once and publish no KV events
(``--engines stubs``: the request path alone); each is warmed up (a router that follows KV
events also catches up on every engine) and left to go idle; then each gets its own open loop
of ``--requests`` ~2 kB completions at ``--rate`` requests/s, both loops at once, the second's
arrivals half an interval after the first's. A router's CPU per request is its process's CPU
time over the loops (all its threads) divided by the requests it answered. Whatever the host
does to the core then, it does to both; each router's request comes between two of the other's,
so each finds the caches as the other left them. Pairs, not more: two tpuserve routers share
the interpreter's code (libpython), and a third router would find it warmed by one of them but
not sglang-router's.

With shared twins, a router that follows KV events reads the events of both routers'
requests, twice what one router in front of its own engines reads per request (and what each
of 2 router replicas reads in front of one fleet); ``--engines own`` measures the one-router
deployment, at the event rate its own requests make.

``--python`` runs the routers under test on another interpreter: how CPython was compiled
moves the router's CPU (the image's is built with profile-guided and link-time optimization;
``bench/image_python_venv.sh`` builds one like it), sglang-router's compiled code not at all.

Per pair: both routers' medians over rounds and the paired ratio (the median of the rounds'
ratios) with a 95 % interval for it (distribution-free, from the rounds' order statistics: 6
rounds or more; with 16 it lies between the 4th and 13th smallest ratios). The start order
alternates between rounds.

Usage (from the repository root):

    python bench/router_side_by_side.py [--policies precise] [--rate 250] [--rounds 6]
        [--baseline DIR] [--skip-anchor] [--engines shared|own|stubs] [--python PATH]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.router_loadgen import closed_loop, open_loop
from bench.router_overhead import (
    OTHER_CORE,
    ROUTER_CORE,
    WARM_UP_REQUESTS,
    Proc,
    RouterKind,
    anchor_python,
    completion_requests,
    cpu_seconds,
    free_port,
    policy_entry,
    sglang_router,
    start,
    start_engines,
    start_stubs,
    targets_of,
    tpuserve_router,
    wait_caught_up,
    wait_http,
    wait_idle,
)

# --engines: what each pair of routers is in front of
UPSTREAMS = {
    "shared": "the same 4 engine twins",
    "own": "4 engine twins each",
    "stubs": "the same 4 stubs (answers at once, no KV events)",
}


@dataclass
class Running:
    kind: RouterKind
    proc: Proc
    seed: int  # its own questions (the system prompts stay shared)


def start_routers(kinds: list[RouterKind], fleets: list[list[Proc]], seed: int) -> list[Running]:
    """The routers of a pair, the i-th in front of ``fleets[i]``."""
    running: list[Running] = []
    try:
        for i, kind in enumerate(kinds):
            port = free_port()
            urls = [e.url for e in fleets[i]]
            proc = start(kind.label, kind.command(port, urls), ROUTER_CORE, port, kind.tree)
            running.append(Running(kind, proc, seed + 10 * (i + 1)))
        for r in running:
            wait_http(r.proc.url, r.kind.ready_path)
        for r, fleet in zip(running, fleets, strict=True):
            warm = completion_requests(r.seed + 7, WARM_UP_REQUESTS)
            asyncio.run(closed_loop(targets_of([r.proc.url]), warm.__getitem__, len(warm), 16))
            if r.kind.label.startswith("tpuserve"):
                wait_caught_up(r.proc.url, len(fleet))
        for r in running:
            wait_idle(r.proc.popen.pid)
    except BaseException:
        for r in running:
            r.proc.stop()
        raise
    return running


async def both_loops(running: list[Running], requests: int, rate: float) -> list[int]:
    """Both routers' open loops at once, the second's arrivals half an interval after the
    first's, so each router's request always comes between two of the other's; the requests
    each answered with 200."""

    async def loop(k: int, r: Running) -> int:
        load = completion_requests(r.seed + 3, requests)
        await asyncio.sleep(k / (2 * rate))
        run = await open_loop(targets_of([r.proc.url]), load.__getitem__, requests, rate)
        return sum(1 for result in run.results if result.status == 200)

    return list(await asyncio.gather(*(loop(k, r) for k, r in enumerate(running))))


def one_pair(kinds: list[RouterKind], fleets: list[list[Proc]], args: argparse.Namespace,
             seed: int) -> dict[str, dict[str, float]]:  # fmt: skip
    running = start_routers(kinds, fleets, seed)
    try:
        before = [cpu_seconds(r.proc.popen.pid) for r in running]
        answered = asyncio.run(both_loops(running, args.requests, args.rate))
        used = [cpu_seconds(r.proc.popen.pid) - b for r, b in zip(running, before, strict=True)]
    finally:
        for r in running:
            r.proc.stop()
    return {
        r.kind.label: {
            "cpu_us_per_request": cpu / max(ok, 1) * 1e6,
            "errors": args.requests - ok,
        }
        for r, cpu, ok in zip(running, used, answered, strict=True)
    }


Pair = tuple[str, str]
"""(a tpuserve router, the router it is measured against: a baseline's or the anchor)."""


def paired(rows: list[dict[str, float]]) -> float:
    """The median over rounds of the first router's CPU per request over the second's."""
    return float(statistics.median(r["cpu_us_per_request"] / r["against_us"] for r in rows))


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free interval for the median of what ``values`` sample, covering it with
    probability at least ``level``: the k-th smallest and k-th largest value, k the largest
    for which a Binomial(n, 1/2) count falls below k with probability at most (1 - level) / 2.
    None when no k qualifies (fewer than 6 values at 0.95)."""
    n = len(values)
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    tail, k = 0.0, 0
    while k < n // 2:
        tail += math.comb(n, k) / 2**n  # P(count <= k)
        if tail > (1 - level) / 2:
            break
        k += 1
    if k == 0:
        return None
    ordered = sorted(values)
    return ordered[k - 1], ordered[n - k]


def summarize(rows: dict[Pair, list[dict[str, float]]]) -> list[dict[str, Any]]:
    """Per pair: both routers' median CPU per request, the paired ratio and its 95 % interval
    (`median_interval` of the rounds' ratios; None with fewer than 6 rounds)."""
    return [
        {
            "router": router,
            "against": against,
            "cpu_us_per_request": statistics.median(r["cpu_us_per_request"] for r in results),
            "against_us_per_request": statistics.median(r["against_us"] for r in results),
            "paired_ratio": paired(results),
            "paired_ratio_ci95": median_interval(
                [r["cpu_us_per_request"] / r["against_us"] for r in results]
            ),
            "errors": sum(r["errors"] for r in results),
            "rounds": results,
        }
        for (router, against), results in rows.items()
    ]


def print_summary(summary: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"two routers at once, {args.rate:g} req/s each, {args.rounds} rounds (medians), "
          f"upstreams: {UPSTREAMS[args.engines]}")  # fmt: skip
    print("router | CPU/request | against | its CPU/request | paired ratio [95 % interval] "
          "| errors")  # fmt: skip
    for e in summary:
        ci = e["paired_ratio_ci95"]
        interval = f"[{ci[0]:.3f}-{ci[1]:.3f}]" if ci else "[n/a: under 6 rounds]"
        print(f"{e['router']} | {e['cpu_us_per_request']:.0f} us | {e['against']} | "
              f"{e['against_us_per_request']:.0f} us | {e['paired_ratio']:.3f}x {interval} | "
              f"{e['errors']}")  # fmt: skip


def interpreter_problem(python: str) -> str | None:
    """Why ``python`` cannot run a tpuserve router, or None."""
    try:
        check = subprocess.run(
            [python, "-c", "import tpuserve.cli, tpuserve_router._native"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"cannot be run ({err})"
    if check.returncode != 0:
        last = (check.stderr.strip().splitlines() or ["no output"])[-1]
        return f"does not import tpuserve and its router ({last})"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="precise", help="tpuserve policies, comma list "
                        "(NAME+kv / NAME+nokv as in bench/router_overhead.py)")  # fmt: skip
    parser.add_argument("--baseline", type=Path, action="append", default=[],
                        help="also pair each policy with itself from this checkout "
                        "(repeatable)")  # fmt: skip
    parser.add_argument("--skip-anchor", action="store_true", help="no pair with sglang-router")
    parser.add_argument("--rate", type=float, default=250.0, help="requests/s to each router")
    parser.add_argument("--requests", type=int, default=5000, help="per router and pair")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--engines", choices=tuple(UPSTREAMS), default="shared",
                        help="what both routers are in front of: " + "; ".join(
                            f"{name}: {what}" for name, what in UPSTREAMS.items()))  # fmt: skip
    parser.add_argument("--python", default=None, metavar="PATH",
                        help="run the tpuserve routers under test (--policies) on this "
                        "interpreter, one that imports tpuserve (e.g. a venv with the project "
                        "installed); baselines run on this one")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="write every row here")
    args = parser.parse_args()
    for name in ("rate", "requests", "rounds"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be > 0, got {getattr(args, name)}")
    try:
        entries = [policy_entry(p) for p in args.policies.split(",")]
    except ValueError as err:
        parser.error(str(err))
    if any(e.auth for e in entries):
        parser.error("--policies: +auth is not measured here (bench/router_overhead.py does)")
    for tree in args.baseline:
        if not (tree / "router" / "tpuserve_router").is_dir():
            parser.error(f"--baseline {tree}: not a tpuserve checkout (no router/tpuserve_router)")
    if args.skip_anchor and not args.baseline:
        parser.error("--skip-anchor without --baseline leaves nothing to compare")
    baselines = [tree.resolve() for tree in args.baseline]  # named in the table by folder
    if args.python is not None and (problem := interpreter_problem(args.python)):
        parser.error(f"--python {args.python}: {problem}")

    os.sched_setaffinity(0, {int(OTHER_CORE)})  # the load generator stays off the router core
    anchor = None if args.skip_anchor else sglang_router(anchor_python())
    pairs: list[tuple[RouterKind, RouterKind]] = []
    for e in entries:
        new = tpuserve_router(e.name, kv_events=e.kv_events, python=args.python)
        pairs += [(new, tpuserve_router(e.name, e.kv_events, t)) for t in baselines]
        pairs += [(new, anchor)] if anchor is not None else []
    if args.engines == "stubs":
        engines = start_stubs(4)
    else:
        engines = start_engines(8 if args.engines == "own" else 4)
    fleets = [engines[:4], engines[4:]] if args.engines == "own" else [engines, engines]
    rows: dict[Pair, list[dict[str, float]]] = {(a.label, b.label): [] for a, b in pairs}
    try:
        for r in range(args.rounds):
            for a, b in pairs:
                # each router starts (and warms up) first in every other round
                order = [a, b] if r % 2 == 0 else [b, a]
                got = one_pair(order, fleets, args, 1000 * r)
                row = {"cpu_us_per_request": got[a.label]["cpu_us_per_request"],
                       "against_us": got[b.label]["cpu_us_per_request"],
                       "errors": got[a.label]["errors"] + got[b.label]["errors"]}  # fmt: skip
                rows[(a.label, b.label)].append(row)
                print(f"round {r + 1}: {a.label} against {b.label}: {json.dumps(row)}",
                      file=sys.stderr, flush=True)  # fmt: skip
    finally:
        for engine in engines:
            engine.stop()
    summary = summarize(rows)
    print_summary(summary, args)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
