"""The fleet model's routers: replicas that poll, peer and decide by the router's own rules.

``router_replicas`` routers; each request goes to one at random. A router knows exactly what
it sent (its own in-flight counts and booked prefill tokens) and what the other routers put
on each engine as of its last load poll (every ``load_poll_seconds``, phase ``r / N``), as
``tpuserve router`` does with ``/v1/loads``; what a policy sees is the router's load-view
rule (`tpuserve_router.engines.load_view.seen_load`). With ``peer_delay_seconds`` the
``precise`` routers peer as ``tpuserve router --peer-port`` replicas do
(`tpuserve_router.peering.peer_view`): each decision, first token and end reaches every
other router that much later, and it applies it as if it had routed the request itself: +1
in flight on the engine (-1 at the end), the booked prefill tokens (released at the first
token) and the decision's predicted blocks (for ``PRECISE.predicted_ttl_seconds``).

Prefix holders come from the index of what the engines hold (`tpuserve.fleet.index`); the
llm-d anchor keeps its own per-router approximate index instead (filled at routing time, as
llm-d's EPP does). A decision scores at most ``holder_candidates`` engines among those
holding the prompt's longest cached prefix plus ``random_candidates`` drawn at random; a
fleet of no more routable replicas than that is scored whole, in order, as the router
scores its workers. Policies (`FLEET_POLICIES`):

- ``round_robin``: each router cycles over the routable replicas on its own;
- ``precise``: tpuserve's default policy's own decision (`tpuserve_router.policies.precise`'s
  `decide`, or `decide_tiered` once engines hold host-tier blocks, with `PreciseParams`'
  defaults) over the candidates, with predicted blocks for ``predicted_ttl_seconds``;
- ``llmd``: llm-d's scorer configuration for SGLang (prefix-cache-scorer 2 : queue-scorer 1,
  max-score picker) over an approximate per-router index and the pods' waiting queues as of
  the last scrape;
- ``oracle``: the true caches and queues, lowest predicted TTFT
  (`tpuserve.bench.anchors.oracle`'s rule), over a candidate set twice as large.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict, deque
from dataclasses import replace

from tpuserve.fleet.config import FleetConfig
from tpuserve.fleet.engines import Engines
from tpuserve.fleet.events import Clock
from tpuserve.fleet.index import KvIndex, depth, holds
from tpuserve.fleet.request import Request
from tpuserve_router.engines.load_view import seen_load
from tpuserve_router.policies.precise import PreciseParams, decide, decide_tiered

LLMD_PREFIX_WEIGHT = 2.0
LLMD_QUEUE_WEIGHT = 1.0
"""llm-d's scorer weights for SGLang (prefix-cache-scorer 2 : queue-scorer 1)."""
PRECISE = PreciseParams()
"""The ``precise`` routers' parameters: the router's defaults."""
PREDICTED_BLOCKS = 4
"""The precise model predicts at most this many blocks past the index's match (the router
predicts the whole prompt; siblings of a burst share the first new block)."""
ORACLE_FULL_POOL = 0.9
ORACLE_MEMORY_PENALTY_STEPS = 16
"""`tpuserve.bench.anchors.oracle`'s constants."""


class RouterReplica:
    """What one router replica knows: its own counts (and its peers' announced ones), the
    last poll's numbers, its predictions and the llm-d anchor's index."""

    __slots__ = ("booked", "cursor", "llmd_index", "llmd_lru", "own", "pred", "pred_queue",
                 "room", "rr", "snap_booked", "snap_load", "snap_own", "snap_wait",
                 "snap_wtok")  # fmt: skip

    def __init__(self, slots: int) -> None:
        self.own = [0] * slots
        self.room = [0] * slots  # prompt tokens in flight per engine (`precise.HbmRoom`)
        self.booked = [0] * slots
        self.snap_load = [0] * slots
        self.snap_own = [0] * slots
        self.snap_wait = [0] * slots
        self.snap_wtok = [0] * slots
        self.snap_booked = [0] * slots
        self.rr = 0
        self.cursor = 0  # `decide`'s, among equally loaded, equally full candidates
        self.pred: dict[int, tuple[int, float]] = {}
        self.pred_queue: deque[tuple[float, tuple[int, ...], int]] = deque()
        self.llmd_index: dict[int, set[int]] = {}
        self.llmd_lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(slots)]


