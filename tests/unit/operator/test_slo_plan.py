"""Servers sized from an SLO (`slo_plan`): spec.slo and spec.demand instead of a slice and
replica bounds. The operator plans the slice among its --plan-slices and the replicas,
renders the server as if the user had written them, and reports the plan in status.plan; a
user's slice wins; a changed spec is planned again; what cannot be planned says why."""

from __future__ import annotations

import datetime
import math
from typing import Any

import pytest

from sglang_tpu import slo_sizing
from sglang_tpu.perf_model import get_profile
from sglang_tpu.topology import lookup
from tpuserve_operator.api import TPUModelServerStatus
from tpuserve_operator.conditions import Reason
from tpuserve_operator.errors import InvalidSpec
from tpuserve_operator.flags import _plan_slices
from tpuserve_operator.render import RenderConfig, render, validate_server
from tpuserve_operator.slo_plan import DEFAULT_SLICES, parse_slices
from tpuserve_operator.status_writer import build_status

pytestmark = pytest.mark.unit

SLO = {"ttftP99Seconds": 2, "itlP99Seconds": 0.1}
DEMAND = {"requestsPerSecond": 40, "promptTokens": 1200, "outputTokens": 300}
SLO_ONLY: dict[str, Any] = {
    "model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
    "slo": SLO,
    "demand": DEMAND,
}
META = {"name": "sized", "namespace": "ml", "uid": "u1", "generation": 3}


def sized(spec: dict[str, Any], **config: Any) -> Any:
    return validate_server(META, spec, RenderConfig(**config))


def test_a_server_given_only_an_slo_and_a_demand_gets_a_slice_and_replicas() -> None:
    server = sized(SLO_ONLY)
    spec, plan = server.valid.spec, server.valid.plan
    assert plan is not None
    assert plan.source == "Planned"
    # the choice is the ranking's first over every single-host slice, as the planner says
    profile = get_profile("llama-3.1-8b")
    sizes = slo_sizing.size(
        DEFAULT_SLICES, profile, slo_sizing.Demand(40.0, 1200, 300), slo_sizing.Slo(2.0, 0.1),
        context_length=profile.context_length,
    )  # fmt: skip
    best = slo_sizing.rank(sizes)[0]
    assert best.point is not None
    assert (spec.tpu.generation, spec.tpu.topology) == (
        best.shape.generation.name, best.shape.topology,
    )  # fmt: skip
    assert spec.replicas == best.replicas == math.ceil(40 / best.point.requests_per_second)
    assert server.valid.shape.key == best.shape.key
    status = render(server).plan
    assert status.source == "Planned"
    assert (status.generation, status.topology) == (spec.tpu.generation, spec.tpu.topology)
    assert status.max_replicas == best.replicas
    assert status.min_replicas == best.min_replicas
    point = status.operating_point
    assert point is not None
    assert point.requests_per_second * status.max_replicas >= 40
    assert point.ttft_p99_seconds <= 2
    assert point.itl_seconds <= 0.1
    assert point.concurrency > 0
    assert point.decode_batch >= 1
    assert status.error_band is not None
    assert status.error_band.median == 0.11
    # the TTFT p99 band against the engine twin (bench/plan_ttft_vs_twin.py)
    assert status.error_band.ttft_p99_low == slo_sizing.TTFT_P99_ERROR["low"]
    assert status.error_band.ttft_p99_high == slo_sizing.TTFT_P99_ERROR["high"]
    assert "req/s per replica at concurrency" in status.message


def test_status_plan_says_which_generation_it_was_made_for() -> None:
    rendered = render(sized(SLO_ONLY))
    status = build_status(
        TPUModelServerStatus(), [], now=datetime.datetime.now(datetime.UTC), generation=3,
        observed=True, rendered=rendered,
    )  # fmt: skip
    assert status.plan is not None
    assert status.plan.observed_generation == 3
    dumped = status.model_dump(by_alias=True, exclude_none=True)["plan"]
    assert {"operatingPoint", "errorBand", "minReplicas", "maxReplicas"} <= set(dumped)


def test_the_plan_stays_within_the_operators_plan_slices() -> None:
    only = parse_slices("v6e:2x4,v5e:2x4")
    server = sized(SLO_ONLY, plan_slices=only)
    assert server.valid.spec.tpu.generation + " " + server.valid.spec.tpu.topology in {
        "v6e 2x4", "v5e 2x4",
    }  # fmt: skip


