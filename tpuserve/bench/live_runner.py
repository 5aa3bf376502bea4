"""Mode live: the trace over real HTTP, through a real router, to engine-twin processes.

Everything binds and dials 127.0.0.1 only. The runner starts:

- N ``tpuserve engine sim`` processes with ``--time-scale`` (each modelled second lasts
  ``time_scale`` real seconds), the cache size the sizing rule chose, and KV events on for
  the policies that read them;
- one router in front of them: ``tpuserve router --policy NAME`` for tpuserve's policies, or
  the real sglang-router (``python -m sglang_router.launch_router --policy cache_aware``, CLI
  defaults) from its own virtual environment (`bench/routing_anchor_venv.sh`) for
  ``sglang_cache_aware_v2`` (0.3.2 is the gateway version: least-load miss path);
- the client in this process: an open loop that sends each request at ``t x time_scale``,
  streaming, and records the time to the first data chunk, the end, and the engine's
  ``usage.prompt_tokens_details.cached_tokens`` (the ground-truth hit).

Engine load (``/v1/loads``: running plus waiting requests over every DP rank; SGLang 0.5.23
has no ``/get_load``) is sampled every `SAMPLE_SECONDS` for the imbalance metric, and
the CPU seconds of the client, the router and the engines are read from ``/proc`` so a run
can show the two cores were not the bottleneck (``cpu_share_of_one_core`` in the summary), with
the host's load average at the end (other work on the machine shows there).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tpuserve.bench.report import LoadSamples, RequestRecord
from tpuserve.bench.sim_config import SimConfig, make_timer
from tpuserve.bench.traces import TraceRequest, token_ids_of
from tpuserve.cluster.ports import free_port
from tpuserve_router.policies.base import registered_policy_names

ENTRY = "import sys; from tpuserve.cli import main; sys.exit(main())"
MODEL = "bench"
START_TIMEOUT_SECONDS = 60.0
SAMPLE_SECONDS = 0.2
SGLANG_ROUTER_POLICY = "sglang_cache_aware_v2"
KV_EVENT_POLICIES = ("precise", "cost")
REPO = Path(__file__).resolve().parents[2]


class LiveError(RuntimeError):
    """A process of the live fleet could not start or the policy cannot run live."""


@dataclass
class LiveConfig:
    sim: SimConfig
    time_scale: float = 1.0
    anchor_python: str | None = None
    router_args: tuple[str, ...] = ()
    engine_args: tuple[str, ...] = ()


@dataclass
class LiveResult:
    records: list[RequestRecord]
    samples: LoadSamples
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Proc:
    role: str
    popen: subprocess.Popen[bytes]
    url: str

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.popen.pid)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def _wait_line(popen: subprocess.Popen[bytes], prefix: bytes, what: str) -> bytes:
    assert popen.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(popen.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    try:
        while time.monotonic() < deadline:
            if popen.poll() is not None:
                raise LiveError(f"{what} exited with {popen.returncode} before it was ready")
            if sel.select(timeout=0.2):
                line = popen.stdout.readline()
                if line.startswith(prefix):
                    return line
        raise LiveError(f"{what} was not ready within {START_TIMEOUT_SECONDS:g} s")
    finally:
        sel.close()


def start_engine(index: int, config: LiveConfig, kv_events: bool) -> Proc:
    sim = config.sim
    cmd = [
        sys.executable, "-c", ENTRY, "engine", "sim", "--log-level", "warning",
        "--host", "127.0.0.1", "--port", "0", "--served-model-name", MODEL,
        "--tpu", sim.tpu, "--topology", sim.topology, "--model-profile", sim.model_profile,
        "--cache-tokens", str(sim.cache_tokens), "--page-size", str(sim.page_size),
        "--max-running-requests", str(sim.max_running_requests),
        "--chunked-prefill-size", str(sim.chunked_prefill_size),
        "--max-queued-requests", str(min(sim.max_queued_requests, 100_000)),
        "--time-scale", repr(config.time_scale), "--seed", str(sim.seed * 1000 + index),
        "--enable-cache-report",  # cached tokens in usage, as engines the launcher starts
        *config.engine_args,
    ]  # fmt: skip
    if kv_events:
        cmd += [
            "--kv-events-endpoint", "tcp://127.0.0.1:*",  # free ports, in /get_server_info
            "--kv-events-replay-endpoint", "tcp://127.0.0.1:*",
        ]  # fmt: skip
    popen = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        line = _wait_line(popen, b"READY ", f"engine {index}")
    except LiveError:
        popen.kill()
        popen.wait()
        raise
    return Proc(f"engine{index}", popen, line.split()[1].decode())


def anchor_python(config: LiveConfig) -> str:
    if config.anchor_python:
        return config.anchor_python
    script = REPO / "bench" / "routing_anchor_venv.sh"
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise LiveError(f"could not install sglang-router: {out.stderr.strip()[-500:]}")
    return out.stdout.strip().splitlines()[-1]


def start_router(policy: str, workers: Sequence[str], config: LiveConfig) -> Proc:
    port = free_port()
    if policy == SGLANG_ROUTER_POLICY:
        cmd = [
            anchor_python(config), "-m", "sglang_router.launch_router",
            "--host", "127.0.0.1", "--port", str(port), "--policy", "cache_aware",
            "--worker-urls", *workers, "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(free_port()), "--log-level", "warn",
            *config.router_args,
        ]  # fmt: skip
    elif policy in registered_policy_names():
        cmd = [
            sys.executable, "-c", ENTRY, "router", "--log-level", "warning",
            "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
            "--health-check-interval", "1", *config.router_args,
        ]  # fmt: skip
        for url in workers:
            cmd += ["--worker", url]
        if policy in KV_EVENT_POLICIES:
            cmd.append("--kv-events" if config.sim.kv_events else "--no-kv-events")
    else:
        raise LiveError(
            f"--policy {policy}: live mode runs tpuserve's policies "
            f"({', '.join(registered_policy_names())}) and {SGLANG_ROUTER_POLICY} (the real "
            "sglang-router); the other anchors need the engines in-process (--mode sim)"
        )
    popen = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return Proc("router", popen, f"http://127.0.0.1:{port}")


async def wait_router_ready(router: Proc, workers: int, within_seconds: float) -> None:
    """Until tiny completions go through the router (every worker registered)."""
    deadline = time.monotonic() + within_seconds
    body = {"model": MODEL, "prompt": "ready", "max_tokens": 1}
    async with aiohttp.ClientSession() as session:
        ok = 0
        while time.monotonic() < deadline:
            if router.popen.poll() is not None:
                raise LiveError(f"the router exited with {router.popen.returncode}")
            try:
                async with session.post(router.url + "/v1/completions", json=body) as resp:
                    ok = ok + 1 if resp.status == 200 else 0
                    await resp.read()
            except aiohttp.ClientError:
                ok = 0
            if ok >= 2 * workers:
                return
            await asyncio.sleep(0.1)
    raise LiveError(f"the router was not ready within {within_seconds:g} s")


FAILURE_REASONS = {
    "http_<status>": "the router answered with that HTTP status (the body's message in "
    "error_detail)",
    "stream_error": "the stream carried an error object instead of tokens",
    "no_data": "the answer ended without a single data chunk",
    "<exception>": "the connection failed: the client's exception class, e.g. "
    "ServerDisconnectedError, TimeoutError",
}
"""Why a request failed in mode live: the ``error`` of its record, in one of these forms."""

ERROR_DETAIL_CHARS = 300


async def send_request(
    session: aiohttp.ClientSession, url: str, req: TraceRequest, rec: RequestRecord, t0: float
) -> None:
    route, body = req.body()
    body = {**body, "model": MODEL, "stream": True, "stream_options": {"include_usage": True}}
    loop = asyncio.get_running_loop()
    start = loop.time()
    rec.arrival = start - t0
    try:
        async with session.post(url + route, data=orjson.dumps(body),
                                headers={"content-type": "application/json"}) as resp:  # fmt: skip
            if resp.status != 200:
                rec.error = f"http_{resp.status}"
                rec.error_detail = (await resp.text(errors="replace"))[:ERROR_DETAIL_CHARS]
                return
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = orjson.loads(data)
                if not isinstance(chunk, dict):
                    continue
                if chunk.get("error"):
                    rec.error = "stream_error"
                    rec.error_detail = str(chunk["error"])[:ERROR_DETAIL_CHARS]
                    return
                if rec.ttft is None:
                    rec.ttft = loop.time() - start
                usage = chunk.get("usage")
                if usage:
                    rec.completion_tokens = int(usage.get("completion_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    rec.cached_tokens = int(details.get("cached_tokens") or 0)
                    rec.prompt_tokens = int(usage.get("prompt_tokens") or rec.prompt_tokens)
        rec.e2e = loop.time() - start
        rec.ok = rec.ttft is not None
        if not rec.ok:
            rec.error = "no_data"
    except (TimeoutError, aiohttp.ClientError, orjson.JSONDecodeError) as err:
        rec.ok = False
        rec.error = type(err).__name__
        rec.error_detail = str(err)[:ERROR_DETAIL_CHARS]


async def _sample_loads(
    session: aiohttp.ClientSession, engines: Sequence[Proc], samples: LoadSamples, t0: float,
    stop: asyncio.Event,
) -> None:  # fmt: skip
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        loads = []
        for engine in engines:
            try:
                async with session.get(engine.url + "/v1/loads") as resp:
                    data = await resp.json()
                    loads.append(
                        sum(int(r["num_running_reqs"]) + int(r["num_waiting_reqs"])
                            for r in data["loads"])
                    )  # fmt: skip
            except (TimeoutError, aiohttp.ClientError, KeyError, IndexError, ValueError):
                loads.append(0)
        samples.add(loop.time() - t0, loads)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), SAMPLE_SECONDS)


async def _drive(
    trace: Sequence[TraceRequest], router: Proc, engines: Sequence[Proc], config: LiveConfig,
    records: list[RequestRecord], samples: LoadSamples,
) -> None:  # fmt: skip
    scale = config.time_scale
    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        stop = asyncio.Event()
        sampler = loop.create_task(_sample_loads(session, engines, samples, t0, stop))
        tasks = []
        for req, rec in zip(trace, records, strict=True):
            delay = t0 + req.t * scale - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(loop.create_task(send_request(session, router.url, req, rec, t0)))
        await asyncio.gather(*tasks)
        stop.set()
        await sampler


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run_live(trace: Sequence[TraceRequest], policy: str, config: LiveConfig) -> LiveResult:
    sim = config.sim
    if policy not in registered_policy_names() and policy != SGLANG_ROUTER_POLICY:
        start_router(policy, [], config)  # raises LiveError naming what live mode runs
    timer = make_timer(sim)
    from sglang_tpu.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    records = []
    for req in trace:
        n = len(token_ids_of(req, tokenizer))
        rec = RequestRecord(req.id, "", req.t, n)
        rec.ttft_slo = sim.slo_factor * timer.prefill_seconds(n, 0) * config.time_scale
        rec.tpot_slo = sim.slo_factor * timer.decode_step_seconds(1, n) * config.time_scale
        records.append(rec)
    samples = LoadSamples([f"engine{i}" for i in range(sim.workers)])
    engines: list[Proc] = []
    router: Proc | None = None
    # SIGTERM (a sweep script stopped) must still stop the engines and the router below.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        for i in range(sim.workers):
            events = policy in KV_EVENT_POLICIES and sim.kv_events
            engines.append(start_engine(i, config, events))
        router = start_router(policy, [e.url for e in engines], config)
        asyncio.run(wait_router_ready(router, sim.workers, START_TIMEOUT_SECONDS))
        cpu_before = {p.role: p.cpu_seconds() for p in [router, *engines]}
        client_before = time.process_time()
        wall_before = time.monotonic()
        asyncio.run(_drive(trace, router, engines, config, records, samples))
        wall = time.monotonic() - wall_before
        cpu = {p.role: (p.cpu_seconds() - cpu_before[p.role]) / wall for p in [router, *engines]}
        cpu["client"] = (time.process_time() - client_before) / wall
    finally:
        for proc in [router, *engines]:
            if proc is not None:
                proc.stop()
        signal.signal(signal.SIGTERM, previous)
    engine_cpu = sum(v for k, v in cpu.items() if k.startswith("engine"))
    meta = {
        "router": "sglang-router 0.3.2" if policy == SGLANG_ROUTER_POLICY else "tpuserve router",
        "time_scale": config.time_scale,
        "wall_seconds": wall,
        "cpu_share_of_one_core": {k: round(v, 3) for k, v in cpu.items()},
        "cpu_total_cores": round(sum(cpu.values()), 3),
        "cpu_engines_cores": round(engine_cpu, 3),
        "host_load_average_1m": round(os.getloadavg()[0], 2),
        "host_cores": os.cpu_count(),
    }
    return LiveResult(records, samples, meta)
