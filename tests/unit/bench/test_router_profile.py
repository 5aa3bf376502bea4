"""bench/router_profile.py: it counts a cProfile file's calls, all and Python functions'."""

from __future__ import annotations

import cProfile
from pathlib import Path

import pytest

from bench.router_profile import calls

pytestmark = pytest.mark.unit


def _leaf(i: int) -> int:
    return len(str(i))


def _work(n: int) -> int:
    return sum(_leaf(i) for i in range(n))


def test_calls_grow_by_what_the_extra_work_calls(tmp_path: Path) -> None:
    counted = []
    for n in (10, 110):
        out = tmp_path / f"{n}.prof"
        profile = cProfile.Profile()
        profile.runcall(_work, n)
        profile.dump_stats(str(out))
        counted.append(calls(out))
    (few_all, few_py), (many_all, many_py) = counted
    # each further item: _leaf and the generator's step (Python), len (a built-in)
    assert many_py - few_py == 2 * 100
    assert many_all - few_all == 3 * 100
