"""`tpuserve plan`: the search, the emitted TPUModelServer (checked by the operator's own
admission validation), the price table and every input's error."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_tpu.perf_model import StepTimer, get_profile, kv_pool_tokens
from sglang_tpu.topology import lookup
from tpuserve import cli
from tpuserve.bench import pd_split
from tpuserve.fleet import FleetConfig
from tpuserve.plan import emit
from tpuserve.plan.cli import build_inputs
from tpuserve.plan.planner import (
    PERF_MODEL_ERROR,
    Plan,
    PlanError,
    PlanInputs,
    Slo,
    allowed_shapes,
    disaggregate,
    host_kv_tokens,
    load_prices,
    max_rate_within_slo,
    override_prices,
    plan,
    profile_from_hf_config,
    sample_requests,
)
from tpuserve_operator.validation import validate

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
CHAT = FleetConfig(workload="lengths", input_median=600.0, input_sigma=0.3, output_min=150,
                   output_max=250, reuse_share=0.5, prefix_groups=4, block_tokens=64)  # fmt: skip


def small_inputs(**changes: Any) -> PlanInputs:
    inputs = PlanInputs(
        fleet=CHAT, peak_rate=60.0, slo=Slo(ttft_p99=1.0, itl_p99=0.05),
        shapes=(lookup("v6e", "1x1"), lookup("v6e", "2x2"), lookup("v5e", "1x1")),
        prices=load_prices(), context_length=4096, sim_replicas=1, window_seconds=20.0,
        warmup_seconds=4.0,
    )  # fmt: skip
    return replace(inputs, **changes)


@pytest.fixture(scope="module")
def small_plan() -> Plan:
    return plan(small_inputs())


def test_search_finds_capacity_ranks_by_cost_and_skips_what_does_not_fit(small_plan: Plan) -> None:
    by_key = {c.key: c for c in small_plan.candidates}
    assert not by_key["v5e 1x1"].fits  # 8B bf16 weights exceed one v5e chip
    assert "does not fit" in by_key["v5e 1x1"].why_not
    one, four = by_key["v6e 1x1"], by_key["v6e 2x2"]
    assert one.capacity_rps > 0
    assert four.capacity_rps > one.capacity_rps  # four chips serve more than one
    for c in (one, four):
        assert c.replicas * c.capacity_rps >= 60.0
        assert (c.replicas - 1) * c.capacity_rps < 60.0
        assert small_plan.inputs.slo.met(c.at_capacity)
    costs = [c.usd_per_million_output(4.0) or 0.0 for c in small_plan.ranked()]
    assert all(costs)
    assert costs == sorted(costs)
    assert small_plan.best is small_plan.ranked()[0]
    assert small_plan.pareto()[0] is small_plan.best


def test_capacity_search_brackets_the_limit() -> None:
    def run(rate: float) -> dict[str, Any]:  # a fake fleet: TTFT grows past 7.3 req/s
        ttft = 0.5 if rate <= 7.3 else 5.0
        return {"failed": 0, "unfinished": 0, "completed": 10, "ttft_p99": ttft, "itl_p99": 0.01,
                "ttft_p50": 0.1, "itl_p50": 0.01}  # fmt: skip

    rate, summary, runs = max_rate_within_slo(run, Slo(ttft_p99=1.0, itl_p99=0.05), 0.5)
    assert 7.3 * 0.9 <= rate <= 7.3
    assert summary["ttft_p99"] == 0.5
    assert runs <= 14 + 6


def test_emitted_server_passes_the_operators_admission_validation(small_plan: Plan) -> None:
    best = small_plan.best
    assert best is not None
    spec = emit.server_spec(small_plan, best, "hf://meta-llama/Llama-3.1-8B-Instruct",
                            "sglang", spot=False)  # fmt: skip
    text = emit.manifest("chat-plan", spec, ["a comment"])
    doc = yaml.safe_load(text)
    assert doc["apiVersion"] == "serving.tpuserve.dev/v1alpha1"
    assert doc["kind"] == "TPUModelServer"
    valid = validate(doc["metadata"]["name"], doc["spec"])
    assert valid.shape.key == best.shape.key
    scaling = doc["spec"]["autoscaling"]
    assert scaling["maxReplicas"] == best.replicas
    # the trough's share of the peak's replicas, at least one
    trough = small_plan.inputs.trough
    assert scaling["minReplicas"] == max(1, math.ceil(best.replicas * trough))
    assert "replicas" not in doc["spec"]  # the autoscaler owns it


def test_emit_refuses_what_admission_would_refuse(small_plan: Plan) -> None:
    best = small_plan.best
    assert best is not None
    spec = emit.server_spec(small_plan, best, "ftp://nowhere", "sglang", spot=False)
    with pytest.raises(PlanError, match=r"spec\.model\.source"):
        emit.manifest("chat-plan", spec, [])
    good = emit.server_spec(small_plan, best, "hf://Qwen/Qwen3-8B", "sglang", spot=False)
    with pytest.raises(PlanError, match=r"metadata\.name"):
        emit.manifest("Not_A_Name", good, [])


def test_disaggregate_splits_the_choices_replicas_by_each_roles_need(small_plan: Plan) -> None:
    best = small_plan.best
    assert best is not None
    split = disaggregate(small_plan, best)
    assert split.prefill >= 1
    assert split.decode >= 1
    assert split.colocated_replicas == best.replicas
    # the fewest replicas that keep up as well as the colocated ones, by the same model
    assert split.load >= split.colocated_load > 0
    assert split.requests > 100
    if split.prefill + split.decode > 2:
        requests = sample_requests(CHAT, small_plan.inputs.peak_rate, 20.0)
        fewer = pd_split.split(
            "always", requests, StepTimer(best.shape, get_profile("llama-3.1-8b")),
            split.prefill + split.decode - 1, 0.05,
            kv_pool_tokens(best.shape, get_profile("llama-3.1-8b")), CHAT.block_tokens,
        )  # fmt: skip
        assert fewer.load < split.colocated_load
    # the same demand with long prompts and short answers wants more prefill, and fewer
    # decode replicas, than with short prompts and long answers
    prefill_heavy = replace(CHAT, input_median=3000.0, output_min=16, output_max=32)
    decode_heavy = replace(CHAT, input_median=200.0, output_min=800, output_max=1000)
    many = replace(best, replicas=8)
    heavy = disaggregate(Plan(small_inputs(fleet=prefill_heavy), []), many)
    light = disaggregate(Plan(small_inputs(fleet=decode_heavy), []), many)
    assert heavy.prefill > light.prefill
    assert heavy.decode < light.decode


def test_a_disaggregated_plan_emits_two_autoscaled_roles_admission_accepts(
    small_plan: Plan,
) -> None:
    best = small_plan.best
    assert best is not None
    split = disaggregate(small_plan, best)
    result = replace(small_plan, disaggregated=split)
    spec = emit.server_spec(result, best, "hf://Qwen/Qwen3-8B", "simulated", spot=False)
    doc = yaml.safe_load(emit.manifest("pd-plan", spec, ["a comment"]))
    validate(doc["metadata"]["name"], doc["spec"])
    assert "autoscaling" not in doc["spec"]  # each role has its own
    roles = doc["spec"]["disaggregation"]
    trough = small_plan.inputs.trough
    for role, peak in (("prefill", split.prefill), ("decode", split.decode)):
        bounds = roles[role]["autoscaling"]
        assert bounds["maxReplicas"] == peak
        assert bounds["minReplicas"] == max(1, math.ceil(peak * trough))
    assert roles["prefill"]["autoscaling"]["metric"] == "queue"
    # SGLang has no TPU transfer backend: the operator would refuse it, so plan does first
    with pytest.raises(PlanError, match="--engine: 'sglang' cannot be emitted with"):
        emit.server_spec(result, best, "hf://Qwen/Qwen3-8B", "sglang", spot=False)


def test_disaggregate_with_emit_for_sglang_is_refused_before_the_search(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "plan.yaml"
    argv = ["plan", "--rate", "10", "--disaggregate", "--emit", str(out), "--engine", "sglang"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "allowed: --engine simulated, or --disaggregate without --emit" in err
    assert "planning" not in err  # refused before any candidate was simulated
    assert not out.exists()


PLANNED = sorted(ROOT.glob("bench/fleet_results/*/plan-*.yaml"))
"""What `tpuserve plan --emit` wrote for docs/capacity-planning.md's three cases (applied on a
real apiserver by tests/e2e/test_operator_serving.py and test_admission.py)."""


@pytest.mark.parametrize("path", PLANNED, ids=[p.name for p in PLANNED])
def test_committed_plans_are_what_emit_writes_and_stay_valid(path: Path) -> None:
    text = path.read_text()
    doc = yaml.safe_load(text)
    header = [line.removeprefix("# ") for line in text.splitlines() if line.startswith("# ")]
    assert len(header) == 3
    assert header[0].startswith("tpuserve plan: ")
    # byte for byte what `emit.manifest` writes for its spec (not edited by hand), and the
    # operator's validation, as it is today, still admits it
    assert emit.manifest(doc["metadata"]["name"], doc["spec"], header) == text
    assert "replicas" not in doc["spec"]
    scaling = doc["spec"]["autoscaling"]
    assert 1 <= scaling["minReplicas"] <= scaling["maxReplicas"]


def test_three_cases_are_committed() -> None:
    assert len(PLANNED) >= 3


def test_price_table_is_dated_sourced_and_overridable(tmp_path: Path) -> None:
    table = load_prices()
    assert table.date
    assert table.source.startswith("https://")
    assert table.chip_hour("v6e", "on-demand") == 2.70
    assert override_prices(table, ["v6e:spot=1.25"]).chip_hour("v6e", "spot") == 1.25
    for bad, message in [
        ("v6e=1", "GENERATION:on-demand=USD"),
        ("v9:spot=1", "--price: 'v9' is not allowed"),
        ("v6e:reserved=1", "--price: 'reserved' is not allowed"),
        ("v6e:spot=-1", "--price: '-1' is not allowed"),
    ]:
        with pytest.raises(PlanError, match=message):
            override_prices(table, [bad])
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"date": "x", "source": "y", "prices": {"v6e": {"spot": 0}}}))
    with pytest.raises(PlanError, match=r"prices.v6e.spot: 0 is not allowed; allowed: > 0"):
        load_prices(path)


def test_the_error_band_is_the_perf_models_validation() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import perf_model_validation as pmv  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    summary = pmv.summary(pmv.evaluate(pmv.FIGURES))
    assert summary["rows"] == PERF_MODEL_ERROR["rows"]
    assert round(summary["median_abs_error"], 2) == PERF_MODEL_ERROR["median"]
    assert round(summary["max_abs_error"], 2) == PERF_MODEL_ERROR["worst"]


def test_hf_config_gives_a_profile(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({
        "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
        "max_position_embeddings": 131072,
    }))  # fmt: skip
    profile = profile_from_hf_config(path)
    assert 7.9e9 < profile.parameters < 8.1e9  # Llama-3.1-8B's shape
    assert profile.kv_heads == 8
    assert profile.head_dim == 128
    path.write_text(json.dumps({"hidden_size": 4096}))
    with pytest.raises(PlanError, match="num_hidden_layers is missing"):
        profile_from_hf_config(path)


LLAMA_8B = {
    "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
}  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        # a string where a count goes: str * int would build a string of ~10^15 characters
        ({"head_dim": "x", "num_key_value_heads": 10**15}, "num_key_value_heads: 1000000000000000"),
        ({"head_dim": "xx"}, "head_dim: 'xx' is not allowed; allowed: an integer from 1"),
        ({"num_experts": -8}, "num_experts: -8 is not allowed; allowed: an integer from 1"),
        ({"num_experts": 8, "num_experts_per_tok": -2}, "num_experts_per_tok: -2 is not allowed"),
        ({"num_experts": 8, "num_experts_per_tok": 9}, "num_experts_per_tok: 9 is not allowed"),
        ({"max_position_embeddings": "1e9"}, "max_position_embeddings: '1e9' is not allowed"),
        ({"tie_word_embeddings": "no"}, "tie_word_embeddings: 'no' is not allowed; allowed: true"),
    ],
)
def test_a_hostile_hf_config_is_refused_naming_the_field(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    """Issue 57 item 9: a config.json's values are checked before any arithmetic; each
    refusal names the field, the value and what is allowed (no traceback, no bomb)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_8B, **changes}))
    with pytest.raises(PlanError, match=message.replace("(", r"\(")):
        profile_from_hf_config(path)


