"""Fakes for router unit tests: workers and requests as policies see them."""

from __future__ import annotations

from dataclasses import dataclass

from tpuserve_router.policies import RouteRequest


@dataclass
class FakeWorker:
    name: str
    in_flight: int = 0
    healthy: bool = True


def fake_worker(name: str, in_flight: int = 0, healthy: bool = True) -> FakeWorker:
    return FakeWorker(name, in_flight, healthy)


def fake_request(
    prompt: str = "", token_ids: list[int] | None = None, model: str = ""
) -> RouteRequest:
    if token_ids is None and prompt:
        token_ids = [ord(c) for c in prompt]
    return RouteRequest(model=model, text=prompt, token_ids=token_ids)


class VirtualClock:
    """A clock tests move by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