class Routers:
    """The router replicas in front of ``engines``; ``rng`` draws routers and candidates."""

    def __init__(
        self,
        config: FleetConfig,
        clock: Clock,
        rng: random.Random,
        engines: Engines,
        index: KvIndex,
    ) -> None:
        c = self.config = config
        self.clock = clock
        self.rng = rng
        self.engines = engines
        self.index = index
        self.block = c.block_tokens
        timer = engines.timer
        self.tier_params = replace(PRECISE, host_hit_weight=round(timer.host_hit_value(), 3))
        # Linear prefill cost for the oracle's estimate: tokens and attention context.
        self.prefill_per_token = timer._body_flops_per_token / timer.flops_per_second
        self.prefill_per_attention = timer._attn_flops_per_ctx / timer.attention_flops_per_second
        self.k_held = c.holder_candidates
        self.k_random = c.random_candidates * (2 if c.policy == "oracle" else 1)
        self.replicas = [RouterReplica(c.replicas) for _ in range(c.router_replicas)]
        self.peering = (
            c.peer_delay_seconds is not None and c.router_replicas > 1 and c.policy == "precise"
        )
        self.peer_delay = c.peer_delay_seconds or 0.0
        self.peers_of = [[p for p in self.replicas if p is not r] for r in self.replicas]
        self.peer_messages: deque[tuple[float, int, int, int, int, int, tuple[int, ...]]] = deque()
        """(delivery time, sending router, engine, in flight +-1, booked tokens +-, prompt tokens
        in flight +- (HBM room), predicted blocks): the peering messages on their way, in the
        order sent (one delay: in time)."""
        self.predicted: tuple[int, ...] = ()  # the decision's predicted blocks (`_predict`)

    # --- polls and peering ----------------------------------------------------------------

    def poll(self, r: int) -> None:
        """Router ``r`` polls every engine's load (``/v1/loads``)."""
        router = self.replicas[r]
        if self.peering:
            self.deliver_peer_messages()
        engines = self.engines
        router.snap_load = engines.load[:]
        router.snap_wait = engines.wait[:]
        router.snap_wtok = engines.wtok[:]
        router.snap_own = router.own[:]
        router.snap_booked = router.booked[:]

    def _send_peers(
        self, r: int, e: int, in_flight: int, booked: int, predicted: tuple[int, ...], room: int
    ) -> None:
        """Router ``r`` publishes a decision (``in_flight`` +1, its booked tokens, predicted
        blocks and prompt tokens), a first token (the booking released) or an end (-1)."""
        self.peer_messages.append(
            (self.clock.now + self.peer_delay, r, e, in_flight, booked, room, predicted)
        )

    def deliver_peer_messages(self) -> None:
        """Every router applies its peers' messages due by now (`peer_view.PeerView.apply`)."""
        queue = self.peer_messages
        now = self.clock.now
        peers_of = self.peers_of
        while queue and queue[0][0] <= now:
            at, r, e, in_flight, booked, room, predicted = queue.popleft()
            if predicted:
                expiry = at + PRECISE.predicted_ttl_seconds
                entry = (e, expiry)
                for router in peers_of[r]:
                    router.own[e] += in_flight
                    router.booked[e] += booked
                    router.room[e] += room
                    pred = router.pred
                    for b in predicted:
                        pred[b] = entry
                    router.pred_queue.append((expiry, predicted, e))
            else:
                for router in peers_of[r]:
                    router.own[e] += in_flight
                    router.booked[e] += booked
                    router.room[e] += room

    # --- one request ----------------------------------------------------------------------

    def send(self, req: Request) -> int:
        """A router drawn at random decides where ``req`` goes and books it there (and tells
        its peers); the engine it chose."""
        replicas = self.replicas
        r = int(self.rng.random() * len(replicas)) if len(replicas) > 1 else 0
        router = replicas[r]
        req.router = r
        peering = self.peering
        if peering:
            self.deliver_peer_messages()
            self.predicted = ()
        target, hit = self.route(router, req)
        req.engine = target
        req.booked = max(0, req.prompt - hit)
        router.own[target] += 1
        router.booked[target] += req.booked
        router.room[target] += req.prompt
        if peering:
            self._send_peers(r, target, 1, req.booked, self.predicted, req.prompt)
        return target

    def release(self, req: Request, first: bool) -> None:
        """The router hears the first token (``first``) or the end of ``req``."""
        router = self.replicas[req.router]
        booked = req.booked
        if first and booked:
            router.booked[req.engine] -= booked
            req.booked = 0
            if self.peering:
                self._send_peers(req.router, req.engine, 0, -booked, (), 0)
        if not first:
            if booked:
                router.booked[req.engine] -= booked
                req.booked = 0
            router.own[req.engine] -= 1
            router.room[req.engine] -= req.prompt
            if self.peering:
                self._send_peers(req.router, req.engine, -1, -booked, (), -req.prompt)

    def forget_engine(self, e: int) -> None:
        """Engine ``e`` is gone: the llm-d anchor's index drops what it sent there."""
        for router in self.replicas:
            lru = router.llmd_lru[e]
            for block in lru:
                h = router.llmd_index.get(block)
                if h is not None:
                    h.discard(e)
            lru.clear()

    def route(self, router: RouterReplica, req: Request) -> tuple[int, int]:
        """The engine ``router`` sends ``req`` to by the configured policy, and the prompt
        tokens it expects cached there."""
        policy = self.config.policy
        if policy == "round_robin":
            router.rr += 1
            ready = self.engines.ready
            return ready[router.rr % len(ready)], 0
        if policy == "precise":
            return self._precise(router, req)
        if policy == "llmd":
            return self._llmd(router, req)
        return self._oracle(req)

    def _candidates(self, holders: int | set[int] | None) -> tuple[list[int], list[int]]:
        """(holder candidates, all candidates) among the routable replicas. When there are
        no more of them than candidates, all, in order (the holders among them too)."""
        ready = self.engines.ready
        ready_pos = self.engines.ready_pos
        rand = self.rng.random
        held: list[int] = []
        k_held = self.k_held
        n = len(ready)
        if n <= k_held + self.k_random:
            if isinstance(holders, int):
                held = [holders] if holders in ready_pos else []
            elif holders:
                held = [e for e in ready if e in holders]
            return held, ready[:]
        if isinstance(holders, int):
            if holders in ready_pos:
                held = [holders]
        elif holders:
            if len(holders) <= 2 * k_held:
                held = [h for h in holders if h in ready_pos]
                if len(held) > k_held:
                    held = self.rng.sample(held, k_held)
            else:  # many holders: draw replicas at random until k of them hold it
                for _ in range(4 * k_held):
                    x = ready[int(rand() * n)]
                    if x in holders and x not in held:
                        held.append(x)
                        if len(held) == k_held:
                            break
        cands = held[:]
        seen = set(held)
        for _ in range(min(self.k_random, n)):
            x = ready[int(rand() * n)]
            if x not in seen:
                seen.add(x)
                cands.append(x)
        return held, cands

    # --- precise (tpuserve's default) -----------------------------------------------------

    def _precise(self, router: RouterReplica, req: Request) -> tuple[int, int]:
        blocks = req.blocks
        holders = self.index.holders
        now = self.clock.now
        pred = router.pred
        queue = router.pred_queue
        while queue and queue[0][0] <= now:
            expiry, old, e = queue.popleft()
            for b in old:
                if pred.get(b) == (e, expiry):
                    del pred[b]
        lo, hi = 0, len(blocks)  # `index.depth` over the index, inline (once per request)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if blocks[mid - 1] in holders:
                lo = mid
            else:
                hi = mid - 1
        d = pdepth = lo
        if self.index.tiered and self.index.host_holders:
            return self._precise_tiered(router, req, d)
        while pdepth < len(blocks) and pdepth - d < PREDICTED_BLOCKS and blocks[pdepth] in pred:
            pdepth += 1
        if pdepth > d:
            e = pred[blocks[pdepth - 1]][0]
            if e in self.engines.ready_pos:
                hit = pdepth * self.block
                self._predict(router, blocks, d, e)
                return e, min(hit, req.prompt)
        held, cands = self._candidates(holders.get(blocks[d - 1]) if d else None)
        loads, queued = self._view(router, cands)
        engines = self.engines.engines
        cached = [len(engines[e].cache) for e in cands]  # what their KV events reported
        heldset = set(held)
        depths = [d if e in heldset else 0 for e in cands]
        i, _, router.cursor = decide(
            depths, self.block, req.prompt, loads, cached, queued, router.cursor, PRECISE
        )
        chosen = cands[i]
        self._predict(router, blocks, d, chosen)
        return chosen, min(depths[i] * self.block, req.prompt)

    def _view(self, router: RouterReplica, cands: list[int]) -> tuple[list[int], list[int]]:
        """Each candidate's requests in flight and queued prefill tokens as ``router`` sees
        them: the router's load-view rule over its counts and its last poll."""
        own, snap_load, snap_own = router.own, router.snap_load, router.snap_own
        booked, snap_wtok, snap_booked = router.booked, router.snap_wtok, router.snap_booked
        loads = [seen_load(own[e], snap_load[e], snap_own[e]) for e in cands]
        queued = [seen_load(booked[e], snap_wtok[e], snap_booked[e]) for e in cands]
        return loads, queued

    def _precise_tiered(self, router: RouterReplica, req: Request, d: int) -> tuple[int, int]:
        """`_precise` once some engine holds host-tier blocks: `decide_tiered` over each
        candidate's prefix as the router's index holds it (`BlockIndex.route`): its HBM blocks
        and the blocks predicted on it (``device``), then also its host blocks (``depths``),
        with ``d`` the longest HBM prefix any engine holds. Predictions count as the router
        counts them (in the depths, not as a shortcut), so HBM room decides a predicted
        holder too."""
        blocks = req.blocks
        n = len(blocks)
        host_holders = self.index.host_holders
        pred = router.pred
        reach = d  # the longest prefix any tier holds, for the holder candidates
        while reach < n and blocks[reach] in host_holders:
            reach += 1
        if reach > d:
            source = host_holders.get(blocks[reach - 1])
        else:
            source = self.index.holders.get(blocks[d - 1]) if d else None
        _, cands = self._candidates(source)
        p = pred.get(blocks[d]) if d < n else None
        if p is not None and p[0] not in cands and p[0] in self.engines.ready_pos:
            cands[-1] = p[0]  # the engine a burst's sibling went to
        engines = self.engines.engines
        device: list[int] = []
        depths: list[int] = []
        for e in cands:
            eng = engines[e]
            cache = eng.cache
            lo, hi = 0, n if cache else 0  # HBM is prefix-closed: a binary search
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if blocks[mid - 1] in cache:
                    lo = mid
                else:
                    hi = mid - 1
            host = eng.host
            while (  # a prediction stands for a block the engine holds in no tier
                lo < n
                and (p := pred.get(blocks[lo])) is not None
                and p[0] == e
                and blocks[lo] not in host
            ):
                lo += 1
            device.append(lo)
            while lo < n and (
                blocks[lo] in host or ((p := pred.get(blocks[lo])) is not None and p[0] == e)
            ):
                lo += 1
            depths.append(lo)
        loads, queued = self._view(router, cands)
        # what their KV events reported, in any tier (`BlockIndex`'s count per worker)
        cached = [len(engines[e].cache) + len(engines[e].host) - engines[e].both for e in cands]
        pool = self.engines.pool
        room = [pool - router.room[e] for e in cands]
        block = self.block
        i, _, router.cursor = decide_tiered(
            depths, device, block, req.prompt, loads, cached, queued, room, router.cursor,
            self.tier_params,
        )  # fmt: skip
        chosen = cands[i]
        self._predict(router, blocks, d, chosen)
        return chosen, min(depths[i] * block, req.prompt)

    def _predict(self, router: RouterReplica, blocks: tuple[int, ...], d: int, e: int) -> None:
        """Predict the first `PREDICTED_BLOCKS` blocks beyond what the index holds on ``e``
        (what a burst of siblings shares) for ``PRECISE.predicted_ttl_seconds``."""
        predicted = blocks[d : d + PREDICTED_BLOCKS]
        if not predicted:
            return
        expiry = self.clock.now + PRECISE.predicted_ttl_seconds
        entry = (e, expiry)
        pred = router.pred
        for b in predicted:
            pred[b] = entry
        router.pred_queue.append((expiry, predicted, e))
        self.predicted = predicted

    # --- anchors: llm-d's scorers, the oracle ---------------------------------------------

    def _llmd(self, router: RouterReplica, req: Request) -> tuple[int, int]:
        blocks = req.blocks
        index = router.llmd_index
        d = depth(blocks, lambda b: bool(index.get(b)))
        held, cands = self._candidates(index.get(blocks[d - 1]) if d else None)
        n = len(blocks)
        waits = [router.snap_wait[e] for e in cands]
        qmax, qmin = max(waits), min(waits)
        best = -1.0
        chosen = cands[0]
        chosen_depth = 0
        heldset = set(held)
        rng = self.rng
        for e, q in zip(cands, waits, strict=True):
            if e in heldset:
                de = d
            elif d:
                de = depth(blocks[:d], holds(index, e))
            else:
                de = 0
            qs = 1.0 if qmax == qmin else (qmax - q) / (qmax - qmin)
            score = LLMD_PREFIX_WEIGHT * de / n + LLMD_QUEUE_WEIGHT * qs + rng.random() * 1e-9
            if score > best:
                best, chosen, chosen_depth = score, e, de
        lru = router.llmd_lru[chosen]
        cap = self.engines.pool // self.block
        for b in reversed(blocks):  # PreRequest: the chosen pod's blocks, parents freshest
            if b in lru:
                lru.move_to_end(b)
            else:
                lru[b] = None
                index.setdefault(b, set()).add(chosen)
        while len(lru) > cap:
            old, _ = lru.popitem(last=False)
            h = index.get(old)
            if h is not None:
                h.discard(chosen)
                if not h:
                    del index[old]
        return chosen, min(chosen_depth * self.block, req.prompt)

    def _oracle(self, req: Request) -> tuple[int, int]:
        blocks = req.blocks
        holders = self.index.holders
        d = depth(blocks, holders.__contains__)
        held, cands = self._candidates(holders.get(blocks[d - 1]) if d else None)
        heldset = set(held)
        prompt = req.prompt
        per_tok = self.prefill_per_token
        per_att = self.prefill_per_attention
        unit = self.engines
        decode_a = unit.decode_a
        pool = unit.pool
        best = math.inf
        chosen = cands[0]
        chosen_hit = 0
        for e in cands:
            eng = unit.engines[e]
            if e in heldset:
                de = d
            elif d:
                de = depth(blocks[:d], holds(holders, e))
            else:
                de = 0
            cached = min(de * self.block, prompt - 1)
            new = prompt - cached
            queued = unit.wtok[e]
            ttft = (queued + new) * per_tok + per_att * new * (cached + new / 2)
            ttft += decode_a[min(len(eng.run), len(decode_a) - 1)] * (
                1 + (ORACLE_MEMORY_PENALTY_STEPS if eng.reserved > ORACLE_FULL_POOL * pool
                     else 0)
            )  # fmt: skip
            if ttft < best or (ttft == best and unit.load[e] < unit.load[chosen]):
                best, chosen, chosen_hit = ttft, e, cached
        return chosen, chosen_hit