def test_a_users_slice_wins_and_only_the_replicas_are_planned() -> None:
    spec = {**SLO_ONLY, "tpu": {"generation": "v5e", "topology": "2x4"}}
    server = sized(spec, plan_slices=parse_slices("v6e:2x4"))
    assert (server.valid.spec.tpu.generation, server.valid.spec.tpu.topology) == ("v5e", "2x4")
    plan = server.valid.plan
    assert plan is not None
    assert plan.source == "Spec"
    assert server.valid.spec.replicas == plan.max_replicas >= 1
    assert render(server).plan.source == "Spec"


def test_a_changed_spec_is_planned_again() -> None:
    slices = parse_slices("v6e:2x4")
    low = sized(SLO_ONLY, plan_slices=slices).valid.spec.replicas
    more = {**SLO_ONLY, "demand": {**DEMAND, "requestsPerSecond": 400}}
    high = sized(more, plan_slices=slices).valid.spec.replicas
    assert high > low


def test_with_autoscaling_the_plan_sets_the_bounds_and_zero_stays_zero() -> None:
    spec = {**SLO_ONLY, "demand": {**DEMAND, "requestsPerSecond": 400, "trough": 0.5},
            "autoscaling": {"metric": "tokensInFlight", "target": 50000,
                            "maxReplicas": 1000}}  # fmt: skip
    a = sized(spec, plan_slices=parse_slices("v6e:2x4")).valid
    assert a.plan is not None
    assert a.spec.autoscaling is not None
    assert a.spec.autoscaling.max_replicas == a.plan.max_replicas == a.plan.size.replicas
    assert a.spec.autoscaling.min_replicas == math.ceil(a.plan.max_replicas * 0.5)
    capped = {**spec, "autoscaling": {**spec["autoscaling"], "maxReplicas": 2}}
    c = sized(capped, plan_slices=parse_slices("v6e:2x4")).valid
    assert c.plan is not None
    assert c.spec.autoscaling is not None
    assert c.spec.autoscaling.max_replicas == c.plan.max_replicas == 2 < c.plan.size.replicas
    assert "capped at autoscaling.maxReplicas 2" in c.plan.message
    zero = {**spec, "autoscaling": {**spec["autoscaling"], "minReplicas": 0}}
    z = sized(zero, plan_slices=parse_slices("v6e:2x4")).valid
    assert z.spec.autoscaling is not None
    assert z.spec.autoscaling.min_replicas == 0


def problems_of(spec: dict[str, Any], **config: Any) -> list[Any]:
    with pytest.raises(InvalidSpec) as err:
        sized(spec, **config)
    return list(err.value.problems)


def test_an_slo_no_slice_meets_is_refused_naming_each_slice() -> None:
    spec = {**SLO_ONLY, "slo": {"ttftP99Seconds": 0.001, "itlP99Seconds": 0.1}}
    [p] = problems_of(spec, plan_slices=parse_slices("v6e:2x4,v5e:1x1"))
    assert p.field == "spec.slo"
    assert p.reason == Reason.SLO_NOT_MET
    assert "v6e/2x4: TTFT p99" in p.message
    assert "v5e/1x1: " in p.message
    assert "does not fit" in p.message


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"model": SLO_ONLY["model"], "replicas": 1}, "spec.tpu", "required unless spec.slo"),
        ({"model": SLO_ONLY["model"], "slo": SLO}, "spec.demand", "required with spec.slo"),
        ({"model": SLO_ONLY["model"], "demand": DEMAND}, "spec.slo", "required with spec.demand"),
        (
            {**SLO_ONLY, "model": {"source": "gs://bucket/my-model"}},
            "spec.slo",
            "the performance model does not know 'gs://bucket/my-model'",
        ),
    ],
)
def test_what_cannot_be_planned_names_the_field(
    spec: dict[str, Any], field: str, words: str
) -> None:
    [p] = problems_of(spec)
    assert p.field == field
    assert words in p.message


def test_the_crd_rules_say_the_same_to_the_apiserver() -> None:
    from tpuserve_operator.build.crd import openapi_schema

    rules = [r["rule"] for r in openapi_schema()["properties"]["spec"]["x-kubernetes-validations"]]
    assert "has(self.tpu) || (has(self.slo) && has(self.demand))" in rules
    assert "has(self.slo) == has(self.demand)" in rules


def test_plan_slices_flag_values_are_catalog_slices() -> None:
    assert _plan_slices("v6e:2x4") == (lookup("v6e", "2x4"),)
    assert _plan_slices("") == ()
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="--plan-slices: 'v6e' is not allowed"):
        _plan_slices("v6e")
    with pytest.raises(argparse.ArgumentTypeError, match="9x9"):
        _plan_slices("v6e:9x9")
