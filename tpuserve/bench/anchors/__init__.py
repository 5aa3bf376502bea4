"""Routing policies the benchmark compares tpuserve against, by name, and `make_bench_policy`.

Every name `policy_names()` lists can be benchmarked: tpuserve's own policies (the router's
registry, built exactly as ``tpuserve router --policy NAME`` builds them) and the anchors
below, re-implemented from their published code (reference router.md §3-§4).
"""

from __future__ import annotations

from collections.abc import Mapping

from tpuserve.bench.anchors import dynamo_cost, gie_approx, oracle, preble_e2, sglang_cache_aware
from tpuserve.bench.anchors.base import (
    Anchor,
    AnchorContext,
    AnchorFactory,
    AnchorUnavailable,
    EngineView,
)
from tpuserve.bench.anchors.sglang_cache_aware import CLI_DEFAULTS, STRUCT_DEFAULTS
from tpuserve_router.policies.base import Policy, make_policy, registered_policy_names


def _anchor(name: str, summary: str, factory: AnchorFactory, engines: bool = False) -> Anchor:
    return Anchor(name, summary, factory, engines)


ANCHORS: Mapping[str, Anchor] = {
    a.name: a
    for a in (
        _anchor("sglang_cache_aware_v2", "sglang-router cache_aware, least-load miss path, CLI "
                "defaults", sglang_cache_aware.factory("least_load", CLI_DEFAULTS,
                                                       "sglang_cache_aware_v2")),
        _anchor("sglang_cache_aware_v2_struct", "as v2 with the Rust struct defaults",
                sglang_cache_aware.factory("least_load", STRUCT_DEFAULTS,
                                           "sglang_cache_aware_v2_struct")),
        _anchor("sglang_cache_aware_v1", "sglang-router cache_aware, smallest-tree miss path, "
                "CLI defaults", sglang_cache_aware.factory("smallest_tree", CLI_DEFAULTS,
                                                           "sglang_cache_aware_v1")),
        _anchor("sglang_cache_aware_v1_struct", "as v1 with the Rust struct defaults",
                sglang_cache_aware.factory("smallest_tree", STRUCT_DEFAULTS,
                                           "sglang_cache_aware_v1_struct")),
        _anchor("gie_approx", "llm-d EPP default profile, approximate prefix scorer",
                gie_approx.make, engines=True),
        _anchor("dynamo_cost", "Dynamo KV router cost, overlap weight 1", dynamo_cost.factory(1.0)),
        _anchor("dynamo_cost_w0", "Dynamo cost, overlap weight 0", dynamo_cost.factory(0.0)),
        _anchor("dynamo_cost_w0.5", "Dynamo cost, overlap weight 0.5", dynamo_cost.factory(0.5)),
        _anchor("dynamo_cost_w2", "Dynamo cost, overlap weight 2", dynamo_cost.factory(2.0)),
        _anchor("preble_e2", "Preble E2 (exploit / explore / rebalance)", preble_e2.make),
        _anchor("oracle", "true caches and queues, lowest predicted TTFT", oracle.make,
                engines=True),
    )
}  # fmt: skip


def policy_names() -> list[str]:
    """tpuserve's policies, then the anchors."""
    return [*registered_policy_names(), *ANCHORS]


def make_bench_policy(name: str, ctx: AnchorContext) -> Policy:
    """Build `name` (a tpuserve policy or an anchor); ValueError naming the allowed names."""
    if name == "precise":  # host-tier blocks weighed for the fleet's slice and model
        weight = round(ctx.timer.host_hit_value(), 3)
        return make_policy(name, clock=ctx.clock, seed=ctx.seed, host_hit_weight=weight)
    if name in registered_policy_names():
        return make_policy(name, clock=ctx.clock, seed=ctx.seed)
    anchor = ANCHORS.get(name)
    if anchor is None:
        raise ValueError(f"--policy: {name!r} is not allowed; allowed: {', '.join(policy_names())}")
    policy: Policy = anchor.factory(ctx)
    return policy


__all__ = [
    "ANCHORS",
    "Anchor",
    "AnchorContext",
    "AnchorUnavailable",
    "EngineView",
    "make_bench_policy",
    "policy_names",
]
