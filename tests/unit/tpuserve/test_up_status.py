"""`tpuserve up`'s two views of a load agree: the live table and the ``--json`` load lines are
built from one `LoadSnapshot`, and JSON lines appear only when asked for."""

from __future__ import annotations

import io
import json
import time

import pytest
from rich.console import Console

from tpuserve.up.load_driver import LoadStats, percentile
from tpuserve.up.status import StatusLines, render

pytestmark = pytest.mark.unit


def stats_after_two_requests() -> LoadStats:
    stats = LoadStats()
    stats.sent, stats.done, stats.failed, stats.in_flight = 3, 2, 1, 0
    stats.prompt_tokens, stats.cached_tokens, stats.output_tokens = 1000, 750, 40
    now = time.monotonic()
    stats.recent.extend([(now, 0.010, 20), (now, 0.030, 20)])
    stats.last_error = "HTTP 503: busy"
    return stats


def test_snapshot_counts_hit_rate_and_ttft_percentiles() -> None:
    snapshot = stats_after_two_requests().snapshot()
    assert (snapshot.sent, snapshot.done, snapshot.failed) == (3, 2, 1)
    assert snapshot.prefix_hit_rate == 0.75
    assert (snapshot.ttft_p50_seconds, snapshot.ttft_p99_seconds) == (0.010, 0.030)
    assert snapshot.requests_per_second > 0
    assert LoadStats().snapshot().prefix_hit_rate == 0.0  # no usage seen yet


def test_percentile_of_nothing_is_none() -> None:
    assert percentile([], 0.5) is None
    assert percentile([1.0, 2.0, 3.0], 0.5) == 2.0


def test_load_lines_carry_the_snapshot_the_table_shows() -> None:
    snapshot = stats_after_two_requests().snapshot()
    out = io.StringIO()
    StatusLines(True, out).load(snapshot, "shared-prefix", "precise")
    (line,) = out.getvalue().splitlines()
    event = json.loads(line)
    assert event["event"] == "load"
    assert (event["load"], event["policy"]) == ("shared-prefix", "precise")
    assert (event["done"], event["failed"], event["prefix_hit_rate"]) == (2, 1, 0.75)
    assert event["last_error"] == "HTTP 503: busy"

    screen = io.StringIO()
    Console(file=screen, width=200).print(
        render(snapshot, "shared-prefix", "precise", "http://127.0.0.1:8000")
    )
    table = screen.getvalue()
    assert "75.0%" in table
    assert "10 ms" in table
    assert "30 ms" in table
    assert "last error: HTTP 503: busy" in table


def test_ready_and_stopped_lines_and_silence_without_json() -> None:
    out = io.StringIO()
    lines = StatusLines(True, out)
    lines.ready("http://127.0.0.1:8000", "qwen", ["http://127.0.0.1:9001"], None)
    lines.stopped(1, ["engine 0"])
    ready, stopped = (json.loads(line) for line in out.getvalue().splitlines())
    assert ready == {
        "event": "ready",
        "base_url": "http://127.0.0.1:8000/v1",
        "router": "http://127.0.0.1:8000",
        "model": "qwen",
        "workers": ["http://127.0.0.1:9001"],
        "metrics": "http://127.0.0.1:8000/metrics",
        "prometheus": None,
    }
    assert stopped == {"event": "stopped", "exit_code": 1, "exited": ["engine 0"]}

    quiet = io.StringIO()
    StatusLines(False, quiet).error("nope")
    assert quiet.getvalue() == ""
