"""Mode sim: a routing policy in front of N engine twins, all in-process on one virtual clock.

The engines are the engine twin's own core (`sglang_tpu.sim.engine.EngineCore` driven by its
`VirtualEngine`), not a copy; the policies are the router's policy objects (or the anchors),
called exactly as the router calls them:

- at each arrival every engine is advanced to that instant, the hooks of what happened
  meanwhile are delivered (``on_prefill_done`` at a request's first token,
  ``on_request_done`` when it finishes), then ``choose`` runs with the virtual clock set to
  the arrival time and the router's in-flight counts;
- a policy that keeps a `BlockIndex` (``precise``, ``cost``, the Dynamo anchor) gets every
  engine's KV events as they are emitted (optionally dropping a share of batches, W8e);
- faults (W8c/d): ``restart`` fails the worker's in-flight requests, keeps it unroutable for
  ``restart_down_seconds`` and brings back a fresh engine (empty cache; a KV-event-fed index is
  cleared, as the router does when the engine's sequence numbers restart); ``flush`` drains
  the worker (unroutable until its running requests finish, because SGLang refuses
  ``/flush_cache`` while requests run), then flushes its cache (``AllBlocksCleared`` reaches an
  event-fed index) and makes it routable again. Either way the policy is not told (the fault
  happened at the engine, not through the router). ``SimResult.faults`` records when each
  faulted engine served again.

With ``router_replicas`` N > 1 the policy runs as N router replicas behind one Service: each
request goes to one of them at random, each keeps its own policy state (trees, predictions,
prefill queues) and its own in-flight counts (a router knows only what it sent), and each
subscribes to every engine's KV events. A tpuserve policy (not an anchor: sglang-router and the
others keep their own counts only) also polls every engine's load every ``load_poll_seconds``
as ``tpuserve router --load-poll-interval`` does, replica ``r`` at phase ``r / N`` of the
interval (and, as the router, waiting longer while its polls find nothing beyond its own
counts: `tpuserve_router.engines.load_view.next_poll_gap`), and sees its own in-flight
requests and prefill plus what the others put there as of its last poll
(`tpuserve_router.engines.load_view.set_peer_load`, the router's own rule; the engine
answers with its running and waiting requests and its uncached waiting prompt tokens, as
``/v1/loads`` does). With ``peer_delay_seconds`` set, a tpuserve policy's replicas also peer as
``tpuserve router --peer-port`` does: each announces its decisions, first tokens and ends
through the router's own `PeerLink`, and every other replica applies them through the router's
own `PeerView` that many seconds after the event (None: no peering, the poll alone). With
``kv_event_interval_seconds`` set, a replica's index gets an engine's KV events at its next
read of them, as the router reads busy streams every
`tpuserve_router.kv.kv_events.READ_INTERVAL_SECONDS` (0: at once).

Every request of the trace runs as its own request, whatever its id (the engines see the
request's position in the trace), and one that fails carries its reason in
``RequestRecord.error`` (`sim_config.FAILURE_REASONS`).

`measure_rr_saturation` gives mu_RR: round-robin's throughput when the whole trace arrives at
once (requests per virtual second).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sglang_tpu.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from sglang_tpu.sim.engine import EngineConfig, EngineCore
from sglang_tpu.sim.output_text import OutputPalette
from sglang_tpu.sim.request import Request
from sglang_tpu.sim.virtual_clock import VirtualEngine
from sglang_tpu.tokenizer import Tokenizer, load_tokenizer
from tpuserve.bench.anchors import AnchorContext, make_bench_policy
from tpuserve.bench.report import LoadSamples, RequestRecord
from tpuserve.bench.sim_config import Fault, SimConfig, SimResult, make_timer
from tpuserve.bench.traces import TraceRequest, token_ids_of
from tpuserve_router.config import RouterConfig
from tpuserve_router.engines.load_view import next_poll_gap, set_peer_load
from tpuserve_router.kv.block_index import BlockIndex
from tpuserve_router.peering.peer_view import PeerLink, PeerMessage, PeerView
from tpuserve_router.pipeline.request_body import parse_chat, parse_completions
from tpuserve_router.policies.base import (
    Decision,
    NoHealthyWorker,
    Policy,
    RouteRequest,
    registered_policy_names,
)

log = logging.getLogger(__name__)

SAMPLE_INTERVAL_SECONDS = 0.1


@dataclass
class _Worker:
    """A worker as policies see it (`WorkerView`) plus the engine behind it."""

    name: str
    engine: VirtualEngine
    in_flight: int = 0
    healthy: bool = True
    down_until: float = -math.inf


class _View:
    """A worker as one router replica sees it: its own in-flight count (plus the other
    replicas' as of its last load poll), the shared health."""

    __slots__ = (
        "announced_in_flight", "in_flight", "name", "peer_in_flight", "peer_prefill_tokens",
        "worker",
    )  # fmt: skip

    def __init__(self, worker: _Worker) -> None:
        self.name = worker.name
        self.worker = worker
        self.in_flight = 0
        self.peer_in_flight = 0
        self.announced_in_flight = 0
        self.peer_prefill_tokens = 0

    @property
    def healthy(self) -> bool:
        return self.worker.healthy


@dataclass
class _Replica:
    """One router replica: its policy object, its block index (if any), its views and, when
    the replicas peer, its link to the others and its view of theirs."""

    policy: Policy
    views: list[_View]
    link: PeerLink | None = None
    peers: PeerView | None = None

    @property
    def index(self) -> BlockIndex | None:
        return self.policy.block_index


@dataclass
class _Pending:
    record: RequestRecord
    decision: Decision[Any]
    worker: _Worker
    view: _View
    replica: _Replica
    request: Request
    prefill_reported: bool = False


def route_inputs(
    req: TraceRequest, policy: Policy, tokenizer: Tokenizer
) -> tuple[RouteRequest, list[int]]:
    """What the router would hand the policy for this request, and the engine's token ids.

    The routing text comes from the router's own body parser, so character-level policies see
    exactly what they see behind ``tpuserve router``.
    """
    ids = token_ids_of(req, tokenizer)
    text = ""
    if policy.needs_text:
        route, body = req.body()
        parsed = (parse_chat if route == "/v1/chat/completions" else parse_completions)(
            body, True, None
        )
        text = parsed.text
    return RouteRequest(model="", text=text, token_ids=ids if policy.needs_tokens else None), ids


class SimRun:
    def __init__(
        self,
        trace: Sequence[TraceRequest],
        policy_name: str,
        config: SimConfig,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        config.validate()
        self.trace = trace
        self.config = config
        self.tokenizer = tokenizer or load_tokenizer()
        self.timer = make_timer(config)
        self.palette = OutputPalette(self.tokenizer)
        self.now = 0.0
        self.rng = random.Random(f"sim:{config.seed}")
        self.workers = [
            _Worker(f"http://127.0.0.1:{30000 + i}", self._new_engine(i))
            for i in range(config.workers)
        ]
        engines = {w.name: _CurrentCore(self, i) for i, w in enumerate(self.workers)}
        ctx = AnchorContext(
            clock=self.clock, seed=config.seed, timer=self.timer, page_size=config.page_size,
            engines=engines, cache_tokens=config.cache_tokens,
        )  # fmt: skip
        self.policy_name = policy_name
        self.replicas = [
            _Replica(make_bench_policy(policy_name, ctx), [_View(w) for w in self.workers])
            for _ in range(config.router_replicas)
        ]
        self._replica_rng = random.Random(f"replicas:{config.seed}")
        interval = config.load_poll_seconds
        self._poll_interval = interval
        self._poll_gap = [interval] * len(self.replicas)  # each replica's wait after its poll
        self._next_poll = [
            (r * interval / len(self.replicas) if interval > 0 else math.inf)
            for r in range(len(self.replicas))
        ]
        tpuserve_policy = policy_name in registered_policy_names()
        if not tpuserve_policy:
            self._next_poll = [math.inf] * len(self.replicas)
        self._deliveries: list[tuple[float, int, int, PeerMessage]] = []
        self._kv_arrivals: list[tuple[float, int, BlockIndex, str, list[KVEvent]]] = []
        self._sent = itertools.count()
        self._event_at = 0.0
        if config.peer_delay_seconds is not None and tpuserve_policy:
            for r, replica in enumerate(self.replicas):
                self._join_peers(r, replica)
        self.policy = self.replicas[0].policy
        self.indexes: list[BlockIndex] = []
        for replica in self.replicas:
            if (index := replica.index) is not None:
                self.indexes.append(index)
        if self.indexes and config.kv_events:
            for i, w in enumerate(self.workers):
                for index in self.indexes:
                    index.mark_event_feed(w.name)
                    if config.host_cache_tokens:  # the HBM pool, for `precise`'s HBM room
                        index.set_worker_limit(w.name, -(-config.cache_tokens // config.page_size))
                self._enable_events(i)
        for replica in self.replicas:
            replica.policy.on_workers_changed([w.name for w in self.workers])
        self.pending: dict[str, _Pending] = {}
        self.records: list[RequestRecord] = []
        self.samples = LoadSamples([w.name for w in self.workers])
        self._first_tokens: list[_Pending] = []
        self.rejected = 0
        self._draining: dict[int, dict[str, Any]] = {}
        self.fault_log: list[dict[str, Any]] = []

    # --- engines ------------------------------------------------------------------------

    def _new_engine(self, index: int) -> VirtualEngine:
        cfg = self.config
        engine_config = EngineConfig(
            cache_tokens=cfg.cache_tokens, page_size=cfg.page_size,
            max_running_requests=cfg.max_running_requests,
            chunked_prefill_size=cfg.chunked_prefill_size,
            max_queued_requests=cfg.max_queued_requests, seed=cfg.seed * 1000 + index,
            context_length=cfg.context_length, emit_kv_events=False,
            host_cache_tokens=cfg.host_cache_tokens,
        )  # fmt: skip
        return VirtualEngine(EngineCore(engine_config, self.timer, self.palette))

    def _join_peers(self, r: int, replica: _Replica) -> None:
        """Replica ``r``'s peering, as `tpuserve router --peer-port` sets it up."""
        router = f"replica-{r}"
        replica.link = PeerLink(router, functools.partial(self._publish, r))
        views = {view.name: view for view in replica.views}
        defaults = RouterConfig()
        replica.peers = PeerView(
            router, replica.policy, views.get, clock=self.clock,
            max_open_per_peer=defaults.max_in_flight,
            open_ttl_seconds=defaults.request_timeout_seconds, silent_seconds=math.inf,
        )  # fmt: skip

    def _publish(self, r: int, message: PeerMessage) -> None:
        """Replica ``r``'s PUB socket: the others hear ``message`` ``peer_delay_seconds`` after
        the event (``_event_at``)."""
        delay = self.config.peer_delay_seconds or 0.0
        heapq.heappush(self._deliveries, (self._event_at + delay, next(self._sent), r, message))

    def _peer_link(self, replica: _Replica, at: float) -> PeerLink | None:
        """The replica's link, to announce an event that happened at ``at`` (None: no
        peering)."""
        self._event_at = at
        return replica.link

    def _deliver(self) -> None:
        _, _, source, message = heapq.heappop(self._deliveries)
        for r, replica in enumerate(self.replicas):
            if r != source and replica.peers is not None:
                replica.peers.apply(message)

    def _enable_events(self, i: int) -> None:
        core = self.workers[i].engine.core
        core.config = replace(core.config, emit_kv_events=True)
        core.cache.emit_events = True
        core.kv_event_sink = self._event_sink(i)

    def _event_sink(self, i: int) -> Callable[[list[KVEvent]], None]:
        name = self.workers[i].name
        interval = self.config.kv_event_interval_seconds

        def sink(events: list[KVEvent]) -> None:
            for r, index in enumerate(self.indexes):
                # Each replica's subscription loses its own batches.
                if self.config.kv_event_drop and self.rng.random() < self.config.kv_event_drop:
                    continue
                if interval <= 0:
                    apply_events(index, name, events, self.config.kv_tiers)
                    continue
                phase = r * interval / len(self.indexes)
                emitted = self.workers[i].engine.now
                read_at = phase + (math.floor((emitted - phase) / interval) + 1) * interval
                heapq.heappush(self._kv_arrivals, (read_at, next(self._sent), index, name, events))

        return sink

    def clock(self) -> float:
        return self.now

    # --- the loop -----------------------------------------------------------------------

    def run(self) -> SimResult:
        start = time.perf_counter()
        self._faults = sorted(self.config.faults, key=lambda f: f.at)
        self._fault_i = 0
        self._next_sample = 0.0
        for req in self.trace:
            self._run_timers(req.t)
            self._advance(req.t)
            self._run_timers(req.t)  # peers' messages of what happened meanwhile
            self._route(req)
        while self.pending:
            self._run_timers(self._next_sample)
            if all(w.engine.idle for w in self.workers) and self.pending:
                # Only requests on a worker that is down remain; nothing can finish.
                break
        for p in self.pending.values():
            self._fail(p, "not_finished")
        self.pending.clear()
        while self._deliveries:  # peers' messages still on their way: every request ends
            self._deliver()
        return SimResult(
            self.policy_name, self.records, self.samples, self.config,
            time.perf_counter() - start, self.now,
            rejected=self.rejected,
            faults=self.fault_log,
        )  # fmt: skip

    def _run_timers(self, until: float) -> None:
        """Fire what is due up to ``until``, in time order (a fault before a sample, a peer's
        message or a poll at the same instant): faults, load samples, peers' messages, KV
        events read late and the replicas' load polls."""
        while True:
            faults = self._faults
            next_fault = faults[self._fault_i].at if self._fault_i < len(faults) else math.inf
            next_poll = min(self._next_poll)
            next_message = self._deliveries[0][0] if self._deliveries else math.inf
            next_events = self._kv_arrivals[0][0] if self._kv_arrivals else math.inf
            at = min(next_fault, self._next_sample, next_message, next_poll, next_events)
            if at > until:
                return
            self._advance(at)
            if at == next_fault:
                self._apply_fault(faults[self._fault_i])
                self._fault_i += 1
            elif at == self._next_sample:
                self._sample()
                self._next_sample += SAMPLE_INTERVAL_SECONDS
            elif at == next_message:
                self._deliver()
            elif at == next_events:
                _, _, index, name, events = heapq.heappop(self._kv_arrivals)
                apply_events(index, name, events, self.config.kv_tiers)
            else:
                r = self._next_poll.index(next_poll)
                news = self._poll_loads(self.replicas[r])
                gap = next_poll_gap(self._poll_gap[r], self._poll_interval, news)
                self._poll_gap[r] = gap
                self._next_poll[r] += gap

    def _poll_loads(self, replica: _Replica) -> bool:
        """One replica's load poll of every engine (``/v1/loads``), taken at once: True when
        some engine holds load beyond the replica's own counts (`set_peer_load`)."""
        policy = replica.policy
        news = False
        for view in replica.views:
            core = view.worker.engine.core
            news |= not view.worker.healthy  # the router's poll of a down engine fails
            news |= set_peer_load(
                view, core.num_running + core.num_waiting, core.waiting_uncached_tokens,
                policy.queued_prefill_tokens(view.name),
            )  # fmt: skip
        return news

    def _advance(self, t: float) -> None:
        for i, w in enumerate(self.workers):
            if not w.healthy and t >= w.down_until:
                w.healthy = True
            for completion in w.engine.run_until(t):
                self._deliver_first_tokens()
                p = self.pending.pop(completion.rid, None)
                if p is None:
                    continue
                rec = p.record
                rec.ok = True
                rec.ttft = completion.ttft
                rec.e2e = completion.e2e
                rec.cached_tokens = completion.cached_tokens
                rec.cached_host_tokens = completion.cached_host_tokens
                rec.completion_tokens = completion.completion_tokens
                if not p.prefill_reported:  # its first token was not reported: now, as the
                    p.prefill_reported = True  # router does at the end of a response
                    p.replica.policy.on_prefill_done(p.decision)
                    link = self._peer_link(p.replica, rec.arrival + completion.ttft)
                    if link is not None:
                        link.prefill_done(p.decision)
                p.worker.in_flight -= 1
                p.view.in_flight -= 1
                p.replica.policy.on_request_done(p.decision, True)
                if (link := self._peer_link(p.replica, rec.arrival + completion.e2e)) is not None:
                    link.ended(p.decision)
            self._deliver_first_tokens()
            if w.engine.rejected:
                rejected, w.engine.rejected = w.engine.rejected, []
                self.rejected += len(rejected)
                for _at, engine_req in rejected:
                    p = self.pending.pop(engine_req.rid, None)
                    if p is not None:
                        self._fail(p, "queue_full")
            drain = self._draining.get(i)
            if drain is not None and w.in_flight == 0 and w.engine.core.flush_cache():
                del self._draining[i]
                w.healthy, w.down_until = True, -math.inf
                drain["serving_again_at"] = max(t, self.now)
        self.now = max(self.now, t)

    def _deliver_first_tokens(self) -> None:
        if self._first_tokens:
            reported, self._first_tokens = self._first_tokens, []
            for p in reported:
                p.replica.policy.on_prefill_done(p.decision)
                at = p.request.first_token_time
                link = self._peer_link(p.replica, self.now if at is None else at)
                if link is not None:
                    link.prefill_done(p.decision)

    def _on_update(self, req: Request) -> None:
        p: _Pending = req.user
        if not p.prefill_reported and req.first_token_time is not None:
            p.prefill_reported = True
            self._first_tokens.append(p)

    def _route(self, req: TraceRequest) -> None:
        self.now = req.t
        replica = self.replicas[0]
        if len(self.replicas) > 1:
            replica = self.replicas[self._replica_rng.randrange(len(self.replicas))]
        policy = replica.policy
        route_request, ids = route_inputs(req, policy, self.tokenizer)
        cfg = self.config
        rec = RequestRecord(req.id, "", req.t, len(ids))
        rec.ttft_slo = cfg.slo_factor * self.timer.prefill_seconds(len(ids), 0)
        rec.tpot_slo = cfg.slo_factor * self.timer.decode_step_seconds(1, len(ids))
        self.records.append(rec)
        try:
            decision = policy.choose(route_request, replica.views)
        except NoHealthyWorker:
            rec.error = "no_healthy_worker"
            return
        view: _View = decision.worker
        worker = view.worker
        rec.worker = worker.name
        rec.outcome = decision.outcome
        if len(ids) >= cfg.context_length:
            rec.error = "prompt_too_long"
            policy.on_request_done(decision, False)
            return
        # The engines know a request by its position in the trace, not its id, so requests
        # that share an id (a hand-written trace) still run as requests of their own.
        rid = str(len(self.records) - 1)
        max_tokens = min(req.max_tokens, cfg.context_length - len(ids))
        engine_req = Request(rid, ids, max_tokens, on_update=self._on_update)
        pending = _Pending(rec, decision, worker, view, replica, engine_req)
        engine_req.user = pending
        self.pending[rid] = pending
        worker.in_flight += 1
        view.in_flight += 1
        if (link := self._peer_link(replica, req.t)) is not None:
            link.routed(decision)
        worker.engine.submit(engine_req, at=req.t)

    def _fail(self, p: _Pending, reason: str) -> None:
        """End a routed request that will not finish: its reason, the router's hooks."""
        p.record.error = reason
        p.worker.in_flight -= 1
        p.view.in_flight -= 1
        p.replica.policy.on_request_done(p.decision, False)
        if (link := self._peer_link(p.replica, self.now)) is not None:
            link.ended(p.decision)

    def _sample(self) -> None:
        self.samples.add(self.now, [w.in_flight for w in self.workers])

    def _apply_fault(self, fault: Fault) -> None:
        w = self.workers[fault.worker]
        log.info("fault %s on %s at %.2f s", fault.kind, w.name, self.now)
        entry: dict[str, Any] = {"kind": fault.kind, "worker": fault.worker, "at": self.now,
                                 "serving_again_at": None}  # fmt: skip
        self.fault_log.append(entry)
        if fault.kind == "flush":
            w.healthy, w.down_until = False, math.inf
            self._draining[fault.worker] = entry
            return
        for rid, p in list(self.pending.items()):
            if p.worker is w:
                del self.pending[rid]
                self._fail(p, "worker_restarted")
        w.engine = self._new_engine(fault.worker)
        # The router reads the old engine's last batches before it sees the restart.
        self._kv_arrivals = [a for a in self._kv_arrivals if a[3] != w.name]
        heapq.heapify(self._kv_arrivals)
        if self.indexes and self.config.kv_events:
            for index in self.indexes:
                index.clear(w.name)
            self._enable_events(fault.worker)
        w.engine.now = self.now
        w.healthy = False
        w.down_until = self.now + self.config.restart_down_seconds
        entry["serving_again_at"] = w.down_until


class _CurrentCore:
    """The current engine core of worker `i` (it changes when the worker restarts)."""

    def __init__(self, run: SimRun, i: int) -> None:
        self._run = run
        self._i = i

    @property
    def _core(self) -> EngineCore:
        return self._run.workers[self._i].engine.core

    @property
    def num_running(self) -> int:
        return self._core.num_running

    @property
    def num_waiting(self) -> int:
        return self._core.num_waiting

    @property
    def token_usage(self) -> float:
        return self._core.token_usage

    def match_prefix_length(self, token_ids: Sequence[int]) -> int:
        return self._core.match_prefix_length(token_ids)


def apply_events(
    index: BlockIndex, name: str, events: Sequence[KVEvent], tiers: bool = True
) -> None:
    """One batch of worker ``name``'s KV events, applied as the router applies them (`tiers`
    False: as a router that ignores the medium)."""
    for event in events:
        if isinstance(event, BlockStored):
            index.store(
                name, event.block_hashes, event.parent_block_hash, event.token_ids,
                event.block_size, 0, event.medium if tiers else None,
            )  # fmt: skip
        elif isinstance(event, BlockRemoved):
            index.remove(name, event.block_hashes, 0, event.medium if tiers else None)
        elif isinstance(event, AllBlocksCleared):
            index.clear(name)


def run_sim(
    trace: Sequence[TraceRequest],
    policy: str,
    config: SimConfig,
    tokenizer: Tokenizer | None = None,
) -> SimResult:
    return SimRun(trace, policy, config, tokenizer).run()


def measure_rr_saturation(
    trace: Sequence[TraceRequest], config: SimConfig, tokenizer: Tokenizer | None = None
) -> float:
    """mu_RR: requests per second round-robin completes when the whole trace arrives at once."""
    burst = [
        TraceRequest(r.id, 0.0, r.max_tokens, r.prompt, r.messages, r.prompt_token_ids,
                     r.session, r.token_ids)
        for r in trace
    ]  # fmt: skip
    result = run_sim(burst, "round_robin", replace(config, faults=(), router_replicas=1), tokenizer)
    finished = [r for r in result.records if r.ok and r.e2e is not None]
    if not finished:
        raise RuntimeError("round-robin finished no request; the engines cannot serve the trace")
    makespan = max(r.e2e for r in finished if r.e2e is not None)
    return len(finished) / makespan
