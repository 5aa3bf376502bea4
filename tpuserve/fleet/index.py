"""Which engine holds which prefix block, as the engines' KV events tell the routers.

The engines publish what they cache and evict (`tpuserve.fleet.engines`); the routers read it
to find a prompt's holders (`tpuserve.fleet.routers`). The router's own index
(`tpuserve_router.kv.block_index.BlockIndex`) keys blocks by hashing token pages and keeps
workers as bits of a mask; the fleet model's requests carry block ids, not tokens (a block id
names its whole prefix), so this is the same map over those ids: block -> the engine that
holds it, or the set of them once a second one does (most blocks have one holder; a set for
each would cost time and memory). KV events are applied at once (no event delay).

Why not the router's index itself: `bench/fleet_index_speed.py` measures both on the fleet
hour's requests at 250 engines (2026-12-07: 10.3 against 38.7 us a simulated request, about
30 % more time for the whole model; docs/capacity-planning.md, "Why the model keeps its own
index"), and `tests/unit/bench/test_fleet_index_speed.py` checks that they agree on every
prefix and holder set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

Holders = dict[int, int | set[int]]
"""Block -> the engine that holds it, or the set of them once a second one did. A set stays
a set."""


class KvIndex:
    """The HBM blocks of every engine (``holders``) and, with tiered routing, their host-tier
    blocks (``host_holders``)."""

    __slots__ = ("holders", "host_holders", "tiered")

    def __init__(self, tiered: bool) -> None:
        self.holders: Holders = {}
        self.host_holders: Holders = {}
        self.tiered = tiered
        """``precise`` routes by tier (`decide_tiered`): host-tier blocks are indexed too."""

    def forget(self, engine: int, hbm: Iterable[int], host: Iterable[int]) -> None:
        """``engine`` is gone: its HBM and host blocks are no longer held."""
        for block in hbm:
            unhold(self.holders, block, engine)
        if self.tiered:
            for block in host:
                unhold(self.host_holders, block, engine)


def depth(blocks: tuple[int, ...], has: Callable[[int], bool]) -> int:
    """Leading blocks for which ``has`` holds (binary search: a holder of a block holds its
    parents, since children are evicted first)."""
    lo, hi = 0, len(blocks)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if has(blocks[mid - 1]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def holds(index: Holders | dict[int, set[int]], e: int) -> Callable[[int], bool]:
    """Whether ``e`` holds a block, by ``index``."""

    def has(block: int) -> bool:
        h = index.get(block)
        if isinstance(h, int):
            return h == e
        return h is not None and e in h

    return has


def hold(holders: Holders, block: int, e: int) -> None:
    """``e`` holds ``block``."""
    h = holders.get(block)
    if h is None:
        holders[block] = e
    elif isinstance(h, int):
        if h != e:
            holders[block] = {h, e}
    else:
        h.add(e)


def unhold(holders: Holders, block: int, e: int) -> None:
    """``e`` no longer holds ``block``."""
    h = holders.get(block)
    if isinstance(h, int):
        if h == e:
            del holders[block]
    elif h is not None:
        h.discard(e)
        if not h:
            del holders[block]
