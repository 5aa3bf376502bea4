"""Router overhead, side by side: tpuserve router vs sglang-router 0.3.2, in one run.

Both routers sit in front of the same 4 engine twins (`tpuserve engine sim --time-scale 0`)
on loopback, each alone on one core (``taskset``), with ~2 kB prompts. Rounds alternate the
routers (interleaved), and each round also measures the engines directly, so every router
number has a same-conditions baseline. Measured per round:

- CPU per request at saturation: the router process's own CPU time (all threads, from
  /proc/<pid>/task/*/schedstat, nanoseconds) over a closed-loop run at concurrency 32,
  divided by the requests served. The run starts once the router is idle after its warm-up
  (`wait_idle`): a router that follows KV events first replays every engine's buffer (up to
  10,000 batches each, full from the rounds before), a start-up cost that must not land on
  the requests, so the run also waits until every engine's catch-up has succeeded
  (`wait_caught_up`: the engine's replay socket may drop part of a replay, and the router
  then asks again). Each tpuserve round also records the router's KV-event replays that
  failed during the measured runs (``kv_replays_failed``, from its ``/metrics``; those at
  start-up are ``kv_replays_failed_at_start``), and the summary names the rounds that had
  any: their CPU includes the replays' retries. The same run also records the upstreams' CPU
  per request (``upstreams_cpu_us_per_request``, all their threads): they share core 0 with
  the load generator, so a router that makes them work harder (a KV-event subscriber: the
  twins then send every batch) reaches a lower throughput, and so serves fewer requests per
  wake-up, which raises its own CPU per request there;
- added latency at 500 req/s: open-loop non-streaming requests, p50 and p99 latency through
  the router minus the same directly to the engines;
- streamed time to first chunk: streamed chat one request at a time, p50 and p99 of the
  time to the first body chunk through the router (and directly, for reference).

With ``--upstream stub`` the engines are replaced by 4 minimal SGLang-compatible stubs that
answer at once: on a shared 2-core machine the twins cannot always sustain 500 req/s of
2 kB prompts, and their queueing then drowns the router's own added latency.

Usage (from the repository root; installs sglang-router into its own venv on first use):

    python bench/router_overhead.py [--rounds 3] [--requests 6000] [--json out.json]

``--cpu-rate R`` also measures CPU per request in an open loop at R requests/s: the same
arrivals for every router, where at saturation a router's CPU per request also depends on
the throughput it reaches (how many requests each wake-up of its event loop serves).
``--cpu-only`` keeps only the CPU and throughput measurement; ``--baseline TREE`` (repeatable)
also runs each tpuserve policy from other checkouts, e.g. ``git archive COMMIT`` unpacked, so
steps of a change are compared in one run. ``--py-spy DIR`` also samples each router's Python
stacks during the CPU measurement (py-spy, a dev dependency), to see where its CPU goes (the
saturated run, or with ``--profile-at-rate`` the one at ``--cpu-rate``);
``--perf DIR`` records native stacks with Linux perf instead (the interpreter, the kernel's
socket work and the compiled index apart; build ``router/native`` with
``CARGO_PROFILE_RELEASE_STRIP=false`` to see its functions by name).

Cores: the router under test gets core 1; engines and the load generator share core 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
from prometheus_client.parser import text_string_to_metric_families

# Run as a script (`python bench/router_overhead.py`): the checkout's root first, so `bench.*`
# is this checkout's even when another one is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.router_loadgen import build_request, closed_loop, open_loop, percentile
from bench.router_overhead_summary import add_latency_summary, cpu_summary, print_summary

ROOT = Path(__file__).resolve().parent.parent
ENTRY = "import sys; from tpuserve.cli import main; sys.exit(main())"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ROUTER_CORE = "1"
OTHER_CORE = "0"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def anchor_python() -> str:
    """The python of a venv holding sglang-router (bench/routing_anchor_venv.sh installs it)."""
    script = ROOT / "bench" / "routing_anchor_venv.sh"
    if script.exists():
        return (
            subprocess.run(["bash", str(script)], check=True, capture_output=True, text=True)
            .stdout.strip()
            .splitlines()[-1]
        )
    venv = Path.home() / ".cache" / "tpuserve" / "bench" / "sglang-router-0.3.2"
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "sglang-router==0.3.2"],
            check=True,
        )
    return str(venv / "bin" / "python")


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` (schedstat: nanoseconds on the CPU)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError):
            continue
    return total / 1e9


WARM_UP_REQUESTS = 500
"""Closed-loop requests a router serves before it is measured (its connections, caches and
index warm)."""
IDLE_CPU_SHARE = 0.05
"""A router is idle once it uses less than this share of a core (over `IDLE_WINDOW_SECONDS`)."""
IDLE_WINDOW_SECONDS = 0.5


def wait_idle(pid: int, deadline_seconds: float = 60.0) -> None:
    """Return once ``pid`` is idle (its start-up work done), or fail after the deadline."""
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        before = cpu_seconds(pid)
        time.sleep(IDLE_WINDOW_SECONDS)
        if cpu_seconds(pid) - before < IDLE_CPU_SHARE * IDLE_WINDOW_SECONDS:
            return
    raise RuntimeError(f"router {pid} still busy after {deadline_seconds:.0f} s of no load")


def wait_http(url: str, path: str, deadline_seconds: float = 60.0) -> None:
    import urllib.request

    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + path, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url}{path} did not answer 200 in {deadline_seconds:g} s")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def start(name: str, cmd: Sequence[str], core: str, port: int,
          tree: Path | None = None) -> Proc:  # fmt: skip
    """Run ``cmd`` on ``core``; with ``tree``, tpuserve comes from that checkout (it also
    starts there, as ``python -c`` puts its working directory first on the path)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(str(tree / sub) for sub in ("", "router", "operator"))
    popen = subprocess.Popen(
        ["taskset", "-c", core, *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=env, cwd=tree,
    )  # fmt: skip
    return Proc(name, popen, port)


def start_engines(n: int) -> list[Proc]:
    engines = []
    for i in range(n):
        port = free_port()
        cmd = [sys.executable, "-c", ENTRY, "engine", "sim", "--port", str(port),
               "--time-scale", "0", "--log-level", "warning",
               "--kv-events-endpoint", f"tcp://127.0.0.1:{free_port()}",
               "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{free_port()}"]  # fmt: skip
        engines.append(start(f"engine{i}", cmd, OTHER_CORE, port))
    for engine in engines:
        wait_http(engine.url, "/health")
    return engines


STUB = str(Path(__file__).resolve().parent / "router_stub.py")


def start_stubs(n: int) -> list[Proc]:
    """Minimal SGLang-compatible upstreams that answer at once (they isolate the router)."""
    stubs = []
    for i in range(n):
        port = free_port()
        cmd = [sys.executable, STUB, str(port), MODEL]
        stubs.append(start(f"stub{i}", cmd, OTHER_CORE, port))
    for stub in stubs:
        wait_http(stub.url, "/health")
    return stubs


@dataclass(frozen=True)
class RouterKind:
    label: str
    command: Callable[[int, list[str]], list[str]]
    ready_path: str
    tree: Path | None = None  # another checkout to run (a baseline, for before/after)


BENCH_KEY = "sk-bench-0123456789abcdef"
"""Every request carries it (Authorization: Bearer), so routers with and without API keys
get the same bytes; a router with keys checks it, rate-limits it and counts its tenant."""


def keys_file() -> Path:
    """A keys file with `BENCH_KEY`, limits high enough never to refuse (but kept)."""
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"tpuserve-bench-keys-{os.getpid()}.json"
    entry = {"key": BENCH_KEY, "tenant": "bench", "requests_per_minute": 10**9,
             "tokens_per_minute": 10**12}  # fmt: skip
    path.write_bytes(orjson.dumps({"keys": [entry]}))
    return path


def tpuserve_router(
    policy: str,
    kv_events: bool | None = None,
    tree: Path | None = None,
    auth: bool = False,
    python: str | None = None,
) -> RouterKind:
    """``kv_events``: True adds ``--kv-events``, False ``--no-kv-events``, None leaves the
    router's default (on for the policies that use them). ``python``: the interpreter to run
    it on (one that imports tpuserve), this one when None."""

    def command(port: int, workers: list[str]) -> list[str]:
        cmd = [python or sys.executable, "-c", ENTRY, "router", "--port", str(port),
               "--policy", policy, "--log-level", "warning"]  # fmt: skip
        for w in workers:
            cmd += ["--worker", w]
        if kv_events is not None:
            cmd.append("--kv-events" if kv_events else "--no-kv-events")
        if auth:
            cmd += ["--api-keys-file", str(keys_file())]
        return cmd

    events = {True: " +kv-events", False: " -kv-events", None: ""}[kv_events]
    label = f"tpuserve {policy}{events}" + (" +auth" if auth else "")
    if python is not None:
        label += f" on {python}"
    if tree is not None:
        return RouterKind(f"{label} @{tree.name}", command, "/readiness", tree)
    return RouterKind(label, command, "/readiness")


MODIFIERS = ("kv", "nokv", "auth")


@dataclass(frozen=True)
class PolicyEntry:
    """One ``--policies`` entry, ``NAME[+MODIFIER...]``: the policy, whether the router reads
    KV events (True ``+kv``, False ``+nokv``, None its default) and whether it runs with API
    keys (``+auth``)."""

    name: str
    kv_events: bool | None
    auth: bool


def policy_entry(entry: str) -> PolicyEntry:
    """Parse a ``--policies`` entry; ValueError for a modifier it does not know, or both
    ``kv`` and ``nokv``."""
    name, *modifiers = entry.split("+")
    unknown = [m for m in modifiers if m not in MODIFIERS]
    if unknown:
        raise ValueError(
            f"--policies entry {entry!r}: unknown modifier {unknown[0]!r} "
            f"(allowed: {', '.join('+' + m for m in MODIFIERS)})"
        )
    if "kv" in modifiers and "nokv" in modifiers:
        raise ValueError(f"--policies entry {entry!r}: +kv and +nokv contradict each other")
    kv_events = True if "kv" in modifiers else False if "nokv" in modifiers else None
    return PolicyEntry(name, kv_events, "auth" in modifiers)


def sglang_router(python: str) -> RouterKind:
    def command(port: int, workers: list[str]) -> list[str]:
        return [python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                "--port", str(port), "--policy", "cache_aware", "--log-level", "warn",
                "--prometheus-port", str(free_port()), "--worker-urls", *workers]  # fmt: skip

    return RouterKind("sglang-router 0.3.2 cache_aware", command, "/readiness")


# ------------------------------------------------------------------------ workloads

WORDS = [" " + "".join(random.Random(i).choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3))
         for i in range(4096)]  # fmt: skip


