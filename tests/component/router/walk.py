"""A request's walk through the router, as the profiler sees it (`sys.setprofile`): which of
the router's modules it enters, how often, and which pipeline stages it runs, in order.

Only what runs under the request's own entry frame counts (the HTTP connection's
``_serve``, or the picker's ``Process``): the router's background work (health checks, KV
events) running at the same time is not the request's walk. A module is *entered* when a
function of it starts (a fresh frame, not a coroutine resumed) called from another file.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import tpuserve_router

ROUTER = Path(tpuserve_router.__file__).resolve().parent
ENTRY_FRAMES = frozenset({"_serve", "Process"})
"""The code names of the frames a request's walk runs under (`HttpConnection._serve`,
`EndpointPicker.Process`)."""
MAX_EVENTS = 1_000_000  # one request makes some thousands: the bound on what is recorded


@dataclass
class Walk:
    entries: Counter[str] = field(default_factory=Counter)
    """Per router module (its path under the package), how often the walk entered it."""
    visits: Counter[str] = field(default_factory=Counter)
    """Per router module, how often the walk came into it, by a call or a return: the
    turns of the request's walk between modules."""
    stages: list[str] = field(default_factory=list)
    """The pipeline stages the walk ran (`tpuserve_router.pipeline.stages.STAGES`), in order,
    a stage called again right after itself recorded once."""

    def top(self, n: int = 6) -> str:
        """The ``n`` modules entered most, for a failure's message."""
        return ", ".join(f"{m} {c}" for m, c in self.entries.most_common(n))

    events: int = 0


def _module(frame: FrameType) -> str | None:
    path = Path(frame.f_code.co_filename)
    try:
        return path.resolve().relative_to(ROUTER).as_posix()
    except ValueError:
        return None


def _under_entry(frame: FrameType) -> bool:
    current: FrameType | None = frame
    while current is not None:
        code = current.f_code
        if code.co_name in ENTRY_FRAMES and _module(current) is not None:
            return True
        current = current.f_back
    return False


@contextmanager
def walked(stage_of: Mapping[str, str]) -> Iterator[Walk]:
    """Record the walk of what runs inside the block; ``stage_of`` names the stage of each
    function that runs one, by its qualified name (``Class.method``)."""
    walk = Walk()
    seen: set[int] = set()  # code starts already counted (coroutine frames resume)
    alive: list[FrameType] = []  # keeps the frames whose ids are in `seen` from being reused

    here: list[str] = []  # the module the walk is in

    def turn(module: str | None) -> None:
        if module is not None and (not here or here[0] != module):
            walk.visits[module] += 1
            here[:] = [module]

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event not in ("call", "return") or walk.events >= MAX_EVENTS:
            return
        module = _module(frame)
        if module is None or not _under_entry(frame):
            return
        if event == "return":
            caller = frame.f_back
            turn(None if caller is None else _module(caller))
            return
        turn(module)
        if id(frame) in seen:
            return
        walk.events += 1
        seen.add(id(frame))
        alive.append(frame)
        caller = frame.f_back
        if caller is None or caller.f_code.co_filename != frame.f_code.co_filename:
            walk.entries[module] += 1
        stage = stage_of.get(frame.f_code.co_qualname)
        if stage is not None and (not walk.stages or walk.stages[-1] != stage):
            walk.stages.append(stage)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield walk
    finally:
        sys.setprofile(previous)
        alive.clear()
