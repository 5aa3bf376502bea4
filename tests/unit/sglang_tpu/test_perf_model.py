"""The performance model: profiles, fit check with the missing GiB, monotone step times."""

from __future__ import annotations

import pytest

from sglang_tpu import perf_model as pm
from sglang_tpu.topology import lookup

pytestmark = pytest.mark.unit


def test_required_profiles_exist() -> None:
    for name in ("llama-3.1-8b", "qwen3-8b", "qwen3-32b", "llama-3.3-70b", "qwen3-235b-a22b"):
        assert pm.get_profile(name).name == name
    assert pm.get_profile("qwen3-235b-a22b").is_moe


@pytest.mark.parametrize(
    ("hf_id", "profile"),
    [
        ("Qwen/Qwen3-8B", "qwen3-8b"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.3-70b"),
        ("/models/Qwen3-32B-FP8", "qwen3-32b"),
        ("Qwen/Qwen3-235B-A22B-Instruct-2507", "qwen3-235b-a22b"),
    ],
)
def test_hf_ids_map_to_profiles(hf_id: str, profile: str) -> None:
    found = pm.lookup_hf_model(hf_id)
    assert found is not None
    assert found.name == profile


def test_unknown_model_is_none_and_unknown_profile_names_allowed() -> None:
    assert pm.lookup_hf_model("mistralai/Mistral-7B") is None
    with pytest.raises(ValueError, match=r"--model-profile: 'gpt-9'.*llama-3.1-8b"):
        pm.get_profile("gpt-9")


def test_llama_8b_kv_is_128_kib_per_token() -> None:
    assert pm.get_profile("llama-3.1-8b").kv_bytes_per_token("auto") == 128 * 1024


def test_8b_fits_one_v6e_chip_and_70b_does_not_with_the_missing_gib() -> None:
    pm.check_fits(lookup("v6e", "1x1"), "llama-3.1-8b", "bf16", "auto", 8192)
    with pytest.raises(pm.ModelDoesNotFit, match=r"short by \d+\.\d GiB") as err:
        pm.check_fits(lookup("v6e", "1x1"), "llama-3.3-70b", "bf16", "auto", 8192)
    assert err.value.missing_bytes > 100 * 2**30
    pm.check_fits(lookup("v6e", "2x4"), "llama-3.3-70b", "bf16", "auto", 8192)


def test_bad_quantization_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"quantization: 'fp3'"):
        pm.check_fits(lookup("v6e", "2x4"), "qwen3-8b", "fp3", "auto", 1024)


def test_step_times_grow_with_work_and_shrink_with_chips() -> None:
    one = pm.StepTimer(lookup("v6e", "1x1"), pm.get_profile("llama-3.1-8b"))
    eight = pm.StepTimer(lookup("v6e", "2x4"), pm.get_profile("llama-3.1-8b"))
    assert one.step_seconds() == pm.STEP_OVERHEAD_SECONDS
    assert one.prefill_seconds(2048) > one.prefill_seconds(512) > one.prefill_seconds(16)
    assert one.prefill_seconds(2048, cached_tokens=4096) > one.prefill_seconds(2048)
    assert one.decode_step_seconds(64, 64 * 2000) > one.decode_step_seconds(1, 2000)
    assert eight.prefill_seconds(4096) < one.prefill_seconds(4096)


def test_moe_small_batch_decode_reads_fewer_bytes_than_all_weights() -> None:
    timer = pm.StepTimer(lookup("tpu7x", "2x2x2"), pm.get_profile("qwen3-235b-a22b"), "fp8")
    dense_equivalent = timer.weight_bytes / timer._bytes_per_second
    assert timer.decode_step_seconds(1, 1000) - timer.overhead_seconds < dense_equivalent / 4


def test_kv_pool_tokens_is_what_is_left_after_weights() -> None:
    shape = lookup("v6e", "1x1")
    profile = pm.get_profile("llama-3.1-8b")
    tokens = pm.kv_pool_tokens(shape, profile)
    assert (
        tokens * profile.kv_bytes_per_token() <= pm.usable_hbm_bytes(shape) - profile.weight_bytes()
    )
    assert tokens > 50_000