def prompt(i: int, rng: random.Random) -> str:
    """~2 kB: one of 16 shared ~1.5 kB system prompts and a ~500 B question of its own."""
    system = "".join(WORDS[((i % 16) * 256 + k) % len(WORDS)] for k in range(380))
    question = "".join(rng.choice(WORDS) for _ in range(125))
    return system + question


def with_key(request: bytes) -> bytes:
    return request.replace(b"\r\n", b"\r\nauthorization: Bearer " + BENCH_KEY.encode() + b"\r\n", 1)


def completion_requests(seed: int, n: int) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        body = orjson.dumps({"model": MODEL, "prompt": prompt(i, rng), "max_tokens": 8})
        out.append(with_key(build_request("/v1/completions", body)))
    return out


def stream_requests(seed: int, n: int) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        body = orjson.dumps({
            "model": MODEL, "messages": [{"role": "user", "content": prompt(i, rng)}],
            "max_tokens": 16, "stream": True,
        })  # fmt: skip
        out.append(with_key(build_request("/v1/chat/completions", body)))
    return out


# ------------------------------------------------------------------------ measurements


def targets_of(urls: Sequence[str]) -> list[tuple[str, int]]:
    return [("127.0.0.1", int(u.rsplit(":", 1)[1])) for u in urls]


