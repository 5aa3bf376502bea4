"""oracle: sees every engine's true cache and queue and picks the lowest predicted TTFT.

For each healthy worker ``w``:

- ``cached(w)`` = the prompt's tokens ``w``'s radix cache holds right now (no side effects);
- ``queued(w)`` = uncached prompt tokens of requests sent to ``w`` whose prefill has not finished
  (booked at routing, released at the first token), i.e. the prefill work ahead of this one;
- ``ttft(w) = prefill_time(queued(w)) + prefill_time(prompt - cached(w), cached(w))
  + decode_step(running(w)) x (1 + MEMORY_PENALTY_STEPS if the KV pool is nearly full)``:
  SGLang runs prefill before decode, so a new request waits for the queued prefills and at most
  the decode step in progress; when the pool is nearly full admission waits for running
  requests to finish, which the penalty approximates.

It picks the minimum (ties: fewest in flight). It is the upper bound the benchmark compares
against: no router can know the caches and queues better; it is greedy, not clairvoyant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from sglang_tpu.perf_model import StepTimer
from tpuserve.bench.anchors.base import AnchorContext, AnchorUnavailable, EngineView
from tpuserve_router.policies.base import (
    Decision,
    NoHealthyWorker,
    Outcome,
    PolicyDefaults,
    RouteRequest,
    W,
)

FULL_POOL_USAGE = 0.9
MEMORY_PENALTY_STEPS = 16


class Oracle(PolicyDefaults):
    needs_tokens: ClassVar[bool] = True

    def __init__(self, engines: Mapping[str, EngineView], timer: StepTimer) -> None:
        self.engines = engines
        self.timer = timer
        self._queued: dict[str, int] = {}

    def predicted_ttft(self, name: str, prompt: int, cached: int) -> float:
        engine = self.engines[name]
        timer = self.timer
        queued = self._queued.get(name, 0)
        wait = timer.step_seconds(prefill_tokens=queued) if queued else 0.0
        own = timer.prefill_seconds(prompt - cached, cached)
        running = engine.num_running
        decode = timer.decode_step_seconds(running, running * 1024) if running else 0.0
        if engine.token_usage >= FULL_POOL_USAGE:
            decode *= 1 + MEMORY_PENALTY_STEPS
        return wait + own + decode

    def choose(self, request: RouteRequest, workers: Sequence[W]) -> Decision[W]:
        healthy = [w for w in workers if w.healthy]
        if not healthy:
            raise NoHealthyWorker(request.model)
        tokens = request.token_ids or ()
        prompt = len(tokens)
        cached = [self.engines[w.name].match_prefix_length(tokens) for w in healthy]
        costs = [
            self.predicted_ttft(w.name, prompt, c) for w, c in zip(healthy, cached, strict=True)
        ]
        i = min(range(len(healthy)), key=lambda k: (costs[k], healthy[k].in_flight))
        target = healthy[i]
        uncached = prompt - cached[i]
        self._queued[target.name] = self._queued.get(target.name, 0) + uncached
        best = max(cached)
        outcome: Outcome = (
            "miss" if best == 0 else ("prefix_hit" if cached[i] == best else "balanced_away")
        )
        return Decision(
            target, outcome, predicted_match_ratio=cached[i] / prompt if prompt else 0.0,
            prompt_units=prompt, pending_units=uncached,
        )  # fmt: skip

    def on_prefill_done(self, decision: Decision[Any]) -> None:
        if decision.pending_units:
            name = decision.worker.name
            self._queued[name] = max(0, self._queued.get(name, 0) - decision.pending_units)
            decision.pending_units = 0

    def on_request_done(self, decision: Decision[Any], succeeded: bool) -> None:
        self.on_prefill_done(decision)


def make(ctx: AnchorContext) -> Oracle:
    if ctx.engines is None:
        raise AnchorUnavailable("oracle reads the engines' caches and queues: sim mode only")
    return Oracle(ctx.engines, ctx.timer)
