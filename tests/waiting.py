"""The one way tests wait: poll a condition until it holds or a deadline passes.

Every wait in the suites goes through `eventually` (threads, subprocesses, clusters) or
`eventually_async` (inside an event loop). A timeout fails with what was awaited, how long,
the last value or error the check produced, and whatever `context()` adds (a log tail).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")

DEFAULT_INTERVAL_SECONDS = 0.05


class WaitTimeout(AssertionError):
    """A condition did not hold within its deadline."""


def _failure(
    what: str,
    timeout_seconds: float,
    last: object,
    error: BaseException | None,
    context: Callable[[], str] | None,
) -> WaitTimeout:
    seen = f"last error: {error!r}" if error is not None else f"last value: {last!r}"
    extra = ""
    if context is not None:
        try:
            extra = "\n" + context()
        except Exception as err:  # the context is best effort; the timeout is the news
            extra = f"\n(context unavailable: {err!r})"
    return WaitTimeout(f"timed out after {timeout_seconds:g} s waiting for {what} ({seen}){extra}")


def eventually(
    check: Callable[[], T | None],
    *,
    what: str,
    timeout_seconds: float = 10.0,
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
    context: Callable[[], str] | None = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call `check` until it returns a truthy value and return that value.

    Exceptions of the types in `ignore` count as "not yet"; any other exception fails at once.
    A check may return None for "not yet": the value returned is then typed without None.
    """
    deadline = time.monotonic() + timeout_seconds
    last: object = None
    error: BaseException | None = None
    while True:
        try:
            value = check()
        except ignore as err:
            error = err
        else:
            error = None
            last = value
            if value:
                return value
        if time.monotonic() >= deadline:
            raise _failure(what, timeout_seconds, last, error, context)
        time.sleep(interval_seconds)


@overload
async def eventually_async(
    check: Callable[[], Awaitable[T | None]],
    *,
    what: str,
    timeout_seconds: float = 10.0,
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
    context: Callable[[], str] | None = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> T: ...


@overload
async def eventually_async(
    check: Callable[[], T | None],
    *,
    what: str,
    timeout_seconds: float = 10.0,
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
    context: Callable[[], str] | None = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> T: ...


async def eventually_async(
    check: Callable[[], T | Awaitable[T | None] | None],
    *,
    what: str,
    timeout_seconds: float = 10.0,
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
    context: Callable[[], str] | None = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """`eventually` for the event loop: `check` may be sync or async; sleeps yield the loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_seconds
    last: object = None
    error: BaseException | None = None
    while True:
        try:
            result = check()
            value = await result if isinstance(result, Awaitable) else result
        except ignore as err:
            error = err
        else:
            error = None
            last = value
            if value:
                return value
        if loop.time() >= deadline:
            raise _failure(what, timeout_seconds, last, error, context)
        await asyncio.sleep(interval_seconds)
