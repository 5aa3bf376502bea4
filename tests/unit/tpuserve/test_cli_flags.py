"""Every flag of every `tpuserve` subcommand is documented by --help, and every numeric flag
follows `sglang_tpu.cli_types`: a negative or unreadable value exits 2 with a message naming
the flag, the value and what is allowed (never a crash, never silently accepted)."""

from __future__ import annotations

import argparse

import pytest

from tpuserve import cli

pytestmark = pytest.mark.unit


def is_numeric(action: argparse.Action) -> bool:
    """Options whose type turns text into a number (whatever the function is called)."""
    kind = action.type
    if not action.option_strings or not callable(kind) or kind is str:
        return False
    for sample in ("1", "0.5"):
        try:
            value = kind(sample)
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            continue
        if isinstance(value, int | float) and not isinstance(value, bool):
            return True
    return False


def parser_of(command: cli.Command) -> argparse.ArgumentParser:
    return cli.build_parser(command)[1]


def numeric_options() -> list[tuple[str, str]]:
    """(command words, long flag) of every numeric option of every subcommand."""
    return [
        (" ".join(command.words), action.option_strings[-1])
        for command in cli.COMMANDS
        for action in parser_of(command)._actions
        if is_numeric(action)
    ]


NUMERIC = numeric_options()


def test_the_walk_finds_the_numeric_flags_of_every_part() -> None:
    assert {
        ("engine sim", "--time-scale"),
        ("engine sim", "--chunked-prefill-size"),
        ("router", "--port"),
        ("router", "--health-check-interval"),
        ("operator", "--resync-seconds"),
        ("render", "--router-replicas"),
        ("up", "--workers"),
        ("bench", "--kv-event-drop"),
        ("cluster up", "--timeout"),
    } <= set(NUMERIC)


@pytest.mark.parametrize("value", ["-5", "garbage", "nan"])
@pytest.mark.parametrize(("words", "flag"), NUMERIC, ids=[f"{w}{f}" for w, f in NUMERIC])
def test_numeric_flags_refuse_negative_and_unreadable_values(
    words: str, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main([*words.split(), f"{flag}={value}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: {value!r} is not allowed; allowed: " in err


@pytest.mark.parametrize("command", cli.COMMANDS, ids=lambda c: " ".join(c.words))
def test_help_documents_every_flag(command: cli.Command) -> None:
    parser = parser_of(command)
    text = parser.format_help()
    for action in parser._actions:
        for flag in action.option_strings:
            assert flag in text, flag
        if action.option_strings and action.help != argparse.SUPPRESS:
            assert action.help, action.option_strings
