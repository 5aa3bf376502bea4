"""The one wait helper: returns the first truthy value, fails with what it saw."""

from __future__ import annotations

import itertools

import pytest

from tests.waiting import WaitTimeout, eventually, eventually_async

pytestmark = pytest.mark.unit


def test_returns_the_first_truthy_value() -> None:
    values = iter([0, None, "", 7, 8])
    assert eventually(lambda: next(values), what="seven", interval_seconds=0) == 7


def test_ignored_errors_count_as_not_yet_and_others_fail_at_once() -> None:
    calls = itertools.count()

    def flaky() -> int | None:
        if next(calls) < 2:
            raise ConnectionError("not up")
        return 1

    assert eventually(flaky, what="up", interval_seconds=0, ignore=(ConnectionError,)) == 1
    empty: dict[str, int] = {}
    with pytest.raises(KeyError):
        eventually(lambda: empty["missing"], what="a key", interval_seconds=0)


def test_a_timeout_names_what_it_waited_for_what_it_saw_and_the_context() -> None:
    with pytest.raises(WaitTimeout) as failure:
        eventually(lambda: [], what="a list", timeout_seconds=0, context=lambda: "log tail")
    assert str(failure.value) == (
        "timed out after 0 s waiting for a list (last value: [])\nlog tail"
    )

    def refused() -> bool:
        raise ConnectionRefusedError("refused")

    with pytest.raises(WaitTimeout, match=r"last error: ConnectionRefusedError\('refused'\)"):
        eventually(refused, what="x", timeout_seconds=0, ignore=(OSError,))


async def test_the_async_form_takes_sync_and_async_checks() -> None:
    values = iter([False, True])

    async def ready() -> bool:
        return next(values)

    assert await eventually_async(ready, what="ready", interval_seconds=0) is True
    assert await eventually_async(lambda: "now", what="now") == "now"
    with pytest.raises(WaitTimeout, match="waiting for never"):
        await eventually_async(lambda: None, what="never", timeout_seconds=0)
