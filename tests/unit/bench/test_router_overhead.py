"""bench/router_overhead.py starts each tpuserve variant with the flags its name asks for."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.router_overhead import policy_entry, tpuserve_router, upstreams_cpu_seconds
from bench.router_overhead_summary import cpu_summary, print_summary

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


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--profile-at-rate", "--perf", "d"],
            "--profile-at-rate needs --cpu-rate R and a profiler",
        ),
        (
            ["--profile-at-rate", "--cpu-rate", "250"],
            "--profile-at-rate needs --cpu-rate R and a profiler",
        ),
        (["--cpu-rate", "-5"], "--cpu-rate -5: must be 0 (off) or a positive rate"),
    ],
)
def test_profiling_at_rate_needs_a_rate_and_a_profiler(flags: list[str], message: str) -> None:
    bench = Path(__file__).resolve().parents[3] / "bench" / "router_overhead.py"
    run = subprocess.run(
        [sys.executable, str(bench), *flags], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2
    assert message in run.stderr


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


def test_the_upstreams_cpu_is_every_thread_of_every_upstream() -> None:
    """What core 0's upstreams spent: the CPU of each process, all its threads (a KV-event
    publisher's I/O thread counts)."""
    busy = "import threading, time\n" + "\n".join([
        "spun = threading.Barrier(2)",
        "def spin():",
        "    end = time.thread_time() + 0.3",
        "    while time.thread_time() < end: pass",
        "    spun.wait()",
        "    time.sleep(30)",  # a thread that ended would leave /proc/PID/task with its time
        "threading.Thread(target=spin, daemon=True).start()",
        "end = time.thread_time() + 0.3",
        "while time.thread_time() < end: pass",
        "spun.wait(); print('done', flush=True); time.sleep(30)",
    ])  # fmt: skip
    procs = [
        subprocess.Popen([sys.executable, "-c", busy], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "done\n"
        used = upstreams_cpu_seconds([p.pid for p in procs])
        assert used >= 4 * 0.3 * 0.9  # two processes, two spinning threads each
        assert upstreams_cpu_seconds([]) == 0.0
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_the_summary_reports_the_upstreams_cpu_per_request(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def row(cpu: float, upstreams: float) -> dict[str, float]:
        return {"cpu_us_per_request": cpu, "saturation_rps": 1000.0,
                "upstreams_cpu_us_per_request": upstreams}  # fmt: skip

    anchor = "sglang-router 0.3.2 cache_aware"
    rows = {
        "tpuserve precise": [row(200, 900), row(220, 800), row(260, 1000)],
        anchor: [row(200, 700), row(200, 650), row(200, 760)],
    }
    summary = cpu_summary(rows, anchor)
    assert summary["tpuserve precise"]["upstreams_cpu_us_per_request"] == 900
    assert summary[anchor]["upstreams_cpu_us_per_request"] == 700
    print_summary(summary, argparse.Namespace(cpu_rate=0, cpu_only=True))
    out = capsys.readouterr().out.splitlines()
    assert "upstreams' CPU/request" in out[0].split(" | ")
    assert out[1].split(" | ")[-1] == "900 us"