def test_a_huge_hf_config_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    """Issue 57 item 9: a config.json is a few kB; a larger file is refused after reading
    at most the limit (a 1 GiB file read whole, then parsed, held the planner's memory)."""
    path = tmp_path / "config.json"
    with path.open("wb") as out:  # sparse: 1 GiB on the disk's books, nothing written
        out.truncate(1 << 30)
    with pytest.raises(PlanError, match="larger than the 1048576 bytes allowed"):
        profile_from_hf_config(path)
    path.write_text('{"num_hidden_layers": ' + "9" * 5000 + "}")  # past int's digit limit
    with pytest.raises(PlanError, match="is not valid JSON"):
        profile_from_hf_config(path)


def parse(argv: list[str]) -> argparse.Namespace:
    _, parser = cli.build_parser(cli.find_command(["plan"])[0])
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rate", "10", "--model", "gpt-9"], "--model: 'gpt-9' is not allowed"),
        (["--rate", "10", "--generations", "v9"], "--generations: 'v9' is not allowed"),
        (["--rate", "10", "--topologies", "3x3"], "--topologies: '3x3' is not allowed"),
        (["--rate", "10", "--output-min", "50", "--output-max", "10"], "--output-min: 50"),
        (["--rate", "10", "--ttft-p50", "3", "--ttft-p99", "1"], "--ttft-p50: 3.0 is not"),
        (["--rate", "10", "--context-length", "999999"], "--context-length: 999999"),
        (["--rate", "10", "--hf-config", "/nonexistent.json"], "--hf-config: cannot read"),
        (["--rate", "10", "--trace", "/nonexistent.jsonl"], "--trace: cannot read"),
    ],
)
def test_bad_inputs_name_the_flag_value_and_allowed(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        build_inputs(parse(argv))


def test_bad_flag_values_exit_2_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "--rate", "10", "--generations", "v9"]) == 2
    assert "--generations: 'v9' is not allowed; allowed: v5e" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["plan", "--rate", "10", "--trough", "2"])
    assert "--trough: '2' is not allowed; allowed: 0 to 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["plan", "--rate", "-1"])
    assert "--rate" in capsys.readouterr().err


