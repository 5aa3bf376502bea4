#!/usr/bin/env python3
"""Where the engines' time goes in one `tpuserve bench` sim run (docs/host-kv-tier.md, *Why
the tier gains little*): the engine twin's steps summed over the fleet.

  bench/host_tier_anatomy.py -- bench --workload W7 --tpu v5e --topology 2x2 \\
      --cache-tokens 19776 --rate 6.207 --policy precise [--host-cache-tokens 262144] --json

Runs the command in this process (`tpuserve.cli.main`) with `EngineCore`'s step builders
wrapped, prints the command's own output, then one JSON line on stderr: prefill seconds (load
back included), load-back seconds, what the loaded-back tokens would have cost to prefill
(``prefill_seconds(tokens) - prefill_seconds(0)`` per step), decode seconds, the mean decode
batch, tokens computed / cached / loaded back, and each request's wait from arrival to its
first prefill step (p50, p90, p99).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

from sglang_tpu.sim import engine as sim_engine
from sglang_tpu.sim.engine import EngineCore, Step


def main(argv: list[str]) -> int:
    totals: Counter[str] = Counter()
    seconds: dict[str, float] = {"prefill": 0.0, "load_back": 0.0, "host_prefill": 0.0,
                                 "decode": 0.0}  # fmt: skip
    waits: list[float] = []
    prefill_step = EngineCore._prefill_step
    form_decode = EngineCore._form_decode

    def counted_prefill(self: EngineCore, now: float, items: Any, *args: Any) -> Step:
        step = prefill_step(self, now, items, *args)
        seconds["prefill"] += step.duration
        seconds["load_back"] += step.load_back_seconds
        if step.prefill_host_tokens:
            timer = self.timer
            seconds["host_prefill"] += timer.prefill_seconds(
                step.prefill_host_tokens
            ) - timer.prefill_seconds(0)
        totals["prefill_steps"] += 1
        totals["compute_tokens"] += step.prefill_compute_tokens
        totals["cached_tokens"] += step.prefill_cached_tokens
        totals["host_tokens"] += step.prefill_host_tokens
        for req, _ in items:
            if req.schedule_time == now:  # its first prefill step (set when scheduled)
                waits.append(now - req.arrival_time)
        return step

    def counted_decode(self: EngineCore, now: float) -> Step | None:
        step = form_decode(self, now)
        if step is not None:
            seconds["decode"] += step.duration
            totals["decode_steps"] += 1
            totals["decode_sequences"] += len(step.decode)
        return step

    sim_engine.EngineCore._prefill_step = counted_prefill  # type: ignore[method-assign,assignment]
    sim_engine.EngineCore._form_decode = counted_decode  # type: ignore[method-assign]
    from tpuserve.cli import main as tpuserve

    rc = tpuserve(argv)
    waits.sort()

    def wait(q: float) -> float:
        return round(waits[min(len(waits) - 1, int(q * len(waits)))], 3) if waits else 0.0

    steps = totals["decode_steps"]
    report = {
        **{f"{k}_seconds": round(v, 1) for k, v in seconds.items()},
        **totals,
        "mean_decode_batch": round(totals["decode_sequences"] / steps, 2) if steps else 0.0,
        "wait_p50": wait(0.5),
        "wait_p90": wait(0.9),
        "wait_p99": wait(0.99),
    }
    print(json.dumps(report), file=sys.stderr)
    return rc


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(args[1:] if args[:1] == ["--"] else args))
