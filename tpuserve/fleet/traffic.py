"""The fleet model's traffic: sessions on a daily shape with bursts, each turn a request.

Sessions are drawn from the Mooncake conversation and tool&agent shapes
(`tpuserve.bench.mooncake`, mixed by ``conversation_share``) or, for the ``lengths`` workload,
are single requests over ``prefix_groups`` shared prefixes. They start as a Poisson process
whose rate follows the daily shape (`daily_multiplier`) times bursts; a session's next turn
arrives a think time after the previous one. Each request goes to ``sink`` (the fleet's
routers) or, while drawing a workload without serving it, to ``drawn``.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from typing import Protocol

from tpuserve.bench import mooncake
from tpuserve.fleet.config import FleetConfig, WorkloadRequest, daily_multiplier
from tpuserve.fleet.events import ARRIVAL, SESSION, Clock
from tpuserve.fleet.request import Request

SINGLE = mooncake.TraceShape(
    mooncake.PublishedStats("lengths", 0, 0, None, 0, 0.0),
    continue_probability=0.0,
    max_input_tokens=10**9,
)
"""The ``lengths`` workload's requests: one turn each (outputs from the config)."""


class RequestSink(Protocol):
    def arrive(self, req: Request) -> None:
        """A request arrives now."""


class Session:
    __slots__ = ("blocks", "length", "shape", "turn")

    def __init__(self, shape: mooncake.TraceShape, blocks: tuple[int, ...], length: int) -> None:
        self.shape = shape
        self.blocks = blocks
        self.length = length
        self.turn = 0


class Traffic:
    """Draws sessions and their turns on ``clock``; ``rng`` is the fleet's (shared with cold
    starts and Spot, so a seed gives one run)."""

    def __init__(
        self,
        config: FleetConfig,
        clock: Clock,
        rng: random.Random,
        context_length: int,
        sink: RequestSink,
    ) -> None:
        c = self.config = config
        self.clock = clock
        self.rng = rng
        self.block = config.block_tokens
        self.context_length = context_length
        self.sink = sink
        self.next_block = 1 + max(1, mooncake.CONVERSATION.shared_blocks)
        self.templates = self._templates()
        self.shapes = (mooncake.CONVERSATION, mooncake.TOOL_AGENT)
        self.groups = self._groups()
        mean_turns = c.conversation_share / (1 - mooncake.CONVERSATION.continue_probability) + (
            1 - c.conversation_share
        ) / (1 - mooncake.TOOL_AGENT.continue_probability)
        if c.workload == "lengths":
            mean_turns = 1.0
        self.session_peak = c.peak_rate / mean_turns
        self.bursts = self._bursts()
        self.session_count = 0
        self.drawn: list[WorkloadRequest] | None = None
        """Where requests are collected instead of delivered (`FleetSim.requests`)."""

    def _templates(self) -> list[tuple[list[int], int]]:
        """The tool&agent shape's shared templates (block ids, tokens)."""
        shape = mooncake.TOOL_AGENT
        rng = random.Random(f"fleet-templates:{self.config.seed}")
        out = []
        for _ in range(shape.templates):
            tokens = rng.randint(shape.template_min, shape.template_max) // self.block
            ids = list(range(self.next_block, self.next_block + tokens))
            self.next_block += tokens
            out.append((ids, tokens * self.block))
        return out

    def _groups(self) -> list[list[int]]:
        """The ``lengths`` workload's shared prefixes (block ids)."""
        c = self.config
        if c.workload != "lengths" or c.reuse_share <= 0:
            return []
        blocks = int(c.reuse_share * c.input_median) // self.block
        out = []
        for _ in range(c.prefix_groups):
            out.append(list(range(self.next_block, self.next_block + blocks)))
            self.next_block += blocks
        return out

    def _bursts(self) -> list[float]:
        c = self.config
        rng = random.Random(f"fleet-bursts:{c.seed}")
        out: list[float] = []
        t = 0.0
        if c.bursts_per_hour > 0 and c.burst_seconds > 0:
            while True:
                t += rng.expovariate(c.bursts_per_hour / 3600.0)
                if t >= c.duration_seconds:
                    break
                out.append(t)
        return out

    def rate_multiplier(self, t: float) -> float:
        """The arrival rate at ``t`` relative to ``peak_rate``: daily shape x bursts."""
        c = self.config
        m = daily_multiplier((c.start_hour + t / 3600.0) % 24.0, c.trough)
        i = bisect_right(self.bursts, t) - 1
        if i >= 0 and t < self.bursts[i] + c.burst_seconds:
            m *= c.burst_factor
        return m

    def next_session(self, t: float) -> None:
        """Schedule the next session start after ``t`` (thinning of the daily rate)."""
        c = self.config
        top = self.session_peak * max(1.0, c.burst_factor)
        rng = self.rng
        while True:
            t += rng.expovariate(top)
            if t >= c.duration_seconds:
                return
            if rng.random() * top <= self.session_peak * self.rate_multiplier(t):
                self.clock.push(t, SESSION, None, 0)
                return

    def start_session(self) -> None:
        rng = self.rng
        c = self.config
        if c.workload == "lengths":
            blocks: list[int] = []
            if self.groups:
                blocks = self.groups[mooncake.zipf_index(rng, len(self.groups), c.prefix_zipf)]
            private_median = max(1.0, (1.0 - c.reuse_share) * c.input_median)
            room = self.context_length - 1 - c.output_max - len(blocks) * self.block
            add = min(mooncake.lognormal_tokens(rng, private_median, c.input_sigma), max(1, room))
            one = Session(SINGLE, tuple(blocks), len(blocks) * self.block)
            self.session_count += 1
            self.turn(one, add)
            return
        conversation = rng.random() < self.config.conversation_share
        shape = self.shapes[0 if conversation else 1]
        blocks = list(range(shape.shared_blocks))
        length = len(blocks) * self.block
        if not conversation and self.templates:
            ids, tokens = self.templates[mooncake.zipf_index(rng, len(self.templates),
                                                             shape.template_zipf)]  # fmt: skip
            blocks = blocks + ids
            length += tokens
        session = Session(shape, tuple(blocks), length)
        self.session_count += 1
        self.turn(session, mooncake.lognormal_tokens(rng, shape.first_median, shape.first_sigma))

    def turn(self, session: Session, add: int) -> None:
        """The session's next request, ``add`` tokens longer than its last prompt."""
        shape = session.shape
        if session.length + add > min(shape.max_input_tokens, self.context_length - 1):
            return
        kept = session.length // self.block
        session.length += add
        fresh = math.ceil(session.length / self.block) - kept
        nb = self.next_block
        session.blocks = session.blocks[:kept] + tuple(range(nb, nb + fresh))
        self.next_block = nb + fresh
        rng = self.rng
        lo, hi = shape.output_min, shape.output_max
        if shape is SINGLE:
            lo, hi = self.config.output_min, self.config.output_max
        output = min(rng.randint(lo, hi),
                     self.context_length - session.length)  # fmt: skip
        now = self.clock.now
        req = Request(now, session.blocks, session.length, output, 0)
        if self.drawn is None:
            self.sink.arrive(req)
        else:
            self.drawn.append(WorkloadRequest(req.arrival, req.blocks, req.prompt, req.output))
        if rng.random() < shape.continue_probability:
            t = now + rng.expovariate(1.0 / shape.think_seconds)
            if t < self.config.duration_seconds:
                nxt = output + mooncake.lognormal_tokens(rng, shape.turn_median, shape.turn_sigma)
                self.clock.push(t, ARRIVAL, session, nxt)
