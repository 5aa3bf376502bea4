"""The analytic SLO sizing (`sglang_tpu.slo_sizing`): what the operator and `tpuserve plan
--fit` answer. Its points meet the SLO they were asked for, more demand needs more replicas
of the same point, a tighter ITL lowers the concurrency, and a refusal says why."""

from __future__ import annotations

import math

import pytest

from sglang_tpu import slo_sizing
from sglang_tpu.perf_model import StepTimer, get_profile, kv_pool_tokens
from sglang_tpu.slo_sizing import Demand, SizingError, Slo
from sglang_tpu.topology import lookup

pytestmark = pytest.mark.unit

LLAMA = get_profile("llama-3.1-8b")
CHAT = Demand(requests_per_second=20.0, prompt_tokens=1200, output_tokens=300, prefix_reuse=0.3)
V6E_2X2 = lookup("v6e", "2x2")


def test_the_operating_point_meets_every_target_it_was_given() -> None:
    slo = Slo(ttft_p99=0.5, itl_p99=0.03, ttft_p50=0.1, itl_p50=0.03)
    sized = slo_sizing.size_slice(V6E_2X2, LLAMA, CHAT, slo)
    p = sized.point
    assert sized.fits
    assert p is not None
    assert p.ttft_p99 <= 0.5
    assert p.ttft_p50 <= 0.1
    assert p.itl <= 0.03
    assert p.concurrency >= p.decode_batch  # every decoding request, and those waiting
    # Little's law over the decoding requests: B = rate x (O - 1) x ITL
    assert p.decode_batch == pytest.approx(p.requests_per_second * 299 * p.itl, rel=1e-9)
    chips = V6E_2X2.chips
    assert p.tokens_per_second_per_chip == pytest.approx(p.requests_per_second * 1500 / chips)


def test_the_point_is_the_highest_rate_that_meets_the_slo() -> None:
    """Targets just under the point's own TTFT and ITL leave only slower points: no faster
    one met the SLO (it would meet the tighter targets too)."""
    slo = Slo(ttft_p99=1.0, itl_p99=0.05)
    p = slo_sizing.size_slice(V6E_2X2, LLAMA, CHAT, slo).point
    assert p is not None
    tighter = Slo(ttft_p99=min(1.0, p.ttft_p99 * 0.999), itl_p99=min(0.05, p.itl * 0.999))
    q = slo_sizing.size_slice(V6E_2X2, LLAMA, CHAT, tighter).point
    assert q is not None
    assert q.requests_per_second < p.requests_per_second
    assert p.decode_batch < 256  # below the running slots: a slot wait stays finite


def test_waiting_for_a_running_slot_counts_in_the_ttft() -> None:
    """Near SGLang's 256 running requests an arrival waits for a slot: a TTFT target the
    prefill alone would meet stops the point below the slot limit."""
    loose = slo_sizing.size_slice(V6E_2X2, LLAMA, CHAT, Slo(ttft_p99=60.0, itl_p99=1.0)).point
    tight = slo_sizing.size_slice(V6E_2X2, LLAMA, CHAT, Slo(ttft_p99=0.5, itl_p99=1.0)).point
    assert loose is not None
    assert tight is not None
    assert tight.decode_batch < loose.decode_batch <= 255
    assert tight.ttft_p99 <= 0.5 < loose.ttft_p99


def test_a_tighter_itl_lowers_the_concurrency_and_the_rate() -> None:
    loose = slo_sizing.size_slice(V6E_2X2, LLAMA, CHAT, Slo(2.0, 0.1)).point
    tight = slo_sizing.size_slice(V6E_2X2, LLAMA, CHAT, Slo(2.0, 0.02)).point
    assert loose is not None
    assert tight is not None
    assert tight.decode_batch < loose.decode_batch
    assert tight.requests_per_second < loose.requests_per_second


def test_more_demand_needs_more_replicas_of_the_same_point() -> None:
    slo = Slo(2.0, 0.05)
    one = slo_sizing.size_slice(V6E_2X2, LLAMA, CHAT, slo)
    ten = slo_sizing.size_slice(V6E_2X2, LLAMA, Demand(200.0, 1200, 300, 0.3, trough=0.5), slo)
    assert one.point == ten.point
    assert one.point is not None
    assert ten.replicas == math.ceil(200.0 / one.point.requests_per_second)
    assert ten.replicas > one.replicas
    assert ten.min_replicas == math.ceil(ten.replicas * 0.5)


