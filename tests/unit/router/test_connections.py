"""The connection budget: the longest-waiting idle connection makes room, busy ones never do,
and the sweep closes exactly the connections past their timeouts."""

from __future__ import annotations

import pytest

from tpuserve_router.front.connections import BufferBudget, ConnectionBook

pytestmark = pytest.mark.unit


class FakeConnection:
    """A connection whose timeout passes at ``expires_at``."""

    def __init__(self, name: str, expires_at: float = float("inf")) -> None:
        self.name = name
        self.expires_at = expires_at
        self.evicted = False

    def expired(self, now: float) -> str | None:
        return "keep_alive_timeout" if now > self.expires_at else None

    def evict(self) -> None:
        self.evicted = True


async def test_at_the_limit_the_longest_waiting_connection_makes_room() -> None:
    counted: list[str] = []
    book = ConnectionBook(2, 1.0, counted.append)
    a, b, c = FakeConnection("a"), FakeConnection("b"), FakeConnection("c")
    assert book.opened(a)
    assert book.opened(b)
    book.busy(a)
    book.idle(a)  # a finished a request: it now waited less than b
    assert book.opened(c)
    assert (a.evicted, b.evicted) == (False, True)
    assert book.open == {a, c}
    assert counted == ["evicted"]
    book.stop()


async def test_when_every_connection_is_busy_the_newcomer_is_refused() -> None:
    counted: list[str] = []
    book = ConnectionBook(1, 1.0, counted.append)
    a = FakeConnection("a")
    assert book.opened(a)
    book.busy(a)
    assert not book.opened(FakeConnection("b"))
    assert (a.evicted, counted) == (False, ["refused"])
    book.stop()


async def test_the_sweep_closes_only_connections_past_their_timeout() -> None:
    counted: list[str] = []
    book = ConnectionBook(10, 1.0, counted.append)
    old, young = FakeConnection("old", 5.0), FakeConnection("young", 50.0)
    stalled = FakeConnection("stalled", 5.0)
    for conn in (old, young, stalled):
        book.opened(conn)
    book.busy(stalled)
    book.stalled.add(stalled)  # busy, but its client stopped reading
    book.sweep(10.0)
    assert book.open == {young}
    assert counted == ["keep_alive_timeout", "keep_alive_timeout"]
    assert book.now == 10.0
    book.stop()


def test_a_client_holds_at_most_its_share_and_gives_it_back() -> None:
    budget = BufferBudget(100, max_client_bytes=40)
    assert budget.take(30, "a")
    assert not budget.take(20, "a")  # over a's share: nothing charged
    assert budget.free_for("a") == 10
    assert budget.take(40, "b")
    assert budget.take(25)  # no client's (the picker's): the whole budget's rest alone
    assert not budget.take(10, "c")  # the budget itself is short: 95 used
    assert (budget.used, budget.by_client) == (95, {"a": 30, "b": 40})
    budget.give(30, "a")
    budget.give(40, "b")
    budget.give(25)
    assert (budget.used, budget.by_client) == (0, {})
