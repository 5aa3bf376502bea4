"""The cold-start model and the compile cache key: phases from model size, bandwidth and the
cache's answer; the key changes with model, slice and engine version and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_tpu import cold_start, compile_cache, perf_model
from sglang_tpu.cold_start import (
    GB,
    PHASES,
    TPU_FIGURES,
    ColdStartFigures,
    ColdStartReport,
    sim_cache_holds,
    write_sim_cache_entry,
)
from sglang_tpu.contract.launch_contract import LaunchContract
from tests.contract_env import contract_env

pytestmark = pytest.mark.unit


def contract(**env: str) -> LaunchContract:
    base = contract_env(model="hf://Qwen/Qwen3-8B") | {
        "TPUSERVE_WEIGHTS_CACHE_DIR": "/w",
        "TPUSERVE_ENGINE_VERSION": "ghcr.io/tpuserve/tpuserve-tpu:0.3.0",
    }
    return LaunchContract.from_env(base | env)


def test_the_key_is_slice_model_and_engine_version() -> None:
    assert compile_cache.cache_key(contract()) == (
        "v6e-2x4/hf_Qwen_Qwen3-8B/ghcr.io_tpuserve_tpuserve-tpu_0.3.0"
    )


@pytest.mark.parametrize(
    "change",
    [
        {"TPUSERVE_MODEL": "hf://Qwen/Qwen3-14B"},
        {"TPUSERVE_TPU_TOPOLOGY": "2x2", "TPUSERVE_CHIPS_PER_HOST": "4"},
        {"TPUSERVE_ENGINE_VERSION": "ghcr.io/tpuserve/tpuserve-tpu:0.4.0"},
    ],
)
def test_a_new_model_slice_or_engine_is_a_new_key(change: dict[str, str]) -> None:
    assert compile_cache.cache_key(contract(**change)) != compile_cache.cache_key(contract())


def test_what_compiled_programs_do_not_depend_on_keeps_the_key() -> None:
    served = contract(TPUSERVE_SERVED_MODEL_NAME="chat", TPUSERVE_REPLICA_INDEX="3")
    assert compile_cache.cache_key(served) == compile_cache.cache_key(contract())


def test_the_keyed_directory_is_below_the_cache_root() -> None:
    keyed = compile_cache.cache_dir(contract(TPUSERVE_COMPILE_CACHE_DIR="/cache/"))
    assert keyed == f"/cache/{compile_cache.cache_key(contract())}"
    assert compile_cache.cache_dir(contract()) is None


def test_an_8b_model_reads_16_gb_and_compiles_minutes_cold_and_less_warm() -> None:
    weights = perf_model.get_profile("qwen3-8b").weight_bytes("bf16")
    assert 15 * GB < weights < 17.5 * GB
    cold = TPU_FIGURES.phases(weights, cache_hit=False)
    warm = TPU_FIGURES.phases(weights, cache_hit=True)
    assert list(cold) == list(PHASES)
    assert cold["weights"] == pytest.approx(weights / (1.2 * GB))
    assert cold["compile"] == pytest.approx(8 * (2.0 + 1.0 * 32))  # measured per layer x shapes
    assert warm["compile"] == pytest.approx(8 * (1.2 + 0.34 * 32))
    assert 0.25 < warm["compile"] / cold["compile"] < 0.4  # the v5e's warm/cold (0.25-0.36)
    assert {k: v for k, v in cold.items() if k != "compile"} == {
        k: v for k, v in warm.items() if k != "compile"
    }


def test_compile_figures_scale_with_layers_and_warmup_shapes() -> None:
    one_layer_cold, one_layer_warm = cold_start.compile_figures(1, shapes=1)
    cold, warm = cold_start.compile_figures(36)
    assert one_layer_cold == pytest.approx(3.0)
    assert cold == pytest.approx(8 * (2.0 + 36.0))
    assert warm < cold
    with pytest.raises(ValueError, match="layers 0"):
        cold_start.compile_figures(0)
    assert one_layer_warm < one_layer_cold


def test_weights_time_follows_bytes_per_host_and_bandwidth() -> None:
    figures = ColdStartFigures(read_gb_per_second=2.0)
    assert figures.phases(8 * GB, cache_hit=False)["weights"] == pytest.approx(4.0)


def test_a_report_round_trips_and_refuses_what_is_not_one() -> None:
    report = ColdStartReport({"pull": 0.0, "weights": 1.5, "compile": 3.4, "warmup": 0.05}, "hit")
    assert ColdStartReport.from_json(report.as_json()) == ColdStartReport(report.seconds, "hit", "")
    assert report.total_seconds == pytest.approx(4.95)
    with pytest.raises(ValueError, match="allowed"):
        ColdStartReport.from_json({**report.as_json(), "compile_cache": {"result": "maybe"}})
    with pytest.raises(ValueError, match="not a cold-start report"):
        ColdStartReport.from_json({"phases": {"pull": 1}})


def test_the_twin_holds_only_the_key_it_wrote(tmp_path: Path) -> None:
    assert not sim_cache_holds(tmp_path, "a")
    write_sim_cache_entry(tmp_path / "keyed", "a")
    assert sim_cache_holds(tmp_path / "keyed", "a")
    assert not sim_cache_holds(tmp_path / "keyed", "b")
    assert not sim_cache_holds(None, "a")