@dataclass(frozen=True)
class Profile:
    """Where to profile a router's CPU measurement, and with what: ``py-spy`` (Python stacks,
    collapsed-stack text) or ``perf`` (native stacks, kernel included: `perf report -i`)."""

    tool: Literal["py-spy", "perf"]
    out: Path


def start_profiler(pid: int, profile: Profile) -> subprocess.Popen[bytes]:
    """Sample ``pid`` into ``profile.out`` until interrupted (SIGINT); the profiler runs in
    its own process, off the router's core. py-spy is a dev dependency; perf comes from the
    system (Debian's ``linux-perf``) and needs the right to trace the router."""
    if profile.tool == "perf":
        cmd = [shutil.which("perf") or "perf", "record", "--quiet", "-F", "999", "-g",
               "-p", str(pid), "-o", str(profile.out)]  # fmt: skip
    else:
        binary = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        cmd = [binary, "record", "--pid", str(pid), "--nonblocking", "--rate", "250",
               "--format", "raw", "--output", str(profile.out)]  # fmt: skip
    spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the load starts
    return spy


def stop_profiler(spy: subprocess.Popen[bytes] | None) -> None:
    if spy is not None:
        spy.send_signal(signal.SIGINT)  # both profilers write their output when interrupted
        spy.wait(30)


