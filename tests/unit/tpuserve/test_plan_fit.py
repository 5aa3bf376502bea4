"""`tpuserve plan`'s fast answer (`--fit`, analytic) and its ranking without a price: a slice
with no price (tpu7x today) is ranked by tokens per chip rather than left last."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sglang_tpu import slo_sizing
from sglang_tpu.topology import lookup
from tpuserve import cli
from tpuserve.fleet import FleetConfig
from tpuserve.plan.planner import Candidate, Plan, PlanInputs, Slo, load_prices

pytestmark = pytest.mark.unit

CHAT_FIT = ["plan", "--fit", "--json", "--model", "llama-3.1-8b", "--preset", "chat",
            "--rate", "100", "--ttft-p99", "1", "--itl-p99", "0.05"]  # fmt: skip


def run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert cli.main(argv) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_fit_answers_with_each_slices_operating_point_ranked_by_tokens_per_chip(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = run_json(CHAT_FIT, capsys)
    assert out["method"] == "analytic (sglang_tpu.slo_sizing), no simulation"
    rows = {r["slice"]: r for r in out["candidates"]}  # type: ignore[attr-defined]
    assert not rows["v5e 1x1"]["fits"]
    assert "does not fit" in rows["v5e 1x1"]["why_not"]
    assert rows["tpu7x 2x2x1"]["usd_per_million_output_tokens"] is None  # no price shipped
    assert out["ranked_by"] == "tokens per chip"
    ranked = out["ranked"]
    assert isinstance(ranked, list)
    assert "tpu7x 2x2x1" in ranked  # ranked, not dropped for its missing price
    per_chip = [rows[k]["operating_point"]["tokens_per_second_per_chip"] for k in ranked]
    assert per_chip == sorted(per_chip, reverse=True)
    best = rows[out["choice"]]
    point = best["operating_point"]
    assert point["ttft_p99"] <= 1.0
    assert point["itl"] <= 0.05
    assert point["concurrency"] >= point["decode_batch"] >= 1
    assert best["replicas"] * point["requests_per_second"] >= 100
    assert out["error_band"]["ttft_p99"] == slo_sizing.TTFT_P99_ERROR  # type: ignore[index]


def test_fit_ranks_by_price_when_every_slice_has_one(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json([*CHAT_FIT, "--generations", "v6e,v5e"], capsys)
    assert out["ranked_by"] == "price"
    rows = {r["slice"]: r for r in out["candidates"]}  # type: ignore[attr-defined]
    costs = [rows[k]["usd_per_million_output_tokens"] for k in out["ranked"]]  # type: ignore[attr-defined]
    assert costs == sorted(costs)


def test_fit_prints_the_choice_and_its_concurrency(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([a for a in CHAT_FIT if a != "--json"]) == 0
    text = capsys.readouterr().out
    assert "fit check (analytic, no simulation)" in text
    assert "ranked by tokens per chip (a slice that fits has no price)" in text
    assert "req/s per replica at concurrency" in text


@pytest.mark.parametrize("flag", [["--verify"], ["--disaggregate"], ["--emit", "x.yaml"]])
def test_fit_refuses_what_needs_the_simulation(
    flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*CHAT_FIT, *flag]) == 2
    assert f"{flag[0]}: not allowed with --fit" in capsys.readouterr().err


def candidate(generation: str, topology: str, tokens_per_second: float) -> Candidate:
    c = Candidate(lookup(generation, topology), sim_replicas=1)
    c.capacity_rps, c.replicas = 10.0, 2
    c.at_capacity = {"tokens_per_second": tokens_per_second, "input_tokens_per_second": 1.0,
                     "output_tokens_per_second": 1.0, "ttft_p99": 0.5}  # fmt: skip
    return c


def test_a_candidate_without_a_price_is_ranked_by_tokens_per_chip() -> None:
    prices = load_prices()
    inputs = PlanInputs(fleet=FleetConfig(), peak_rate=20.0, slo=Slo(2.0, 0.1),
                        shapes=(lookup("v6e", "2x2"),), prices=prices)  # fmt: skip
    v6e, ironwood = candidate("v6e", "2x2", 30_000.0), candidate("tpu7x", "2x2x1", 48_000.0)
    v6e.usd_per_chip_hour = prices.chip_hour("v6e", "on-demand")
    assert ironwood.usd_per_chip_hour is None
    plan = Plan(inputs, [v6e, ironwood])
    assert plan.ranked_by == "tokens per chip"
    assert plan.ranked() == [ironwood, v6e]  # 12,000 tokens/s a chip against 7,500
    assert plan.pareto() == [v6e]  # the price front keeps the priced ones
    ironwood.usd_per_chip_hour = 5.0
    priced = Plan(replace(inputs), [v6e, ironwood])
    assert priced.ranked_by == "price"
    assert priced.ranked()[0] is min(
        (v6e, ironwood), key=lambda c: c.usd_per_million_output(4.0) or 0.0
    )
