"""SGLang-JAX in the performance model: its step times, padding, HBM fit and planning.

The constants (`sgl_jax_steps`) are fitted to the v5e figures of docs/sglang-jax.md, so the
model must give those back; padding must cost matmuls and not KV; the KV pool's head-dim
padding must show in the fit; and `tpuserve plan --engine sglang-jax` must plan with these
step times and emit a server the operator accepts.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from sglang_tpu import perf_model, sgl_jax_steps
from sglang_tpu.perf_model import ModelDoesNotFit, StepTimer, check_fits, get_profile
from sglang_tpu.sgl_jax_predict import MODEL, predict_row
from sglang_tpu.topology import lookup
from tpuserve import cli
from tpuserve.fleet.config import FleetConfig
from tpuserve.fleet.model import FleetSim
from tpuserve_operator.validation import validate

pytestmark = pytest.mark.unit

V5E = lookup("v5e", "1x1")
QWEN = get_profile(MODEL)
BATCH_32_BUCKETS = (32, 64, 128, 256)  # the reference run's --precompile-bs-paddings


@pytest.mark.parametrize(
    ("kind", "row", "measured_ms"),
    [
        ("decode", {"batch": 8, "context": 160, "bs_buckets": BATCH_32_BUCKETS}, 6.09),
        ("decode", {"batch": 32, "context": 160, "bs_buckets": BATCH_32_BUCKETS}, 6.83),
        ("prefill", {"tokens": 512}, 22.0),
    ],
)
def test_the_model_gives_back_the_v5e_figures_it_was_fitted_to(
    kind: str, row: dict[str, object], measured_ms: float
) -> None:
    predicted = predict_row(kind, **row) * 1e3  # type: ignore[arg-type]
    assert predicted == pytest.approx(measured_ms, rel=0.01)


def test_sgl_jax_host_terms_differ_from_sglangs_and_the_device_step_does_not() -> None:
    sglang = StepTimer(V5E, QWEN)
    jax = StepTimer(V5E, QWEN, engine="sglang-jax")
    assert jax.device_seconds(decode_batch=32, decode_context=32 * 160) == pytest.approx(
        sglang.device_seconds(decode_batch=32, decode_context=32 * 160)
    )
    assert jax.host_seconds(32) < sglang.host_seconds(32)
    assert jax.host_seconds(32) == pytest.approx(
        sgl_jax_steps.STEPS.host_step_seconds + 32 * sgl_jax_steps.STEPS.host_sequence_seconds
    )


def test_a_padded_batch_costs_the_buckets_matmuls_but_only_its_own_kv() -> None:
    jax = StepTimer(V5E, get_profile("qwen3-8b"), engine="sglang-jax")  # matmul-bound rows
    sglang = StepTimer(V5E, get_profile("qwen3-8b"))
    # batch 129 runs in the 256 bucket: the matmuls of 256 rows, the KV of 129
    padded = jax.device_seconds(decode_batch=129, decode_context=129 * 100)
    assert padded == pytest.approx(
        sglang.device_seconds(decode_batch=256, decode_context=129 * 100)
    )
    assert padded > sglang.device_seconds(decode_batch=129, decode_context=129 * 100)
    # a prefill of 300 tokens runs in the 512-token bucket
    assert jax.device_seconds(prefill_tokens=300) == pytest.approx(
        sglang.device_seconds(prefill_tokens=512)
    )


def test_pad_rounds_up_to_the_next_bucket_and_leaves_zero_and_overflow() -> None:
    buckets = sgl_jax_steps.STEPS.bs_buckets
    assert [sgl_jax_steps.pad(n, buckets) for n in (0, 1, 3, 8, 9, 256, 300)] == [
        0, 1, 4, 8, 16, 256, 300,
    ]  # fmt: skip


def test_a_prefill_request_carries_sgl_jaxs_per_request_cost() -> None:
    jax = StepTimer(V5E, QWEN, engine="sglang-jax")
    step = jax.step_seconds(prefill_tokens=1024, prefill_attention_context=1024 * 1025 // 2)
    assert jax.prefill_seconds(1024) == pytest.approx(
        step + sgl_jax_steps.STEPS.prefill_request_seconds
    )
    assert predict_row("prefill", tokens=4096) > predict_row("prefill", tokens=1024)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"engine": "vllm"}, "engine: 'vllm' is not allowed; allowed: sglang, sglang-jax"),
        ({"engine": "sglang-jax", "execution_mode": "eager"}, "allowed: compiled"),
    ],
)
def test_bad_engine_settings_are_refused_by_name(changes: dict[str, str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        StepTimer(V5E, QWEN, **changes)  # type: ignore[arg-type]


def test_bad_constants_and_rows_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="bs_buckets"):
        replace(sgl_jax_steps.STEPS, bs_buckets=(8, 4))
    with pytest.raises(ValueError, match="tokens: 0 is not allowed"):
        predict_row("prefill", tokens=0)


def test_sgl_jaxs_kv_pool_pads_a_64_wide_head_to_128() -> None:
    llama = get_profile("llama-3.2-1b")  # head dim 64
    assert llama.kv_bytes_per_token("auto", "sglang-jax") == 2 * llama.kv_bytes_per_token("auto")
    assert QWEN.kv_bytes_per_token("auto", "sglang-jax") == QWEN.kv_bytes_per_token("auto")
    check_fits(V5E, llama, "bf16", "auto", 262_144)  # SGLang's pool holds it
    with pytest.raises(ModelDoesNotFit):
        check_fits(V5E, llama, "bf16", "auto", 262_144, engine="sglang-jax")
    assert perf_model.kv_pool_tokens(V5E, llama, engine="sglang-jax") * 2 == pytest.approx(
        perf_model.kv_pool_tokens(V5E, llama), abs=2
    )


def test_the_fleet_model_runs_sgl_jaxs_step_times() -> None:
    config = FleetConfig(generation="v5e", topology="1x1", model=MODEL, engine="sglang-jax")
    assert FleetSim(config).slots.timer.engine == "sglang-jax"
    with pytest.raises(ValueError, match="engine: 'jax' is not allowed"):
        FleetSim(replace(config, engine="jax"))


def test_plan_engine_sgl_jax_plans_with_its_step_times_and_emits_a_valid_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.yaml"
    argv = ["plan", "--rate", "5", "--model", MODEL, "--engine", "sglang-jax",
            "--generations", "v5e", "--topologies", "1x1", "--window", "20",
            "--sim-replicas", "1", "--emit", str(out), "--json"]  # fmt: skip
    assert cli.main(argv) == 0
    itl_p50 = json.loads(capsys.readouterr().out)["candidates"][0]["itl_p50"]
    # a decode step of SGLang-JAX (no less than its batch-1 step), not SGLang's 8 ms host step
    assert predict_row("decode", batch=1, context=0) <= itl_p50
    doc = yaml.safe_load(out.read_text())
    assert doc["spec"]["engine"]["type"] == "sglang-jax"
    assert validate(doc["metadata"]["name"], doc["spec"]).spec.engine.type == "sglang-jax"


def test_plan_refuses_a_disaggregated_sgl_jax_emit_before_the_search(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.yaml"
    argv = ["plan", "--rate", "10", "--disaggregate", "--emit", str(out), "--engine", "sglang-jax"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--engine: 'sglang-jax' cannot be emitted with --disaggregate" in err
    assert "planning" not in err
    assert not out.exists()
