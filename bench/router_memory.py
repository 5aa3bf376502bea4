"""Router memory over many distinct prompts: RSS of the router process, sampled as it goes.

4 engine twins (`--time-scale 0`) on loopback, or with ``--upstream stub`` 4 minimal
SGLang-compatible stubs that answer ``/generate`` at once (the upstream does not change what
the router keeps in memory, and on a shared 2-core machine the twins manage only a few
hundred 2 kB requests per second, so 10^6 prompts would take hours). The router under test
runs alone on core 1. Prompts are ~2 kB and all distinct (random text, so each one adds to
a prefix tree), sent through ``/generate`` with one output token, closed loop. The router's
RSS (VmRSS) is sampled every ``--sample-every`` requests. A flat line is the target: once
the tree reaches its bound, RSS stays within ±10 % of the first sample. With ``--anchor``,
sglang-router 0.3.2 is measured the same way, for fewer prompts.

    python bench/router_memory.py [--prompts 1000000] [--sample-every 100000] [--anchor]
                                  [--upstream engine|stub]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import orjson

# Run as a script (`python bench/router_memory.py`): the checkout's root first, so `bench.*`
# is this checkout's even when another one is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import router_overhead as ro
from bench.router_loadgen import build_request, closed_loop


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


LETTERS = bytes(range(ord("a"), ord("z") + 1)) + b" "
TO_TEXT = bytes(LETTERS[b % len(LETTERS)] for b in range(256))


def generate_requests(start: int, n: int) -> list[bytes]:
    """Distinct ~2 kB texts: random bytes mapped onto letters and spaces (seeded by index)."""
    out = []
    for i in range(start, start + n):
        text = random.Random(i).randbytes(2048).translate(TO_TEXT).decode()
        body = orjson.dumps({"text": text, "sampling_params": {"max_new_tokens": 1}})
        out.append(build_request("/generate", body))
    return out


def measure(
    kind: ro.RouterKind, engines: list[ro.Proc], prompts: int, every: int
) -> list[dict[str, Any]]:
    port = ro.free_port()
    router = ro.start(
        kind.label, kind.command(port, [e.url for e in engines]), ro.ROUTER_CORE, port
    )
    samples = []
    try:
        ro.wait_http(router.url, kind.ready_path)
        time.sleep(1.0)
        sent = 0
        started = time.monotonic()
        samples.append({"prompts": 0, "rss_mib": rss_mib(router.popen.pid)})
        while sent < prompts:
            batch = min(every, prompts - sent)
            done = 0
            for chunk_start in range(sent, sent + batch, 20_000):
                size = min(20_000, sent + batch - chunk_start)
                requests = generate_requests(chunk_start, size)
                run = asyncio.run(
                    closed_loop([("127.0.0.1", port)], requests.__getitem__, size, 32)
                )
                done += sum(1 for r in run.results if r.status == 200)
            sent += batch
            sample = {"prompts": sent, "ok": done, "rss_mib": rss_mib(router.popen.pid),
                      "elapsed_s": round(time.monotonic() - started, 1)}  # fmt: skip
            samples.append(sample)
            print(f"{kind.label}: {json.dumps(sample)}", file=sys.stderr, flush=True)
    finally:
        router.stop()
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=1_000_000)
    parser.add_argument("--sample-every", type=int, default=100_000)
    parser.add_argument("--anchor", action="store_true", help="also sglang-router 0.3.2")
    parser.add_argument("--anchor-prompts", type=int, default=100_000)
    parser.add_argument("--policy", default="cache_aware")
    parser.add_argument("--upstream", choices=("engine", "stub"), default="engine")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    os.sched_setaffinity(0, {int(ro.OTHER_CORE)})
    engines = ro.start_engines(4) if args.upstream == "engine" else ro.start_stubs(4)
    results: dict[str, Any] = {}
    try:
        kind = ro.tpuserve_router(args.policy)
        results[kind.label] = measure(kind, engines, args.prompts, args.sample_every)
        if args.anchor:
            anchor = ro.sglang_router(ro.anchor_python())
            every = max(1, args.anchor_prompts // 10)
            results[anchor.label] = measure(anchor, engines, args.anchor_prompts, every)
    finally:
        for engine in engines:
            engine.stop()
    for label, samples in results.items():
        first = samples[1]["rss_mib"]
        values = [s["rss_mib"] for s in samples[1:]]
        spread = (max(values) - min(values)) / first * 100
        print(
            f"{label}: RSS {samples[0]['rss_mib']:.0f} MiB at start, {first:.0f} MiB after "
            f"{samples[1]['prompts']} prompts, {values[-1]:.0f} MiB after {samples[-1]['prompts']}"
            f" (max {max(values):.0f}, spread {spread:.1f} % of the first sample)"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
