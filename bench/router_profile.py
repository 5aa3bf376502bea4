"""Where one router's CPU goes per request: one tpuserve router (``precise``, its defaults) in
front of 4 stubs that answer at once (`bench/router_stub.py`), warmed up, then an open loop of
``--requests`` ~2 kB completions at ``--rate`` requests/s (the arrivals of
`bench/router_side_by_side.py`), with one of:

- ``calls``: the router under cProfile twice, for ``--requests`` and ``--requests`` + 1,000
  requests: the Python calls a request makes, the difference over 1,000 (start-up and warm-up
  cancel out); all calls, and calls of Python functions (not built-ins);
- ``perf``: Linux perf samples of the router (``perf report -i OUT --sort dso``: the
  interpreter, the kernel, the compiled index apart);
- ``strace``: the router's system calls counted (``strace -c``), per request;
- ``none``: its CPU per request alone (all threads, /proc schedstat).

``--tree DIR`` runs the router from another checkout (a baseline, e.g. ``git archive``
unpacked with this checkout's ``_native`` copied in), so two commits are compared the same
way. The numbers of one run are not a benchmark (a profiler slows what it watches): compare
trees under the same mode. Usage (from the repository root):

    python bench/router_profile.py [--mode calls] [--requests 300] [--rate 250]
        [--tree DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.router_loadgen import closed_loop, open_loop
from bench.router_overhead import (
    ENTRY,
    ROUTER_CORE,
    WARM_UP_REQUESTS,
    completion_requests,
    cpu_seconds,
    free_port,
    start,
    start_stubs,
    targets_of,
    wait_http,
    wait_idle,
)

MODES = ("calls", "perf", "strace", "none")
EXTRA_REQUESTS = 1000
"""The second run of ``calls`` sends this many more requests than the first."""


def run_once(mode: str, requests: int, rate: float, tree: Path | None, out: Path) -> float:
    """One router under ``mode`` (the profiler writes ``out``), its CPU µs per request."""
    stubs = start_stubs(4)
    port = free_port()
    profiled = ["-m", "cProfile", "-o", str(out)] if mode == "calls" else []
    if profiled:  # cProfile runs a file, not ``-c``
        script = Path(tempfile.mkdtemp()) / "router_entry.py"
        script.write_text(ENTRY.replace("; ", "\n") + "\n")
        cmd = [sys.executable, *profiled, str(script)]
    else:
        cmd = [sys.executable, "-c", ENTRY]
    cmd += ["router", "--port", str(port), "--policy", "precise", "--log-level", "warning"]
    for stub in stubs:
        cmd += ["--worker", stub.url]
    router = start("router", cmd, ROUTER_CORE, port, tree)
    profiler: subprocess.Popen[bytes] | None = None
    try:
        wait_http(router.url, "/readiness")
        warm = completion_requests(7, WARM_UP_REQUESTS)
        asyncio.run(closed_loop(targets_of([router.url]), warm.__getitem__, len(warm), 16))
        wait_idle(router.popen.pid)
        pid = str(router.popen.pid)
        tool = {
            "perf": ["perf", "record", "-p", pid, "-o", str(out)],
            "strace": ["strace", "-c", "-f", "-p", pid, "-o", str(out)],
        }.get(mode)
        if tool is not None:
            quiet = subprocess.DEVNULL
            profiler = subprocess.Popen(tool, stdout=quiet, stderr=quiet)
        if profiler is not None:
            time.sleep(1.0)  # attached before the first request
        load = completion_requests(3, requests)
        before = cpu_seconds(router.popen.pid)
        run = asyncio.run(open_loop(targets_of([router.url]), load.__getitem__, requests, rate))
        used = cpu_seconds(router.popen.pid) - before
        answered = sum(1 for r in run.results if r.status == 200)
        if answered != requests:
            raise RuntimeError(f"{requests - answered} of {requests} requests failed")
        return used / requests * 1e6
    finally:
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)  # both write what they have when interrupted
            profiler.wait(60)
        router.popen.send_signal(signal.SIGINT)  # cProfile writes its file as the router ends
        try:
            router.popen.wait(30)
        except subprocess.TimeoutExpired:
            router.stop()
        for stub in stubs:
            stub.stop()


def calls(path: Path) -> tuple[int, int]:
    """All calls in a cProfile file, and those of Python functions (not built-ins)."""
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    total = python = 0
    for (filename, _line, _name), (_primitive, count, *_rest) in stats.items():
        total += count
        python += count if filename != "~" else 0
    return total, python


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=MODES, default="calls")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rate", type=float, default=250.0, help="requests/s")
    parser.add_argument("--tree", type=Path, default=None, help="run this checkout's router")
    parser.add_argument("--out", type=Path, default=None, help="keep the profiles here")
    args = parser.parse_args()
    if args.requests <= 0 or args.rate <= 0:
        parser.error(f"--requests and --rate must be > 0, got {args.requests}, {args.rate:g}")
    if args.tree is not None and not (args.tree / "router" / "tpuserve_router").is_dir():
        parser.error(f"--tree {args.tree}: not a tpuserve checkout (no router/tpuserve_router)")
    os.sched_setaffinity(0, {0})  # the load generator stays off the router's core
    out = args.out or Path(tempfile.mkdtemp(prefix="router-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.mode == "calls":
        counts = []
        for n in (args.requests, args.requests + EXTRA_REQUESTS):
            run_once("calls", n, args.rate, args.tree, out / f"calls-{n}.prof")
            counts.append(calls(out / f"calls-{n}.prof"))
        (few_all, few_py), (many_all, many_py) = counts
        every = (many_all - few_all) / EXTRA_REQUESTS
        python = (many_py - few_py) / EXTRA_REQUESTS
        print(f"calls per request: {every:.1f} (Python functions {python:.1f}); profiles in {out}")
        return 0
    name = {"perf": "router.perf", "strace": "strace.txt", "none": "none"}[args.mode]
    cpu = run_once(args.mode, args.requests, args.rate, args.tree, out / name)
    print(f"CPU per request {cpu:.0f} us (under the profiler); output in {out / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
