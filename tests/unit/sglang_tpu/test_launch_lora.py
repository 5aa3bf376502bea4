"""LoRA adapters in the launch contract: checked, fetched like the model, and passed to SGLang
(`--enable-lora --lora-paths NAME=PATH`) or to the twin, which serves and lists them."""

from __future__ import annotations

import argparse

import pytest

from sglang_tpu import launch, lora
from sglang_tpu.contract.launch_contract import LaunchContract
from sglang_tpu.contract.problems import ContractError
from sglang_tpu.sim import cli as sim_cli
from tests.contract_env import contract_env

pytestmark = pytest.mark.unit

ADAPTERS = "sql=hf://org/sql-lora@v2,law=pvc://adapters/law,chat=/adapters/chat"
WEIGHTS = {"TPUSERVE_WEIGHTS_CACHE_DIR": "/w"}


def contract(**extra: str) -> LaunchContract:
    return LaunchContract.from_env(contract_env() | WEIGHTS | extra)


def problem_of(**extra: str) -> str:
    with pytest.raises(ContractError) as caught:
        contract(**extra)
    return str(caught.value)


def after(command: list[str], flag: str) -> list[str]:
    """The values following `flag` up to the next flag."""
    rest = command[command.index(flag) + 1 :]
    end = next((i for i, arg in enumerate(rest) if arg.startswith("--")), len(rest))
    return rest[:end]


def test_sglang_gets_each_adapter_by_name_at_its_local_path() -> None:
    plan = launch.plan(contract(TPUSERVE_LORA_ADAPTERS=ADAPTERS))
    assert "--enable-lora" in plan.command
    assert after(plan.command, "--lora-paths") == [
        "sql=/w/hf/org/sql-lora/v2",
        "law=/mnt/tpuserve/pvc/adapters/law",
        "chat=/adapters/chat",
    ]
    fetched = [str(item.source) for item in plan.fetches]
    assert fetched == [
        "/models/llama",
        "hf://org/sql-lora@v2",
        "pvc://adapters/law",
        "/adapters/chat",
    ]


def test_without_adapters_sglang_gets_no_lora_flags() -> None:
    command = launch.plan(contract()).command
    assert not set(lora.LORA_FLAGS) & set(command)


def test_the_twin_serves_the_adapters_under_their_names() -> None:
    plan = launch.plan(contract(TPUSERVE_LORA_ADAPTERS=ADAPTERS, TPUSERVE_ENGINE="simulated"))
    assert plan.command[:3] == ["tpuserve", "engine", "sim"]
    parser = argparse.ArgumentParser()
    sim_cli.configure(parser)
    args = parser.parse_args(plan.command[3:])
    assert args.enable_lora
    names = [name for name, _ in lora.parse_lora_paths(args.lora_paths)]
    assert names == ["sql", "law", "chat"]
    assert plan.fetches == []


def test_adapters_round_trip_through_the_environment() -> None:
    first = contract(TPUSERVE_LORA_ADAPTERS=ADAPTERS)
    env = first.to_env()
    assert env["TPUSERVE_LORA_ADAPTERS"] == ADAPTERS
    again = LaunchContract.from_env(env)
    assert again.adapter_sources == first.adapter_sources
    assert [name for name, _ in again.adapter_sources] == ["sql", "law", "chat"]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("base:sql=/a", "adapter name 'base:sql' is not allowed; allowed: letters"),
        ("sql=/a,sql=/b", "adapter name 'sql' repeats"),
        ("sql=s3://bucket/a", "'s3://bucket/a' is not hf://, gs://, pvc:// or an absolute path"),
        ("/adapters/sql", "'/adapters/sql' is not NAME=SOURCE"),
        (",".join(f"a{i}=/a" for i in range(lora.MAX_ADAPTERS + 1)), "33 adapters; at most 32"),
    ],
    ids=["colon", "repeat", "scheme", "no-name", "too-many"],
)
def test_a_bad_adapter_list_is_refused_naming_the_variable(value: str, says: str) -> None:
    message = problem_of(TPUSERVE_LORA_ADAPTERS=value)
    assert "TPUSERVE_LORA_ADAPTERS=" in message
    assert says in message


def test_downloaded_adapters_need_a_weights_cache() -> None:
    env = contract_env() | {"TPUSERVE_LORA_ADAPTERS": "sql=hf://org/sql-lora"}
    with pytest.raises(ContractError) as caught:
        LaunchContract.from_env(env)
    assert "TPUSERVE_WEIGHTS_CACHE_DIR" in str(caught.value)
    assert "required to download hf://org/sql-lora" in str(caught.value)


def test_extra_lora_flags_conflict_with_the_adapters_variable() -> None:
    message = problem_of(
        TPUSERVE_LORA_ADAPTERS="sql=/a", TPUSERVE_SGLANG_EXTRA_ARGS="--lora-paths x=/b"
    )
    assert "TPUSERVE_SGLANG_EXTRA_ARGS=" in message
    assert "--lora-paths" in message
    assert "TPUSERVE_LORA_ADAPTERS" in message


def test_extra_lora_flags_alone_are_passed_on() -> None:
    command = launch.plan(contract(TPUSERVE_SGLANG_EXTRA_ARGS="--lora-paths x=/b")).command
    assert command[-2:] == ["--lora-paths", "x=/b"]
