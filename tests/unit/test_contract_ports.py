"""Tests' contract ports are drawn again when they overlap the contract's own default ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import tests.contract_env as contract_env_module
from sglang_tpu.contract.problems import ContractError
from tests.contract_env import contract_env, contract_ports

pytestmark = pytest.mark.unit


def env_of(ports: list[int]) -> dict[str, str]:
    http, kv = ports
    return contract_env() | {"TPUSERVE_HTTP_PORT": str(http), "TPUSERVE_KV_EVENTS_PORT": str(kv)}


def draws(*drawn: list[int]) -> Iterator[list[int]]:
    yield from drawn


def test_a_draw_overlapping_the_dist_init_ports_is_made_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drawn = draws([20003, 15001], [15002, 29500], [15003, 15004])  # dist-init, MASTER_PORT
    monkeypatch.setattr(contract_env_module, "free_ports", lambda count: next(drawn))
    assert contract_ports(2, env_of) == [15003, 15004]


def test_any_other_problem_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(contract_env_module, "free_ports", lambda count: [15001, 15002])
    with pytest.raises(ContractError, match="TPUSERVE_TPU_TOPOLOGY"):
        contract_ports(2, lambda ports: env_of(ports) | {"TPUSERVE_TPU_TOPOLOGY": "9x9"})