def upstreams_cpu_seconds(pids: Sequence[int]) -> float:
    """`cpu_seconds` of every upstream (their threads, a KV-event publisher's I/O thread
    included, live for the whole run)."""
    return sum(cpu_seconds(pid) for pid in pids)


def measure(targets: list[tuple[str, int]], args: argparse.Namespace, seed: int,
            pid: int | None, profile: Profile | None = None,
            before_measuring: Callable[[], None] | None = None,
            upstream_pids: Sequence[int] = ()) -> dict[str, Any]:  # fmt: skip
    """One round of one router (``pid``; None: the engines directly, latency only); with
    ``upstream_pids`` the saturated run also records their CPU per request (module doc)."""
    out: dict[str, Any] = {}
    warm = completion_requests(seed + 7, WARM_UP_REQUESTS)
    asyncio.run(closed_loop(targets, warm.__getitem__, len(warm), 16))
    if before_measuring is not None:
        before_measuring()
    if pid is not None:
        wait_idle(pid)
        reqs = completion_requests(seed, args.requests)
        at_rate = args.profile_at_rate
        spy = start_profiler(pid, profile) if profile is not None and not at_rate else None
        before, upstreams_before = cpu_seconds(pid), upstreams_cpu_seconds(upstream_pids)
        run = asyncio.run(closed_loop(targets, reqs.__getitem__, len(reqs), 32))
        used = cpu_seconds(pid) - before
        upstreams_used = upstreams_cpu_seconds(upstream_pids) - upstreams_before
        stop_profiler(spy)
        ok = sum(1 for r in run.results if r.status == 200)
        out["cpu_us_per_request"] = used / ok * 1e6
        out["saturation_rps"] = ok / run.wall_seconds
        out["saturation_errors"] = len(reqs) - ok
        if upstream_pids:
            out["upstreams_cpu_us_per_request"] = upstreams_used / ok * 1e6
        if args.cpu_rate:
            wait_idle(pid)
            reqs = completion_requests(seed + 3, args.requests)
            spy = start_profiler(pid, profile) if profile is not None and at_rate else None
            before = cpu_seconds(pid)
            run = asyncio.run(open_loop(targets, reqs.__getitem__, len(reqs), args.cpu_rate))
            used = cpu_seconds(pid) - before
            stop_profiler(spy)
            ok = sum(1 for r in run.results if r.status == 200)
            out["cpu_at_rate_us_per_request"] = used / max(ok, 1) * 1e6
            out["cpu_at_rate_errors"] = len(reqs) - ok
    if args.cpu_only:
        return out
    reqs = completion_requests(seed + 1, args.latency_requests)
    run = asyncio.run(open_loop(targets, reqs.__getitem__, len(reqs), args.rate))
    lat = run.latencies()
    out["latency_p50_ms"] = percentile(lat, 0.5) * 1e3
    out["latency_p99_ms"] = percentile(lat, 0.99) * 1e3
    out["latency_errors"] = sum(1 for r in run.results if r.status != 200) + run.errors
    streams = stream_requests(seed + 2, args.stream_requests)
    run = asyncio.run(closed_loop(targets, streams.__getitem__, len(streams), 1))
    first = run.latencies(first_chunk=True)
    out["first_chunk_p50_ms"] = percentile(first, 0.5) * 1e3
    out["first_chunk_p99_ms"] = percentile(first, 0.99) * 1e3
    return out


