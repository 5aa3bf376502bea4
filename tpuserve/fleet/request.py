"""One request as the fleet model carries it: drawn by the traffic, routed, served."""

from __future__ import annotations


class Request:
    """A request's state from arrival to its end (plain slots: ~10^6 of them an hour)."""

    __slots__ = ("arrival", "blocks", "booked", "cached", "depth", "engine", "first",
                 "host_cached", "output", "prompt", "router", "session", "uncached")  # fmt: skip

    def __init__(
        self, arrival: float, blocks: tuple[int, ...], prompt: int, output: int, session: int
    ) -> None:
        self.arrival = arrival
        self.blocks = blocks
        self.prompt = prompt
        self.output = output
        self.session = session
        self.router = 0
        self.engine = -1
        self.booked = 0
        self.cached = 0
        self.host_cached = 0  # of them, loaded back from the host tier
        self.depth = 0  # leading blocks the engine held at admission
        self.uncached = 0
        self.first = -1.0
