"""The shared argparse types: each accepts exactly its range and names what is allowed."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any

import pytest

from sglang_tpu import cli_types

pytestmark = pytest.mark.unit

CASES: list[tuple[Callable[[str], Any], list[str], list[str]]] = [
    (cli_types.positive_int, ["1", " 7 "], ["0", "-1", "1.5", ""]),
    (cli_types.non_negative_int, ["0", "3"], ["-1", "x"]),
    (cli_types.positive_int_or_minus_one, ["-1", "1", "8192"], ["0", "-2"]),
    (cli_types.port, ["0", "65535"], ["-1", "65536", "http"]),
    (cli_types.nonzero_port, ["1", "65535"], ["0", "65536"]),
    (cli_types.positive_float, ["0.001", "5"], ["0", "-0.5", "inf", "nan"]),
    (cli_types.non_negative_float, ["0", "2.5"], ["-0.001", "inf"]),
    (cli_types.duration_seconds, ["0.5", "600"], ["0", "-1", "nan"]),
    (cli_types.fraction, ["0", "0.999"], ["1", "-0.1", "nan"]),
]


@pytest.mark.parametrize(
    ("kind", "good", "bad"), CASES, ids=[kind.__name__ for kind, _, _ in CASES]
)
def test_each_type_takes_its_range_and_refuses_the_rest(
    kind: Callable[[str], Any], good: list[str], bad: list[str]
) -> None:
    for text in good:
        assert kind(text) == type(kind(text))(text.strip())
    for text in bad:
        with pytest.raises(
            argparse.ArgumentTypeError, match="^" + re.escape(f"{text!r} is not allowed; allowed: ")
        ):
            kind(text)