def run_router(kind: RouterKind, engines: list[Proc], args: argparse.Namespace,
               seed: int) -> dict[str, Any]:  # fmt: skip
    port = free_port()
    router = start(kind.label, kind.command(port, [e.url for e in engines]), ROUTER_CORE, port,
                   kind.tree)  # fmt: skip
    try:
        wait_http(router.url, kind.ready_path)
        time.sleep(1.0)  # let both routers finish their start-up health checks
        profile = None
        name = "".join(c if c.isalnum() else "-" for c in kind.label)
        if args.py_spy is not None:
            args.py_spy.mkdir(parents=True, exist_ok=True)
            profile = Profile("py-spy", args.py_spy / f"{name}-seed{seed}.txt")
        elif args.perf is not None:
            args.perf.mkdir(parents=True, exist_ok=True)
            profile = Profile("perf", args.perf / f"{name}-seed{seed}.perf")
        at_start: list[float] = []

        def caught_up() -> None:
            wait_caught_up(router.url, len(engines))
            at_start.append(failed_replays(router.url))

        tpuserve = kind.label.startswith("tpuserve")
        out = measure(targets_of([router.url]), args, seed, router.popen.pid, profile,
                      caught_up if tpuserve else None, [e.popen.pid for e in engines])  # fmt: skip
        if tpuserve:
            out["kv_replays_failed_at_start"] = at_start[0]
            out["kv_replays_failed"] = failed_replays(router.url) - at_start[0]
        return out
    finally:
        router.stop()


