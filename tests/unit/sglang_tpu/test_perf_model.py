"""The performance model: profiles, fit check with the missing GiB, monotone step times."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from bench.perf_model_figures import Workload, fixed
from sglang_tpu import perf_model as pm
from sglang_tpu.topology import lookup

pytestmark = pytest.mark.unit

VALIDATION_BENCH = Path(__file__).resolve().parents[3] / "bench" / "perf_model_validation.py"


def _validation_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("perf_model_validation", VALIDATION_BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


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
    assert one.step_seconds() == pm.CALIBRATED.host_step_seconds
    assert one.prefill_seconds(2048) > one.prefill_seconds(512) > one.prefill_seconds(16)
    assert one.prefill_seconds(2048, cached_tokens=4096) > one.prefill_seconds(2048)
    assert one.decode_step_seconds(64, 64 * 2000) > one.decode_step_seconds(1, 2000)
    assert eight.prefill_seconds(4096) < one.prefill_seconds(4096)


def test_moe_small_batch_decode_reads_fewer_bytes_than_all_weights() -> None:
    timer = pm.StepTimer(lookup("tpu7x", "2x2x2"), pm.get_profile("qwen3-235b-a22b"), "fp8")
    dense_equivalent = timer.weight_bytes / timer.bytes_per_second
    streamed = (
        timer.device_seconds(decode_batch=1, decode_context=1000) - timer.device_fixed_seconds
    )
    assert streamed < dense_equivalent / 4


@pytest.mark.parametrize(
    ("quantization", "bits"), [("mxfp4", 4 + 8 / 32), ("nvfp4", 4 + 8 / 16), ("int4", 4.0)]
)
def test_four_bit_formats_count_their_block_scales(quantization: str, bits: float) -> None:
    profile = pm.get_profile("llama-3.3-70b")
    assert profile.weight_bytes(quantization) == pytest.approx(profile.parameters * bits / 8)


def test_mxfp4_is_smaller_than_nvfp4_and_both_between_int4_and_fp8() -> None:
    profile = pm.get_profile("qwen3-32b")
    sizes = [profile.weight_bytes(q) for q in ("int4", "mxfp4", "nvfp4", "fp8")]
    assert sizes == sorted(sizes)
    assert len(set(sizes)) == 4


def test_four_bit_weights_fit_where_fp8_does_not_and_still_report_the_shortfall() -> None:
    four_chips, one_chip = lookup("v5e", "2x2"), lookup("v5e", "1x1")
    with pytest.raises(pm.ModelDoesNotFit):
        pm.check_fits(four_chips, "llama-3.3-70b", "fp8", "auto", 8192)
    for quantization in ("mxfp4", "nvfp4"):
        pm.check_fits(four_chips, "llama-3.3-70b", quantization, "auto", 8192)
        with pytest.raises(pm.ModelDoesNotFit, match=rf"\({quantization} weights 3\d\.\d GiB"):
            pm.check_fits(one_chip, "llama-3.3-70b", quantization, "auto", 8192)


def test_four_bit_formats_keep_bf16_matmuls_and_stream_fewer_bytes() -> None:
    shape, profile = lookup("v6e", "2x4"), pm.get_profile("llama-3.3-70b")
    bf16, fp8, mxfp4 = (pm.StepTimer(shape, profile, q) for q in ("bf16", "fp8", "mxfp4"))
    assert mxfp4.flops_per_second == bf16.flops_per_second < fp8.flops_per_second
    assert mxfp4.decode_step_seconds(1, 1000) < fp8.decode_step_seconds(1, 1000)


def test_efficiency_knobs_change_the_step_time_they_name() -> None:
    shape, profile = lookup("v6e", "2x2"), pm.get_profile("qwen3-8b")
    base = pm.Efficiency(
        matmul_mfu=0.5, weight_mbu=0.8, kv_mbu=0.8, host_step_seconds=0.005,
        host_sequence_seconds=0.0, device_step_seconds=0.0, device_layer_seconds=0.0,
    )  # fmt: skip
    timer = pm.StepTimer(shape, profile, efficiency=base)
    half_bandwidth = pm.StepTimer(
        shape, profile, efficiency=replace(base, weight_mbu=0.4, kv_mbu=0.4)
    )
    half_flops = pm.StepTimer(
        shape, profile, efficiency=replace(base, matmul_mfu=0.25, attention_mfu=0.285)
    )
    # A memory-bound decode step: halving the bandwidth doubles everything but the host's.
    decode = timer.decode_step_seconds(64, 64 * 2048) - 0.005
    slower = half_bandwidth.decode_step_seconds(64, 64 * 2048) - 0.005
    assert slower == pytest.approx(2 * decode, rel=0.01)  # all but the attention's FLOPs
    # A compute-bound prefill (no KV read but its own): halving the FLOP/s doubles the FLOPs.
    prefill = timer.prefill_seconds(8192) - 0.005
    kv = timer.device_seconds(prefill_tokens=1, prefill_attention_context=0)  # bound below
    assert half_flops.prefill_seconds(8192) - 0.005 > 1.9 * prefill - kv
    assert pm.StepTimer(shape, profile, efficiency=base).step_seconds() == 0.005


def test_device_and_host_add_up_to_the_step() -> None:
    timer = pm.StepTimer(lookup("v5e", "1x1"), pm.get_profile("qwen3-4b"))
    device = timer.device_seconds(decode_batch=8, decode_context=8 * 1024)
    assert timer.decode_step_seconds(8, 8 * 1024) == pytest.approx(device + timer.host_seconds(8))
    assert timer.host_seconds(8) > timer.host_seconds(1) >= pm.CALIBRATED.host_step_seconds
    assert timer.device_seconds() == 0.0


def test_a_64_wide_head_fills_half_the_mxu_in_attention() -> None:
    shape = lookup("v5e", "1x1")
    llama = pm.StepTimer(shape, pm.get_profile("llama-3.2-1b"))
    qwen = pm.StepTimer(shape, pm.get_profile("qwen3-0.6b"))
    assert llama.attention_flops_per_second == pytest.approx(qwen.attention_flops_per_second / 2)


def test_tied_embeddings_count_the_lm_head_once() -> None:
    small = pm.get_profile("qwen3-0.6b")
    assert small.tied_embeddings
    assert small.body_parameters == pytest.approx(small.parameters - 151936 * 1024)
    big = pm.get_profile("llama-3.1-8b")
    assert big.body_parameters == pytest.approx(big.parameters - 2 * 128256 * 4096)


def test_kv_pool_tokens_is_what_is_left_after_weights() -> None:
    shape = lookup("v6e", "1x1")
    profile = pm.get_profile("llama-3.1-8b")
    tokens = pm.kv_pool_tokens(shape, profile)
    assert (
        tokens * profile.kv_bytes_per_token() <= pm.usable_hbm_bytes(shape) - profile.weight_bytes()
    )
    assert tokens > 50_000


def test_docs_tables_are_what_the_validation_bench_prints() -> None:
    """docs/engine-sim.md's predictions and validation tables come from the calibrated model;
    after changing the model run `bench/perf_model_validation.py --update-docs`."""
    bench = _validation_bench()
    text = bench.DOCS.read_text()
    for name, body in bench.docs_blocks().items():
        assert bench.replace_block(text, name, body) == text, f"{name} is stale"


def test_validation_replay_reports_what_a_closed_loop_client_sees() -> None:
    """One request at a time: TTFT is one prefill step, TPOT one decode step per token."""
    bench = _validation_bench()
    shape, profile = lookup("v6e", "1x1"), pm.get_profile("llama-3.1-8b")
    timer = pm.StepTimer(shape, profile)
    workload = Workload("sglang", 2048, 8, 1, 3, fixed(1000), fixed(11), mem_fraction=0.9)
    outcome = bench.replay(timer, workload, pool_tokens=100_000)
    prefill = timer.prefill_seconds(1000)
    decode = sum(timer.decode_step_seconds(1, 1000 + i) for i in range(1, 11)) / 10
    assert outcome.ttft_ms == pytest.approx(1e3 * prefill)
    assert outcome.tpot_ms == pytest.approx(1e3 * decode)
    assert outcome.output_tok_s == pytest.approx(33 / outcome.duration_s)
    assert outcome.duration_s == pytest.approx(3 * (prefill + 10 * decode))
