"""bench/router_overhead.py starts each tpuserve variant with the flags its name asks for."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.router_overhead import policy_entry, tpuserve_router

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("precise", None),
        ("precise+kv", True),
        ("precise+nokv", False),
        ("precise+kv+auth", True),
        ("cost+auth+nokv", False),
    ],
)
def test_a_policy_entry_says_whether_the_router_reads_kv_events(
    entry: str, expected: bool | None
) -> None:
    assert policy_entry(entry).kv_events is expected


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("precise+kv+nokv", "+kv and +nokv contradict each other"),
        ("precise+kvv", "unknown modifier 'kvv' (allowed: +kv, +nokv, +auth)"),
    ],
)
def test_a_policy_entry_with_a_modifier_it_cannot_honour_is_refused(
    entry: str, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        policy_entry(entry)


@pytest.mark.parametrize(
    ("entry", "name", "auth"),
    [
        ("precise", "precise", False),
        ("cost+auth+nokv", "cost", True),
        ("precise+kv", "precise", False),
    ],
)
def test_a_policy_entry_names_its_policy_and_whether_it_uses_api_keys(
    entry: str, name: str, auth: bool
) -> None:
    parsed = policy_entry(entry)
    assert (parsed.name, parsed.auth) == (name, auth)


@pytest.mark.parametrize(
    ("kv_events", "flags", "label"),
    [
        (None, [], "tpuserve precise"),
        (True, ["--kv-events"], "tpuserve precise +kv-events"),
        (False, ["--no-kv-events"], "tpuserve precise -kv-events"),
    ],
)
def test_each_variant_runs_the_router_with_its_kv_event_flag(
    kv_events: bool | None, flags: list[str], label: str
) -> None:
    kind = tpuserve_router("precise", kv_events=kv_events)
    command = kind.command(8000, ["http://127.0.0.1:9000"])
    assert kind.label == label
    assert [a for a in command if "kv-events" in a] == flags
    assert command[command.index("--policy") + 1] == "precise"


def test_one_profiler_at_a_time() -> None:
    bench = Path(__file__).resolve().parents[3] / "bench" / "router_overhead.py"
    run = subprocess.run(
        [sys.executable, str(bench), "--py-spy", "a", "--perf", "b"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "--py-spy and --perf: one profiler at a time" in run.stderr


def test_the_bench_refuses_a_bad_policy_entry_before_starting_anything() -> None:
    bench = Path(__file__).resolve().parents[3] / "bench" / "router_overhead.py"
    run = subprocess.run(
        [sys.executable, str(bench), "--policies", "precise+nokv+kv"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "'precise+nokv+kv': +kv and +nokv contradict each other" in run.stderr