def replay_counts(url: str) -> dict[tuple[str, str], float]:
    """The router's KV-event replays so far by (worker, result), from its ``/metrics``."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.labels["worker"], sample.labels["result"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "tpuserve_router_kv_event_replays"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def failed_replays(url: str) -> float:
    """The router's failed KV-event replays so far. A round with one during its measurement
    carries its retries' cost: a catch-up asks an engine for its whole buffer (up to 10,000
    batches)."""
    return sum(n for (_, result), n in replay_counts(url).items() if result == "failed")


def wait_caught_up(url: str, engines: int, deadline_seconds: float = 60.0) -> None:
    """Until a router that follows KV events has caught up on every engine once (a replay
    that succeeded per worker). A replay is counted when it ends: a router with no replay
    counted 5 s after its warm-up follows no engine's events (no KV events, or upstreams
    that publish none, as the stubs) and has nothing to wait for."""
    start = time.monotonic()
    end = start + deadline_seconds
    while True:
        counts = replay_counts(url)
        if not any(counts.values()):
            if time.monotonic() - start > 5.0:
                return
            time.sleep(0.2)
            continue
        if sum(1 for (_, result), n in counts.items() if result == "ok" and n) >= engines:
            return
        if time.monotonic() > end:
            print(f"warning: {url} had not caught up on every engine's KV events after "
                  f"{deadline_seconds:g} s; measuring anyway", file=sys.stderr)  # fmt: skip
            return
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=6000, help="closed-loop requests")
    parser.add_argument("--rate", type=float, default=500.0, help="open-loop requests/s")
    parser.add_argument("--latency-requests", type=int, default=5000)
    parser.add_argument("--stream-requests", type=int, default=300, help="one at a time")
    parser.add_argument(
        "--upstream",
        choices=("engine", "stub"),
        default="engine",
        help="4 engine twins, or 4 stubs answering at once (isolates the router)",
    )
    parser.add_argument("--skip-anchor", action="store_true", help="tpuserve only")
    parser.add_argument(
        "--policies",
        default="cache_aware,cost+kv",
        help="tpuserve policies, comma list; NAME+kv also subscribes to KV events (NAME+nokv: "
        "never, to measure what they cost; a --baseline tree older than --no-kv-events "
        "cannot run it), NAME+auth "
        "runs with an API keys file (every request carries the key either way)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        action="append",
        default=[],
        help="also run each tpuserve policy from this checkout (before/after in one run); "
        "repeat for several",
    )
    parser.add_argument(
        "--cpu-only",
        action="store_true",
        help="measure only CPU per request and saturation throughput (no latency, no streams)",
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        metavar="DIR",
        help="profile each router during the CPU measurement with py-spy (collapsed stacks, "
        "one file per router and round, in DIR); sampling from outside adds to the host's "
        "load, so take CPU figures from runs without it",
    )
    parser.add_argument(
        "--perf",
        type=Path,
        default=None,
        metavar="DIR",
        help="profile each router during the CPU measurement with Linux perf (native stacks "
        "with the kernel's: one perf.data per router and round, in DIR; read with `perf "
        "report -i FILE --sort dso`); not with --py-spy",
    )
    parser.add_argument(
        "--cpu-rate",
        type=float,
        default=0.0,
        metavar="REQ_PER_S",
        help="also measure CPU per request in an open loop at this rate (the same arrivals "
        "for every router: at saturation each router's CPU per request also depends on the "
        "throughput it reaches, so on how much each wake-up of its event loop batches)",
    )
    parser.add_argument(
        "--profile-at-rate",
        action="store_true",
        help="profile the open-loop run at --cpu-rate instead of the saturated one (where "
        "each wake-up of the event loop serves one request and runs with cold caches)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write all rows here")
    args = parser.parse_args()
    if args.py_spy is not None and args.perf is not None:
        parser.error("--py-spy and --perf: one profiler at a time")
    if args.cpu_rate < 0:
        parser.error(f"--cpu-rate {args.cpu_rate:g}: must be 0 (off) or a positive rate")
    if args.profile_at_rate and (args.cpu_rate <= 0 or (args.py_spy is None and args.perf is None)):
        parser.error("--profile-at-rate needs --cpu-rate R and a profiler (--py-spy or --perf)")

    os.sched_setaffinity(0, {int(OTHER_CORE)})  # the load generator stays off the router's core
    trees: list[Path | None] = [None, *args.baseline]
    try:
        entries = [policy_entry(p) for p in args.policies.split(",")]
    except ValueError as err:
        parser.error(str(err))
    kinds = [
        tpuserve_router(e.name, kv_events=e.kv_events, tree=tree, auth=e.auth)
        for e in entries
        for tree in (trees if not e.auth else [None])  # the baseline has no keys
    ]
    if not args.skip_anchor:
        kinds.append(sglang_router(anchor_python()))
    engines = start_engines(4) if args.upstream == "engine" else start_stubs(4)
    rows: dict[str, list[dict[str, Any]]] = {k.label: [] for k in kinds}
    direct: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            seed = 1000 * r
            direct.append(measure(targets_of([e.url for e in engines]), args, seed, None))
            order = kinds if r % 2 == 0 else list(reversed(kinds))
            for kind in order:
                # Questions of its own for each router (the 16 system prompts stay shared): with
                # the same ones, a router would find the engines already holding the prompts an
                # earlier router of the round sent, so fewer blocks to store and KV events.
                own_seed = seed + 10 * (kinds.index(kind) + 1)
                rows[kind.label].append(run_router(kind, engines, args, own_seed))
                print(f"round {r + 1}: {kind.label}: {json.dumps(rows[kind.label][-1])}",
                      file=sys.stderr, flush=True)  # fmt: skip
    finally:
        for engine in engines:
            engine.stop()

    anchor = next((k.label for k in kinds if k.label.startswith("sglang")), None)
    summary = cpu_summary(rows, anchor)
    if not args.cpu_only:
        add_latency_summary(summary, rows, direct, args)
    print_summary(summary, args)
    if args.json:
        args.json.write_text(json.dumps({"direct": direct, "routers": summary}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
