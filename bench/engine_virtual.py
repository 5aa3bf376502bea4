"""Benchmark: simulated requests per wall-clock minute of the engine core on the virtual clock.

Drives `sglang_tpu.sim.virtual_clock.VirtualEngine` in-process with Poisson arrivals of a
shared-prefix workload (W1-like: groups share a system prompt) and prints one JSON line:
simulated requests, wall seconds, simulated requests per minute, hit rate, mean TTFT/E2E.

    .venv/bin/python bench/engine_virtual.py --requests 20000
"""

from __future__ import annotations

import argparse
import json
import random
import time

from sglang_tpu.perf_model import StepTimer, get_profile, kv_pool_tokens
from sglang_tpu.sim.engine import EngineConfig, EngineCore
from sglang_tpu.sim.output_text import OutputPalette
from sglang_tpu.sim.request import Request
from sglang_tpu.sim.virtual_clock import VirtualEngine
from sglang_tpu.tokenizer import load_tokenizer
from sglang_tpu.topology import lookup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rate", type=float, default=20.0, help="arrivals per simulated second")
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--system-tokens", type=int, default=1024)
    parser.add_argument("--question-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--tpu", default="v6e")
    parser.add_argument("--topology", default="2x4")
    parser.add_argument("--model-profile", default="llama-3.1-8b")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    shape = lookup(args.tpu, args.topology)
    profile = get_profile(args.model_profile)
    core = EngineCore(
        EngineConfig(cache_tokens=kv_pool_tokens(shape, profile), page_size=16),
        StepTimer(shape, profile),
        OutputPalette(load_tokenizer()),
    )
    sim = VirtualEngine(core)
    rng = random.Random(args.seed)
    systems = [
        [rng.randrange(1000, 100000) for _ in range(args.system_tokens)] for _ in range(args.groups)
    ]
    t = 0.0
    for i in range(args.requests):
        t += rng.expovariate(args.rate)
        question = [rng.randrange(1000, 100000) for _ in range(args.question_tokens)]
        sim.submit(Request(f"r{i}", systems[rng.randrange(args.groups)] + question,
                           args.output_tokens), at=t)  # fmt: skip
    start = time.perf_counter()
    done = sim.run_to_completion()
    wall = time.perf_counter() - start
    prompt = sum(c.prompt_tokens for c in done)
    print(
        json.dumps(
            {
                "benchmark": "engine_virtual",
                "simulated_requests": len(done),
                "simulated_seconds": round(sim.now, 2),
                "wall_seconds": round(wall, 3),
                "simulated_requests_per_wall_minute": round(len(done) / wall * 60),
                "hit_rate": round(sum(c.cached_tokens for c in done) / prompt, 4),
                "mean_ttft_seconds": round(sum(c.ttft for c in done) / len(done), 4),
                "mean_e2e_seconds": round(sum(c.e2e for c in done) / len(done), 4),
            }
        )
    )


if __name__ == "__main__":
    main()
