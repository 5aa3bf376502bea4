"""argparse types shared by every `tpuserve` subcommand: one rule per kind of number.

Each function turns a flag's text into a value or raises `argparse.ArgumentTypeError` with a
message naming the value and what is allowed; argparse adds the flag and exits 2::

    tpuserve router: error: argument --port: '-5' is not allowed; allowed: an integer from
    0 to 65535 (0: any free port)

Every part may import this module (it lives in `sglang_tpu`, the bottom layer). The router
also applies the same functions to its ``TPUSERVE_ROUTER_*`` variables, so a flag and its
variable obey one rule. Non-finite numbers (``nan``, ``inf``) are refused everywhere.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = [
    "duration_seconds",
    "fraction",
    "non_negative_float",
    "non_negative_int",
    "nonzero_port",
    "port",
    "positive_float",
    "positive_int",
    "positive_int_or_minus_one",
]


def _refuse(text: str, allowed: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: {allowed}")


def _integer(text: str, allowed: str, ok: Callable[[int], bool]) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise _refuse(text, allowed) from None
    if not ok(value):
        raise _refuse(text, allowed)
    return value


def _number(text: str, allowed: str, ok: Callable[[float], bool]) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise _refuse(text, allowed) from None
    if not (math.isfinite(value) and ok(value)):
        raise _refuse(text, allowed)
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (counts, sizes, thresholds)."""
    return _integer(text, "an integer >= 1", lambda n: n >= 1)


def non_negative_int(text: str) -> int:
    """An integer >= 0 (seeds, indexes, retries)."""
    return _integer(text, "an integer >= 0", lambda n: n >= 0)


def positive_int_or_minus_one(text: str) -> int:
    """An integer >= 1, or -1 for "off" (SGLang's spelling, e.g. --chunked-prefill-size)."""
    return _integer(text, "-1 (off) or an integer >= 1", lambda n: n == -1 or n >= 1)


def port(text: str) -> int:
    """A TCP port to listen on; 0 lets the kernel pick a free one."""
    return _integer(
        text, "an integer from 0 to 65535 (0: any free port)", lambda n: 0 <= n <= 65535
    )


def nonzero_port(text: str) -> int:
    """A TCP port that must be named (one to dial, or a fixed one to listen on)."""
    return _integer(text, "an integer from 1 to 65535", lambda n: 1 <= n <= 65535)


def positive_float(text: str) -> float:
    """A finite number > 0 (rates, factors)."""
    return _number(text, "a number > 0", lambda x: x > 0)


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (scales and intervals where 0 means "none" or "off")."""
    return _number(text, "a number >= 0", lambda x: x >= 0)


def duration_seconds(text: str) -> float:
    """A finite number of seconds > 0 (timeouts, periods)."""
    return _number(text, "a number of seconds > 0", lambda x: x > 0)


def fraction(text: str) -> float:
    """A share of a whole that cannot be all of it: 0 <= x < 1 (warm-up share, loss rate)."""
    return _number(text, "a number from 0 up to, not including, 1", lambda x: 0 <= x < 1)
