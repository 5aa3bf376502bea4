"""bench/host_tier_goodput.py: group mooncake-full takes the full trace's path as --trace,
refuses it missing (naming the flag and where the trace is), and sizes from its window."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench.host_tier_goodput import MOONCAKE_WINDOW_S, full_trace, mooncake_window, write_window

pytestmark = pytest.mark.unit


def _error(only: str | None, trace: str | None, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        full_trace(argparse.ArgumentParser(prog="host_tier_goodput.py"), only, trace)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_mooncake_full_without_a_trace_names_the_flag_and_the_download(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = _error("mooncake-full", None, capsys)
    assert "--trace: --only mooncake-full needs PATH" in err
    assert "github.com/kvcache-ai/Mooncake" in err
    assert "FAST25-release/traces/conversation_trace.jsonl" in err


def test_a_missing_trace_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "conversation_trace.jsonl"
    err = _error("mooncake-full", str(missing), capsys)
    assert f"--trace: {missing} is not a file" in err
    assert "github.com/kvcache-ai/Mooncake" in err


def test_a_trace_is_refused_for_another_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("")
    err = _error("w4", str(path), capsys)
    assert "--trace: only with --only mooncake-full, not --only w4" in err


def test_the_trace_is_optional_elsewhere_and_taken_when_given(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    assert full_trace(parser, None, None) is None
    assert full_trace(parser, "w4live", None) is None
    path = tmp_path / "t.jsonl"
    path.write_text("")
    assert full_trace(parser, "mooncake-full", str(path)) == path
    assert full_trace(parser, None, str(path)) == path


def test_the_window_keeps_the_first_minutes_and_sizes_each_request(tmp_path: Path) -> None:
    lines = [
        {"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [0, 1]},
        {"timestamp": 1000, "input_length": 1100, "output_length": 20, "hash_ids": [0, 1, 2]},
        {"timestamp": 2000, "input_length": 600, "output_length": 5, "hash_ids": [0, 3]},
        {"timestamp": MOONCAKE_WINDOW_S * 1000, "input_length": 512, "hash_ids": [0]},
    ]
    path = tmp_path / "conversation_trace.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    requests, live, peak, sizes = mooncake_window(path)
    assert requests == 3
    assert sizes == [1034, 1120, 605]  # prompt + output tokens
    assert 0 < live <= peak  # blocks 0 and 1 are shared until 1 s, block 0 until 2 s


def test_the_window_file_holds_the_first_lines_and_refuses_an_unsorted_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    limit = int(MOONCAKE_WINDOW_S * 1000)
    lines = [json.dumps({"timestamp": t, "input_length": 512}) + "\n" for t in (0, 5, limit)]
    path = tmp_path / "conversation_trace.jsonl"
    path.write_text("".join(lines))
    window = write_window(path)
    assert window.parent == tmp_path / "tmp"
    assert window.read_text() == "".join(lines[:2])
    path.write_text("".join([lines[0], lines[2], lines[1]]))
    with pytest.raises(ValueError, match="not in timestamp order"):
        write_window(path)
