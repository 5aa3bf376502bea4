"""The fleet model routes with the router's own `precise` decision: replaying a recorded trace
one request at a time over four engines, the router's policy (its block index fed as KV events
would feed it) and the fleet model (`FleetSim.choose`, the engines' caches filled as prefills
end) send every request to the same engine."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.fakes import VirtualClock, fake_request, fake_worker
from tpuserve.fleet import FleetConfig, FleetSim
from tpuserve_router.policies.precise import PreciseParams, PrecisePolicy

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


@pytest.mark.parametrize("host_load_factor", [PreciseParams.host_load_factor, 1e9])
def test_the_fleet_model_and_the_router_choose_alike_with_a_host_tier(
    host_load_factor: float,
) -> None:
    """The same replay with small HBM pools (40 blocks) and a host tier on each engine: the
    engines demote what leaves HBM to host memory, the router hears it as SGLang's events
    (``BlockStored``/``BlockRemoved`` with medium ``CPU_PINNED`` or ``GPU``), and requests
    stay in flight for three more arrivals so HBM room (step 5) counts. Both route by tier
    (`decide_tiered`): same engine for every request, host hits included, with the tiered
    choice's load bound (``host_load_factor``) and without it. Arrivals are
    spaced past the predictions' lifetime: the router counts its predictions per worker (in
    its depths and its cached-block tie-break) where the fleet model keeps one engine per
    predicted block, so with live predictions the two may break a tie differently."""
    _, host_hits = replay_with_a_host_tier(host_load_factor)
    assert host_hits > 0  # the replay routes prefixes held only in host memory


def test_the_load_bound_changes_the_replay() -> None:
    """The replay above exercises the bound: without it some request goes elsewhere."""
    assert (
        replay_with_a_host_tier(PreciseParams.host_load_factor)[0]
        != (replay_with_a_host_tier(1e9)[0])
    )


def replay_with_a_host_tier(host_load_factor: float) -> tuple[list[int], int]:
    """The host-tier replay (the test above): the engines the router chose (asserted equal
    to the fleet model's), and how many requests it routed to a host hit."""
    sim = FleetSim(FleetConfig(replicas=ENGINES, router_replicas=1, policy="precise",
                               host_cache_tokens=400 * 512))  # fmt: skip
    sim.slots.pool = 40 * sim.block  # small HBM, so prompts are demoted and come back from host
    sim.routing.tier_params = replace(sim.routing.tier_params, host_load_factor=host_load_factor)
    weight = sim.routing.tier_params.host_hit_weight
    clock = VirtualClock()
    page = sim.block  # the router's pages as long as the model's blocks: tokens compare alike
    policy = PrecisePolicy(clock=clock, page_size=page, host_hit_weight=weight,
                           host_load_factor=host_load_factor)  # fmt: skip
    index = policy.block_index
    workers = [fake_worker(f"http://engine-{i}") for i in range(ENGINES)]
    for w in workers:
        index.set_worker_limit(w.name, sim.slots.pool // sim.block)
    prompts = recorded_prompts(150)
    parent: dict[int, int | None] = {}
    position: dict[int, int] = {}
    for blocks in prompts:
        for i, b in enumerate(blocks):
            parent[b] = blocks[i - 1] if i else None
            position[b] = i
    known: list[dict[str, set[int]]] = [{"GPU": set(), "CPU_PINNED": set()} for _ in workers]

    def publish() -> None:
        """Each engine's changes since the last call, as KV events in an engine's order:
        demotions (host copies stored, then the HBM copies removed), host evictions, then the
        new HBM blocks (parents before children)."""
        for e, engine in enumerate(sim.engines[:ENGINES]):
            name = workers[e].name
            now = {"GPU": set(engine.cache), "CPU_PINNED": set(engine.host)}
            was = known[e]
            stored = {m: sorted(now[m] - was[m], key=position.__getitem__) for m in now}
            removed = {m: sorted(was[m] - now[m]) for m in now}
            for b in stored["CPU_PINNED"]:
                index.store(name, [b], parent[b], [b] * page, page, 0, "CPU_PINNED")
            for medium in ("GPU", "CPU_PINNED"):
                if removed[medium]:
                    index.remove(name, removed[medium], 0, medium)
            for b in stored["GPU"]:
                index.store(name, [b], parent[b], [b] * page, page, 0, "GPU")
            known[e] = now

    in_flight: list[tuple[object, int, int]] = []  # (decision, engine, fleet prompt tokens)
    router = sim.routers[0]
    routed: list[int] = []
    modelled: list[int] = []
    host_hits = 0
    for blocks in prompts:
        # past the last decision's predictions (they stand in for blocks not yet reported;
        # here every prefill's blocks are reported before the next arrival)
        clock.advance(2 * sim.routing.tier_params.predicted_ttl_seconds)
        sim.now += 2 * sim.routing.tier_params.predicted_ttl_seconds
        if len(in_flight) > 3:
            decision, e, held = in_flight.pop(0)
            policy.on_request_done(decision, True)  # type: ignore[arg-type]
            workers[e].in_flight -= 1
            router.own[e] -= 1
            router.room[e] -= held
        tokens = [b for b in blocks for _ in range(page)]
        decision = policy.choose(fake_request(token_ids=tokens), workers)
        policy.on_prefill_done(decision)
        chosen = workers.index(decision.worker)
        host_hits += decision.predicted_host_ratio > 0
        prompt = len(blocks) * sim.block
        engine = sim.choose(blocks, prompt)
        routed.append(chosen)
        modelled.append(engine)
        workers[chosen].in_flight += 1
        router.own[engine] += 1
        router.room[engine] += prompt
        in_flight.append((decision, chosen, prompt))
        sim.cache(engine, blocks)
        publish()
    assert routed == modelled
    assert index.host_only_blocks > 0
    return routed, host_hits
