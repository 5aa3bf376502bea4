"""The fleet model routes with the router's own `precise` decision: replaying a recorded trace
one request at a time over four engines, the router's policy (its block index fed as KV events
would feed it) and the fleet model (`FleetSim.choose`, the engines' caches filled as prefills
end) send every request to the same engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes import VirtualClock, fake_request, fake_worker
from tpuserve.fleet import FleetConfig, FleetSim
from tpuserve_router.policies.precise import PrecisePolicy

pytestmark = pytest.mark.unit

TRACE = (
    Path(__file__).resolve().parents[4] / "bench" / "traces" / "mooncake-conversation-small.jsonl"
)
ENGINES = 4
PAGE = 4  # router tokens per trace block: a block id stands for PAGE tokens of its own


def recorded_prompts(limit: int) -> list[tuple[int, ...]]:
    """The trace's first ``limit`` prompts, as block ids (an id names its whole prefix)."""
    lines = TRACE.read_text().splitlines()[:limit]
    return [tuple(json.loads(line)["hash_ids"]) for line in lines]


def test_the_fleet_model_and_the_router_choose_alike_on_a_recorded_trace() -> None:
    policy = PrecisePolicy(clock=VirtualClock(), page_size=PAGE)
    index = policy.block_index
    workers = [fake_worker(f"http://engine-{i}") for i in range(ENGINES)]
    sim = FleetSim(FleetConfig(replicas=ENGINES, router_replicas=1, policy="precise"))
    routed: list[int] = []
    modelled: list[int] = []
    outcomes: list[str] = []
    for blocks in recorded_prompts(80):
        tokens = [b for b in blocks for _ in range(PAGE)]
        decision = policy.choose(fake_request(token_ids=tokens), workers)
        policy.on_prefill_done(decision)
        policy.on_request_done(decision, True)
        name = decision.worker.name
        index.store(name, list(blocks), None, tokens, PAGE)  # the engine's BlockStored
        routed.append(workers.index(decision.worker))
        outcomes.append(decision.outcome)
        engine = sim.choose(blocks, len(blocks) * sim.block)
        sim.cache(engine, blocks)
        modelled.append(engine)
    assert routed == modelled
    # the trace exercises both paths: prefix hits, and misses spread over every engine
    assert "prefix_hit" in outcomes
    assert "miss" in outcomes
    assert len(set(routed)) == ENGINES
