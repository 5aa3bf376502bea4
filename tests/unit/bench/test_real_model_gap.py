"""Real model code's steps on the chip against the performance model (issue 58, item 3):
the committed lane results (Transformers' Qwen3 on a v5e) beside `StepTimer`, and the eager
modes' per-layer host time the model takes from them."""

from __future__ import annotations

import json
import statistics
from types import ModuleType

import pytest

from sglang_tpu import perf_model
from sglang_tpu.perf_model import CALIBRATED, StepTimer
from sglang_tpu.topology import lookup
from tests.bench_scripts import load_bench_script

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def gap() -> ModuleType:
    return load_bench_script("real_model_gap", "bench_real_model_gap")


@pytest.fixture(scope="module")
def rows(gap: ModuleType) -> list:  # type: ignore[type-arg]
    found: list = gap.gaps(json.loads(gap.RESULTS.read_text()))  # type: ignore[type-arg]
    return found


def test_every_timed_run_on_the_chip_has_both_steps(gap: ModuleType, rows: list) -> None:  # type: ignore[type-arg]
    results = json.loads(gap.RESULTS.read_text())
    timed = [r for r in results["tpu_runs"] if r["prefill_ms"] is not None]
    assert (
        len(timed) == 6
    )  # tiny: eager, fuse, eager at "highest", compile; 0.6B x 4: eager, compile
    assert len(rows) == 2 * len(timed)
    assert {(r.shape, r.mode) for r in rows} >= {("qwen3-0.6b-4l", "eager"), ("tiny", "fuse")}


def test_no_real_step_beats_the_models_device_half(rows: list) -> None:  # type: ignore[type-arg]
    """The device half stands for the chip's bare compiled step: real model code adds to it
    (sampling, masks, the cache, the copy to the host), never takes away."""
    for r in rows:
        assert r.measured_ms > r.device_ms, r


def test_a_compiled_steps_extra_stays_within_the_fitted_host_half(rows: list) -> None:  # type: ignore[type-arg]
    """What a compiled step of a bare Python loop adds beyond the device half (1.7-5.0 ms)
    is less than the host half fitted to published engines (8 ms + 29 us a sequence), which
    also holds a scheduler: the data gives no reason to change the compiled host half."""
    compiled = [r for r in rows if r.mode == "compile"]
    assert len(compiled) == 4
    for r in compiled:
        assert 0 < r.beyond_device_ms < r.host_ms, r


def test_the_eager_per_layer_figure_is_the_median_of_the_measured_ones(
    gap: ModuleType,
    rows: list,  # type: ignore[type-arg]
) -> None:
    per_layer = gap.eager_layer_ms(rows)
    assert len(per_layer) == 6  # 2 shapes x 2 steps, eager; tiny x 2 steps, DeferAndFuse
    assert CALIBRATED.eager_layer_seconds == round(statistics.median(per_layer) / 1e3, 4)
    # eager over compiled per layer, shape by shape, within 25% of the median: one figure fits
    for value in per_layer:
        assert abs(value / statistics.median(per_layer) - 1) < 0.25


def test_the_eager_modes_add_the_per_layer_host_time() -> None:
    shape, profile = lookup("v5e", "1x1"), perf_model.get_profile("qwen3-0.6b")
    compiled = StepTimer(shape, profile)
    for mode in ("eager", "eager-defer-and-fuse", "eager-debug"):
        eager = StepTimer(shape, profile, execution_mode=mode)
        extra = eager.decode_step_seconds(8, 8192) - compiled.decode_step_seconds(8, 8192)
        assert extra == pytest.approx(profile.layers * CALIBRATED.eager_layer_seconds)
    with pytest.raises(ValueError, match="execution_mode: 'lazy' is not allowed; allowed: comp"):
        StepTimer(shape, profile, execution_mode="lazy")


def test_docs_table_is_what_the_bench_prints(gap: ModuleType, rows: list) -> None:  # type: ignore[type-arg]
    """docs/engine-sim.md shows `bench/real_model_gap.py`'s output as printed."""
    docs = (gap.HERE.parent / "docs" / "engine-sim.md").read_text()
    assert gap.markdown(rows) in docs
