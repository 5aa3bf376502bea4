"""The device half of the performance model against the steps measured on a v5e chip."""

from __future__ import annotations

from types import ModuleType

import pytest

from sglang_tpu import perf_model as pm
from tests.bench_scripts import load_bench_script

pytestmark = pytest.mark.unit


def _load(name: str) -> ModuleType:
    return load_bench_script(name)


def test_the_benchmarks_shapes_are_the_catalogs_profiles() -> None:
    """bench/tpu_steps.py builds each model from its config; the profile must say the same."""
    steps = _load("tpu_steps")
    for arch in steps.ARCHS.values():
        profile = pm.get_profile(arch.name)
        assert (profile.layers, profile.hidden_size, profile.attention_heads) == (
            arch.layers, arch.hidden, arch.heads
        )  # fmt: skip
        assert (profile.kv_heads, profile.head_dim, profile.vocab_size) == (
            arch.kv_heads, arch.head_dim, arch.vocab
        )  # fmt: skip
        assert profile.parameters == pytest.approx(arch.parameters, rel=0.005)
        assert profile.kv_bytes_per_token() == arch.kv_bytes_per_token
        assert profile.tied_embeddings


def test_the_calibrated_device_model_is_within_15_percent_of_the_chip() -> None:
    """Median absolute error on the measured v5e steps, prefill and decode separately."""
    fit = _load("perf_model_fit")
    rows = fit.fit_rows(fit.read_rows())
    summary = fit.summary(rows)
    assert summary["prefill_rows"] >= 12
    assert summary["decode_rows"] >= 12
    assert {r.model for r in rows} >= {"qwen3-0.6b", "llama-3.2-1b", "qwen3-4b"}
    assert summary["prefill_median_abs_error"] <= 0.15
    assert summary["decode_median_abs_error"] <= 0.15


def test_the_fit_leaves_out_what_describes_a_kernel_not_the_chip() -> None:
    fit = _load("perf_model_fit")
    materialised = fit.Measured("qwen3-0.6b", "prefill", 8192, 0, 993.6, "x", kernel=False)
    flash = fit.Measured("qwen3-0.6b", "prefill", 8192, 0, 120.3, "x", kernel=True)
    paged = fit.Measured("qwen3-0.6b", "decode", 64, 1024, 53.3, "x", kernel=True)
    dense = fit.Measured("qwen3-0.6b", "decode", 64, 1024, 14.5, "x", kernel=False)
    assert fit.fit_rows([materialised, flash, paged, dense]) == [dense, flash]


def test_docs_device_table_is_what_the_fit_bench_prints() -> None:
    """After changing the model or the results run `bench/perf_model_fit.py --update-docs`."""
    fit = _load("perf_model_fit")
    text = fit.DOCS.read_text()
    assert fit.replace_block(text, "perf-model-device", fit.markdown(fit.read_rows())) == text
