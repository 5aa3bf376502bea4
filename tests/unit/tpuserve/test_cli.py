"""The `tpuserve` command dispatches to the longest matching subcommand and explains itself."""

from __future__ import annotations

import pytest

from tpuserve import cli

pytestmark = pytest.mark.unit


def test_longest_command_wins() -> None:
    command, rest = cli.find_command(["engine", "sim", "--port", "1"])
    assert command.words == ("engine", "sim")
    assert rest == ["--port", "1"]


def test_unknown_command_exits_2_with_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["nonsense"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'nonsense'" in err
    assert "engine sim" in err


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in cli.COMMANDS:
        assert " ".join(command.words) in out