def test_tokens_per_day_becomes_a_peak_rate() -> None:
    inputs, source = build_inputs(parse(["--tokens-per-day", "1e9", "--preset", "chat"]))
    assert source == "hf://meta-llama/Llama-3.1-8B-Instruct"
    # ~1.5k tokens a request: 1e9 / 86400 / 1.5k ~ 7.7 req/s mean, / 0.675 ~ 11 at the peak
    assert 5 < inputs.peak_rate < 25


def test_default_shapes_are_single_host() -> None:
    shapes = allowed_shapes(["v6e"], None, multi_host=False)
    assert [s.topology for s in shapes] == ["1x1", "2x2", "2x4"]


def test_a_trace_becomes_length_distributions_and_reuse() -> None:
    trace = str(ROOT / "bench" / "traces" / "w1-small.jsonl")
    inputs, _ = build_inputs(parse(["--rate", "10", "--trace", trace]))
    assert inputs.fleet.workload == "lengths"
    assert inputs.fleet.reuse_share > 0.5  # W1: shared system prompts
    assert inputs.fleet.prefix_groups >= 1


def test_a_host_tier_is_planned_where_the_host_holds_it_and_emitted() -> None:
    """``--host-kv-size-gb``: each candidate's replicas get the tier (its tokens from the size
    per rank, the ranks and the model's KV per token); a slice whose host cannot hold it is
    not planned, naming the largest size there; the emitted server carries the field."""
    result = plan(small_inputs(host_kv_size_gb=140))
    by_key = {c.key: c for c in result.candidates}
    one, four = by_key["v6e 1x1"], by_key["v6e 2x2"]
    assert not one.fits
    assert one.why_not == (
        "--host-kv-size-gb 140 does not fit a ct6e-standard-1t host (1 ranks); "
        "allowed there: at most 132"
    )
    assert four.capacity_rps > 0
    assert four.at_capacity["host_cache_tokens"] == host_kv_tokens(
        result.inputs, four.shape, get_profile("llama-3.1-8b")
    )
    assert four.at_capacity["host_cache_tokens"] == 140 * 10**9 * 4 // 131072
    spec = emit.server_spec(result, four, "hf://meta-llama/Llama-3.1-8B-Instruct", "sglang",
                            spot=False)  # fmt: skip
    assert spec["kvCache"] == {"host": {"sizeGB": 140}}
    assert validate("host-tier-plan", spec).shape == four.shape  # the operator admits it
    without = small_inputs()
    assert host_kv_tokens(without, four.shape, get_profile("llama-3.1-8b")) == 0
    with pytest.raises(PlanError, match=r"--host-kv-size-gb: 0 is not allowed; allowed: >= 1"):
        small_inputs(host_kv_size_gb=0).validate()
