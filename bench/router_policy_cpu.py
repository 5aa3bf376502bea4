"""A policy's own per-request work, in process: parsing and tokenizing a request's body, then
choosing a worker (and the bookkeeping when the request ends), over the requests
`bench/router_overhead.py` sends (~2 kB prompts: 16 shared system prompts and a question of
their own) and 4 healthy workers. No sockets, no event loop: what the policy itself costs,
without the router's wake-ups and cold caches around it (docs/router.md, "Performance").

Usage (from the repository root):

    python bench/router_policy_cpu.py [--policy precise] [--requests 8000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
from bench.router_overhead import completion_requests
from sglang_tpu.tokenizer import load_tokenizer
from tpuserve_router.policies.base import RouteRequest, make_policy
from tpuserve_router.request_body import parse_completions, parse_json_object
from tpuserve_router.token_cache import ChatTokenCache
from tpuserve_router.workers import WorkerRegistry, WorkerSpec


def measure(policy_name: str, requests: int, warm_up: int) -> dict[str, float]:
    """Microseconds per request: parsing with tokenizing, and choosing with its bookkeeping."""
    policy = make_policy(policy_name)
    tokens = ChatTokenCache(load_tokenizer(None)) if policy.needs_tokens else None
    registry = WorkerRegistry()
    workers = [registry.add(WorkerSpec(f"http://127.0.0.1:{9000 + i}")) for i in range(4)]
    for worker in workers:
        worker.healthy = True
    policy.on_workers_changed(registry.names())
    bodies = [r.split(b"\r\n\r\n", 1)[1] for r in completion_requests(10, warm_up + requests)]
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
    return {
        "parse_us": (parsed - start) / requests * 1e6,
        "choose_us": (chosen - parsed) / requests * 1e6,
        "total_us": (chosen - start) / requests * 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="precise")
    parser.add_argument("--requests", type=int, default=8000)
    parser.add_argument("--warm-up", type=int, default=2000)
    args = parser.parse_args()
    for name, value in measure(args.policy, args.requests, args.warm_up).items():
        print(f"{name}: {value:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
