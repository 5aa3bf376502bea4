"""A policy's cache misses per request with cold caches, counted by cachegrind: what a request
costs a router at a moderate rate (CHANGELOG.md, router CPU pass 11), without the noise of
timing it on a shared machine.

The requests are `bench/router_policy_cpu.py`'s (the same bodies, 4 healthy workers, parsing
with tokenizing, then choosing, reading the token counts of an answer shaped as the engine
twin's, and the bookkeeping when the request ends). After ``--warm-up``
requests, each of ``--requests`` requests runs after a buffer of ``--evict-mb`` MB is
rewritten, which evicts cachegrind's simulated caches (32 kB first-level caches, a 1 MB last
level); the same run without the requests is subtracted, so the figures are the requests' own:
instructions, and last-level misses for code and for data.

To compare with other code, copy this file into that checkout's ``bench/`` and run it there
(it needs nothing else of this checkout's benchmarks).
Needs ``valgrind`` (Debian's ``valgrind`` package).

Usage (from the repository root):

    python bench/router_cold_misses.py [--policy precise] [--requests 400]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
CACHES = ["--I1=32768,8,64", "--D1=32768,8,64", "--LL=1048576,16,64"]


def setup(policy_name: str) -> tuple[Any, Any, list[Any]]:
    """The policy, its token cache (None if it needs no tokens) and 4 healthy workers, as
    `bench/router_policy_cpu.py` also routes them."""
    from sglang_tpu.tokenizer import load_tokenizer
    from tpuserve_router.engines.workers import WorkerRegistry, WorkerSpec
    from tpuserve_router.pipeline.token_cache import ChatTokenCache
    from tpuserve_router.policies.base import make_policy

    policy = make_policy(policy_name)
    tokens = ChatTokenCache(load_tokenizer(None)) if policy.needs_tokens else None
    registry = WorkerRegistry()
    workers = [registry.add(WorkerSpec(f"http://127.0.0.1:{9000 + i}")) for i in range(4)]
    for worker in workers:
        worker.healthy = True
    policy.on_workers_changed(registry.names())
    return policy, tokens, workers


def workload(policy_name: str, requests: int, warm_up: int, evict_mb: int, route: bool) -> None:
    """Route ``warm_up`` requests, then ``requests`` more each after evicting the caches (or
    only evict, without ``route``)."""
    sys.path[:0] = [str(ROOT), str(ROOT / "router")]
    from bench.router_overhead import completion_requests
    from tpuserve_router.pipeline.request_body import parse_completions, parse_json_object
    from tpuserve_router.pipeline.usage import usage_from_body
    from tpuserve_router.policies.base import RouteRequest

    policy, tokens, workers = setup(policy_name)
    bodies = [r.split(b"\r\n\r\n", 1)[1] for r in completion_requests(10, warm_up + requests)]
    # the engine twin's answer to max_tokens=8 (sglang_tpu/sim/openai_api.py)
    answer = orjson.dumps({
        "id": "3f5b0c1e9a7d4e2b8c6a1f0d9e8b7a6c", "object": "text_completion",
        "created": 1764806400, "model": "tiny",
        "choices": [{"index": 0, "logprobs": None, "finish_reason": "length",
                     "matched_stop": None, "text": " and the quick brown fox jumps"}],
        "usage": {"prompt_tokens": 512, "total_tokens": 520, "completion_tokens": 8,
                  "prompt_tokens_details": {"cached_tokens": 448}, "reasoning_tokens": 0,
                  "completion_tokens_details": None},
        "metadata": {"weight_version": "default", "weight_versions": ["default"]},
    })  # fmt: skip

    def one(body: bytes) -> None:
        parsed = parse_completions(parse_json_object(body), policy.needs_text, tokens, None)
        request = RouteRequest(parsed.model, parsed.text, parsed.token_ids)
        decision = policy.choose(request, workers)
        policy.on_prefill_done(decision)
        usage_from_body(answer)
        policy.on_request_done(decision, True)

    for body in bodies[:warm_up]:
        one(body)
    source, sink = bytearray(evict_mb << 20), bytearray(evict_mb << 20)
    for body in bodies[warm_up:]:
        sink[:] = source
        if route:
            one(body)


def totals(cachegrind_out: Path) -> dict[str, int]:
    """The ``summary:`` line of a cachegrind output file, by event name."""
    events: list[str] = []
    for line in cachegrind_out.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("summary:"):
            return dict(zip(events, map(int, line.split()[1:]), strict=True))
    raise ValueError(f"{cachegrind_out}: no summary line")


def count(args: argparse.Namespace, valgrind: str) -> dict[str, float]:
    """Per request: instructions, last-level misses for code and for data, and their sum."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for route in (False, True):
            out = Path(tmp) / f"cachegrind-{int(route)}.out"
            command = [
                valgrind, "--tool=cachegrind", "--cache-sim=yes", *CACHES,
                f"--cachegrind-out-file={out}", sys.executable, __file__, "--child",
                "--policy", args.policy, "--requests", str(args.requests),
                "--warm-up", str(args.warm_up), "--evict-mb", str(args.evict_mb),
            ]  # fmt: skip
            if route:
                command.append("--route")
            seeded = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict layouts each run
            subprocess.run(command, check=True, capture_output=True, env=seeded)
            runs.append(totals(out))
    idle, busy = runs
    per = {name: (busy[name] - idle[name]) / args.requests for name in busy}
    code, data = per["ILmr"], per["DLmr"] + per["DLmw"]
    return {"instructions": per["Ir"], "code_misses": code, "data_misses": data,
            "misses": code + data}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="precise")
    parser.add_argument(
        "--requests", type=int, default=400,
        help="cold requests counted (with 100, a collection or a heap consolidation landing in "
        "one run's window and not the other's moved the figures by up to 40 misses)",
    )  # fmt: skip
    parser.add_argument("--warm-up", type=int, default=1000)
    parser.add_argument(
        "--evict-mb", type=int, default=4, help="MB rewritten before each request (> 1 MB)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--route", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("requests", "warm_up", "evict_mb"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.child:
        workload(args.policy, args.requests, args.warm_up, args.evict_mb, args.route)
        return 0
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        parser.error("valgrind is not installed (Debian: apt-get install valgrind)")
    for name, value in count(args, valgrind).items():
        print(f"{name}: {value:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