def test_refusals_say_why() -> None:
    v5e_one = lookup("v5e", "1x1")
    no_fit = slo_sizing.size_slice(v5e_one, LLAMA, CHAT, Slo(2.0, 0.1))
    assert not no_fit.fits
    assert "does not fit" in no_fit.why_not
    too_fast = slo_sizing.size_slice(V6E_2X2, LLAMA, CHAT, Slo(ttft_p99=0.001, itl_p99=0.1))
    assert not too_fast.fits
    assert too_fast.why_not.startswith("TTFT p99")
    assert "0.001 s" in too_fast.why_not


def test_ranking_is_by_tokens_per_chip_then_fewest_chips() -> None:
    shapes = [lookup("v6e", "1x1"), V6E_2X2, lookup("v6e", "2x4"), lookup("v5e", "1x1")]
    sizes = slo_sizing.size(shapes, LLAMA, CHAT, Slo(2.0, 0.1))
    ranked = slo_sizing.rank(sizes)
    assert [s.shape.key for s in sizes if not s.fits] == ["v5e/1x1"]
    per_chip = [s.point.tokens_per_second_per_chip for s in ranked if s.point]
    assert len(ranked) == 3
    assert per_chip == sorted(per_chip, reverse=True)


@pytest.mark.parametrize(
    ("demand", "message"),
    [
        (Demand(0.0, 100, 10), "demand.requestsPerSecond: 0.0 is not allowed; allowed: > 0"),
        (Demand(1.0, 0, 10), "demand.promptTokens: 0 is not allowed; allowed: >= 1"),
        (Demand(1.0, 10, 10, prefix_reuse=1.0), "demand.prefixReuse: 1.0 is not allowed"),
        (Demand(1.0, 10, 10, trough=2.0), "demand.trough: 2.0 is not allowed; allowed: 0..1"),
    ],
)
def test_bad_demand_names_the_field(demand: Demand, message: str) -> None:
    with pytest.raises(SizingError, match=message.replace(".", r"\.")):
        slo_sizing.size([V6E_2X2], LLAMA, demand, Slo(1.0, 0.1))


def _e2e() -> tuple[StepTimer, int, Demand, slo_sizing.OperatingPoint]:
    """The e2e case (docs/capacity-planning.md): Qwen3-8B 2,000/500 on v6e 2x4."""
    shape, profile = lookup("v6e", "2x4"), get_profile("qwen3-8b")
    demand = Demand(20.0, 2000, 500)
    point = slo_sizing.size_slice(shape, profile, demand, Slo(1.0, 0.05)).point
    assert point is not None
    return StepTimer(shape, profile), kv_pool_tokens(shape, profile), demand, point


def test_at_rate_at_the_operating_point_is_the_point() -> None:
    """`at_rate` (what bench/plan_ttft_vs_twin.py holds against the twin) answers the
    operating point's own rate with the point's own TTFT and ITL."""
    timer, pool, demand, point = _e2e()
    load = slo_sizing.at_rate(timer, pool, demand, point.requests_per_second)
    assert load.decode_batch == point.decode_batch
    assert load.ttft_p99 == pytest.approx(point.ttft_p99, rel=1e-9)
    assert load.ttft_p50 == pytest.approx(point.ttft_p50, rel=1e-9)
    assert load.itl == pytest.approx(point.itl, rel=1e-9)


def test_at_rate_rises_with_load_and_is_infinite_past_the_slots() -> None:
    """Below the point the TTFT is lower, past it higher, and past the slot limit (the cliff)
    it is infinite: the model errs on the safe side there."""
    timer, pool, demand, point = _e2e()
    rate = point.requests_per_second
    p99 = [slo_sizing.at_rate(timer, pool, demand, rate * f).ttft_p99 for f in (0.97, 1.0, 1.02)]
    assert p99 == sorted(p99)
    assert p99[0] < point.ttft_p99 < p99[2]
    past = slo_sizing.at_rate(timer, pool, demand, rate * 1.1)
    assert math.isinf(past.ttft_p99)
    with pytest.raises(SizingError, match=r"rate: -1\.0 is not allowed; allowed: > 0"):
        slo_sizing.at_rate(timer, pool, demand, -1.0)
