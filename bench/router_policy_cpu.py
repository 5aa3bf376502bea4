"""A policy's own per-request work, in process: parsing and tokenizing a request's body, then
choosing a worker (and the bookkeeping when the request ends), over the requests
`bench/router_overhead.py` sends (~2 kB prompts: 16 shared system prompts and a question of
their own) and 4 healthy workers. No sockets, no event loop: what the policy itself costs,
without the router's wake-ups and cold caches around it (docs/router.md, "Performance").

``--cold-mb N`` also times each request on its own after rewriting an N MB buffer, which
evicts the core's caches as the time between two requests does in a router at a moderate
rate: there a request's cost is mostly its cache misses (the code and data it touches), not
its instructions, and a policy's cold cost tracks its CPU per request at a fixed rate far
better than its warm cost does (``cold_us``: the median, parsing and choosing together).
For a deterministic count of those misses, run it under ``valgrind --tool=cachegrind``
(docs/router.md, "Performance").

Usage (from the repository root):

    python bench/router_policy_cpu.py [--policy precise] [--requests 8000] [--cold-mb 48]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
from bench.router_cold_misses import setup
from bench.router_overhead import completion_requests
from tpuserve_router.pipeline.request_body import parse_completions, parse_json_object
from tpuserve_router.policies.base import RouteRequest


def measure(policy_name: str, requests: int, warm_up: int, cold_mb: int = 0) -> dict[str, float]:
    """Microseconds per request: parsing with tokenizing, and choosing with its bookkeeping;
    with ``cold_mb``, also the median of requests timed one by one, each after the caches
    were evicted (``cold_us``)."""
    policy, tokens, workers = setup(policy_name)
    total = warm_up + requests * (2 if cold_mb > 0 else 1)  # cold: requests not seen before
    bodies = [r.split(b"\r\n\r\n", 1)[1] for r in completion_requests(10, total)]
    documents = [parse_json_object(b) for b in bodies]

    def parse(i: int) -> RouteRequest:
        parsed = parse_completions(documents[i], policy.needs_text, tokens, None)
        return RouteRequest(parsed.model, parsed.text, parsed.token_ids)

    def choose(request: RouteRequest) -> None:
        decision = policy.choose(request, workers)
        policy.on_prefill_done(decision)
        policy.on_request_done(decision, True)

    for i in range(warm_up):
        choose(parse(i))
    measured = range(warm_up, warm_up + requests)
    start = time.perf_counter()
    routed = [parse(i) for i in measured]
    parsed = time.perf_counter()
    for request in routed:
        choose(request)
    chosen = time.perf_counter()
    figures = {
        "parse_us": (parsed - start) / requests * 1e6,
        "choose_us": (chosen - parsed) / requests * 1e6,
        "total_us": (chosen - start) / requests * 1e6,
    }
    if cold_mb > 0:
        fresh = range(total - requests, total)
        figures["cold_us"] = cold(lambda i: choose(parse(i)), fresh, cold_mb) * 1e6
    return figures


def cold(run: Callable[[int], None], requests: range, cold_mb: int) -> float:
    """The median seconds of ``run(i)`` for each of ``requests``, each run after rewriting a
    ``cold_mb`` MB buffer (the copy evicts what the caches held)."""
    source, sink = bytearray(cold_mb << 20), bytearray(cold_mb << 20)
    seconds = []
    for i in requests:
        sink[:] = source
        start = time.perf_counter()
        run(i)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="precise")
    parser.add_argument("--requests", type=int, default=8000)
    parser.add_argument("--warm-up", type=int, default=2000)
    parser.add_argument(
        "--cold-mb",
        type=int,
        default=0,
        help="also time requests one by one with the caches evicted by rewriting a buffer of "
        "this many MB before each (more than the last-level cache: 48 on a 32 MB one)",
    )
    args = parser.parse_args()
    if args.cold_mb < 0:
        parser.error(f"--cold-mb must be >= 0, got {args.cold_mb}")
    for name, value in measure(args.policy, args.requests, args.warm_up, args.cold_mb).items():
        print(f"{name}: {value:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
