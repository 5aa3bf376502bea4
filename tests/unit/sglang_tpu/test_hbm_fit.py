"""The HBM fit rule puts every step measured on a v5e on the side the chip put it.

`hbm_fit.MEASURED` holds every (model, step, batch, context) the project's v5e ran or refused,
JAX and TorchTPU alike; each must fit by the rule exactly when it ran. The rule's compiler
margin is the one the measured OOM shows, and the operator's and the twin's checks use it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_tpu import hbm_fit, perf_model
from sglang_tpu.hbm_fit import MEASURED, RULE, MeasuredFit
from sglang_tpu.topology import GIB, lookup

pytestmark = pytest.mark.unit

RESULTS = Path(__file__).resolve().parents[3] / "bench" / "tpu_results"


@pytest.mark.parametrize("case", MEASURED, ids=lambda c: c.label)
def test_every_measured_step_is_on_the_side_the_chip_put_it(case: MeasuredFit) -> None:
    shape = lookup(case.generation, case.topology)
    shortfall = RULE.shortfall_bytes(shape, case.weight_bytes, case.kv_bytes, case.kv_update)
    assert (shortfall <= 0) == case.fits, (
        f"{case.label}: the chip says {'fits' if case.fits else 'does not fit'}, the rule is "
        f"{shortfall / GIB:+.2f} GiB over"
    )


def test_the_measurements_cover_both_sides_and_every_model() -> None:
    assert {c.model for c in MEASURED} == {"qwen3-0.6b", "llama-3.2-1b", "qwen3-4b"}
    assert {c.fits for c in MEASURED} == {True, False}
    assert {c.kv_update for c in MEASURED} == {"in-place", "functional"}


def test_the_compile_failure_is_the_rules_step_to_the_hundredth_of_a_gib() -> None:
    (oom,) = [c for c in MEASURED if "16.54G" in c.note]
    need = RULE.step_bytes(oom.weight_bytes, oom.kv_bytes, oom.kv_update)
    assert round(need / GIB, 2) == 16.54  # what XLA said it needed
    assert round(RULE.runtime_bytes(lookup("v5e", "1x1")) / GIB, 2) == 15.75  # and had
    # JAX ran the same step: the cache held once
    assert RULE.fits(lookup("v5e", "1x1"), oom.weight_bytes, oom.kv_bytes, "in-place")


def test_the_static_budget_lies_between_the_largest_fit_and_the_smallest_refusal() -> None:
    shape = lookup("v5e", "1x1")
    in_place = [c for c in MEASURED if c.kv_update == "in-place"]
    largest_fit = max(c.weight_bytes + c.kv_bytes for c in in_place if c.fits)
    smallest_refusal = min(c.weight_bytes + c.kv_bytes for c in in_place if not c.fits)
    assert largest_fit <= RULE.budget_bytes(shape) < smallest_refusal


def test_the_pool_is_what_fits_and_a_functional_update_halves_it() -> None:
    shape = lookup("v5e", "1x1")
    weights = 7.49 * GIB
    pool = RULE.pool_bytes(shape, weights)
    assert RULE.fits(shape, weights, pool)
    assert not RULE.fits(shape, weights, pool + GIB / 100)
    functional = RULE.pool_bytes(shape, weights, "functional")
    assert functional < pool
    assert RULE.fits(shape, weights, functional, "functional")
    assert RULE.pool_bytes(shape, 20 * GIB) == 0.0


def test_an_unknown_kv_update_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="kv_update: 'sideways' is not allowed; allowed"):
        RULE.fits(lookup("v5e", "1x1"), GIB, GIB, "sideways")


def test_the_operator_and_the_twin_use_the_rule() -> None:
    shape = lookup("v6e", "1x1")
    profile = perf_model.get_profile("qwen3-8b")
    pool = hbm_fit.RULE.pool_bytes(shape, profile.weight_bytes())
    assert perf_model.kv_pool_tokens(shape, profile) == int(pool // profile.kv_bytes_per_token())
    assert perf_model.usable_hbm_bytes(shape) == RULE.budget_bytes(shape)
    tokens = int(pool // profile.kv_bytes_per_token())
    perf_model.check_fits(shape, "qwen3-8b", "bf16", "auto", tokens)
    with pytest.raises(perf_model.ModelDoesNotFit):
        perf_model.check_fits(shape, "qwen3-8b", "bf16", "auto", tokens, kv_update="functional")


def _bench_decode_rows() -> list[dict[str, object]]:
    """Decode steps bench/tpu_steps.py ran or was refused on the v5e (its committed rows)."""
    rows = []
    for path in sorted(RESULTS.glob("*/steps-jax.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "header" not in record and record["step"] == "decode":
                rows.append(record)
    return rows


def test_every_decode_step_the_benchmark_ran_or_was_refused_is_on_its_side() -> None:
    """The project's own runs (JAX holds the KV cache once, as an in-place update): the rows
    that ran fit by the rule, those refused with RESOURCE_EXHAUSTED do not."""
    shape = lookup("v5e", "1x1")
    rows = _bench_decode_rows()
    refused = [r for r in rows if "RESOURCE_EXHAUSTED" in str(r.get("error", ""))]
    assert len(rows) >= 30
    assert len(refused) >= 6
    for row in rows:
        profile = perf_model.get_profile(str(row["model"]))
        kv = profile.kv_bytes_per_token() * int(str(row["tokens"])) * int(str(row["context"]))
        shortfall = RULE.shortfall_bytes(shape, profile.weight_bytes(), kv)
        ran = "error" not in row
        assert (shortfall <= 0) == ran, (row["model"], row["tokens"], row["context"], shortfall)
