"""The one way tests wait: poll a condition until it holds or a deadline passes.

Every wait in the suites goes through `eventually` (threads, subprocesses, clusters) or
`eventually_async` (inside an event loop). A timeout fails with what was awaited, how long,
the last value or error the check produced, and whatever `context()` adds (a log tail).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Required, TypedDict, TypeVar, Unpack, cast, overload

T = TypeVar("T")

DEFAULT_INTERVAL_SECONDS = 0.05


class WaitTimeout(AssertionError):
    """A condition did not hold within its deadline."""


class WaitOptions(TypedDict, total=False):
    """How a wait goes: only `what` is required; the defaults are `_Wait`'s."""

    what: Required[str]  # what is awaited, for the failure message
    timeout_seconds: float
    interval_seconds: float  # between checks
    context: Callable[[], str] | None  # more for the failure message (a log tail)
    ignore: tuple[type[BaseException], ...]  # count as "not yet"; any other fails at once


class _Wait:
    """One wait's options, what it has seen so far, and the failure to raise once its deadline
    passes."""

    def __init__(
        self,
        now: float,
        *,
        what: str,
        timeout_seconds: float = 10.0,
        interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
        context: Callable[[], str] | None = None,
        ignore: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.what, self.timeout_seconds, self.context = what, timeout_seconds, context
        self.interval_seconds, self.ignore = interval_seconds, ignore
        self.deadline = now + timeout_seconds
        self.last: object = None
        self.error: BaseException | None = None

    def holds(self, value: object, error: BaseException | None, now: float) -> bool:
        """True when the check gave a truthy value; WaitTimeout once the deadline has passed."""
        self.error = error
        if error is None:
            self.last = value
            if value:
                return True
        if now >= self.deadline:
            raise self._failure()
        return False

    def _failure(self) -> WaitTimeout:
        seen = f"last error: {self.error!r}" if self.error else f"last value: {self.last!r}"
        extra = ""
        if self.context is not None:
            try:
                extra = "\n" + self.context()
            except Exception as err:  # the context is best effort; the timeout is the news
                extra = f"\n(context unavailable: {err!r})"
        return WaitTimeout(
            f"timed out after {self.timeout_seconds:g} s waiting for {self.what} ({seen}){extra}"
        )


def eventually(check: Callable[[], T | None], **options: Unpack[WaitOptions]) -> T:
    """Call `check` until it returns a truthy value and return that value.

    A check may return None for "not yet": the value returned is then typed without None.
    """
    wait = _Wait(time.monotonic(), **options)
    while True:
        value, error = None, None
        try:
            value = check()
        except wait.ignore as err:
            error = err
        if wait.holds(value, error, time.monotonic()):
            return cast(T, value)
        time.sleep(wait.interval_seconds)


@overload
async def eventually_async(
    check: Callable[[], Awaitable[T | None]], **options: Unpack[WaitOptions]
) -> T: ...


@overload
async def eventually_async(check: Callable[[], T | None], **options: Unpack[WaitOptions]) -> T: ...


async def eventually_async(
    check: Callable[[], T | Awaitable[T | None] | None], **options: Unpack[WaitOptions]
) -> T:
    """`eventually` for the event loop: `check` may be sync or async; sleeps yield the loop."""
    loop = asyncio.get_running_loop()
    wait = _Wait(loop.time(), **options)
    while True:
        value, error = None, None
        try:
            result = check()
            value = await result if isinstance(result, Awaitable) else result
        except wait.ignore as err:
            error = err
        if wait.holds(value, error, loop.time()):
            return cast(T, value)
        await asyncio.sleep(wait.interval_seconds)
