"""The loads `tpuserve up --load` offers: traces of requests with arrival times.

``shared-prefix`` is built in; `register_load` adds more, and the benchmark's workloads
(W0-W8 of `tpuserve.bench.workloads`) are offered when that module is installed. The driver
rescales a trace to ``--rate`` requests per second and replays it in a loop.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tpuserve.up.errors import UpError


class LoadRequest(Protocol):
    """One request of a load trace (`tpuserve.bench.traces.TraceRequest` fits)."""

    @property
    def t(self) -> float:
        """Arrival time in seconds from the start of the trace."""
        ...

    def body(self) -> tuple[str, dict[str, Any]]:
        """The route and JSON body that send it (without model and stream)."""
        ...


LoadFactory = Callable[[int, int | None], Sequence[LoadRequest]]
"""``factory(seed, requests)``: a trace (``requests`` None: the load's own length)."""

_LOADS: dict[str, tuple[str, LoadFactory]] = {}


def register_load(name: str, description: str, factory: LoadFactory) -> None:
    """Offer ``--load name``: ``factory(seed, requests)`` returns the trace."""
    _LOADS[name] = (description, factory)


def load_names() -> list[str]:
    return sorted(_LOADS) + _bench_workload_names()


def make_load(name: str, seed: int, requests: int | None) -> Sequence[LoadRequest]:
    entry = _LOADS.get(name)
    if entry is not None:
        return entry[1](seed, requests)
    if name in _bench_workload_names():
        from tpuserve.bench import workloads

        trace: Sequence[LoadRequest] = workloads.generate(name, seed=seed, requests=requests)
        return trace
    raise UpError(f"--load: {name!r} is not allowed; allowed: {', '.join(load_names())}")


def _bench_workload_names() -> list[str]:
    try:
        from tpuserve.bench import workloads
    except ImportError:
        return []
    names: list[str] = workloads.workload_names()
    return names


@dataclass(frozen=True, slots=True)
class BuiltinRequest:
    t: float
    route: str
    payload: dict[str, Any]

    def body(self) -> tuple[str, dict[str, Any]]:
        return self.route, dict(self.payload)


def shared_prefix_load(seed: int, requests: int | None) -> list[BuiltinRequest]:
    """16 groups, each a ~1,000-token system prompt shared by short questions; Poisson
    arrivals at 10/s (rescaled by --rate). Words are letters only, one token each in the
    engine twin's default tokenizer, so every router sees the same prefixes."""
    rng = random.Random(seed)
    n = requests or 2000
    letters = "abcdefghijklmnopqrstuvwxyz"

    def words(count: int) -> str:
        return "".join(" " + "".join(rng.choice(letters) for _ in range(3)) for _ in range(count))

    systems = [f"group{g}:" + words(1000) for g in range(16)]
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(10.0)
        group = min(int(rng.paretovariate(1.2)) - 1, 15)  # a few hot groups, a long tail
        messages = [
            {"role": "system", "content": systems[group]},
            {"role": "user", "content": f"question {i}:" + words(rng.randint(20, 60))},
        ]
        payload = {"messages": messages, "max_tokens": rng.randint(16, 64)}
        out.append(BuiltinRequest(t, "/v1/chat/completions", payload))
    return out


register_load(
    "shared-prefix",
    "16 groups of ~1,000-token system prompts with short questions (chat)",
    shared_prefix_load,
)
