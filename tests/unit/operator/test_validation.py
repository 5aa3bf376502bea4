"""Every layer of validation reports field-named problems, all at once, with allowed values."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sglang_tpu.topology import topologies_for
from tpuserve_operator.errors import InvalidSpec
from tpuserve_operator.render import RenderConfig, validate_server
from tpuserve_operator.validation import validate

pytestmark = pytest.mark.unit

SpecWith = Callable[..., dict[str, Any]]


def problems_of(spec: dict[str, Any], name: str = "qwen") -> dict[str, tuple[str, str]]:
    with pytest.raises(InvalidSpec) as caught:
        validate(name, spec)
    return {p.field: (p.message, p.reason) for p in caught.value.problems}


def test_a_valid_spec_resolves_shape_and_served_name(spec_with: SpecWith) -> None:
    valid = validate("qwen", spec_with())
    assert valid.shape.key == "v6e/4x4"
    assert valid.shape.hosts == 4
    assert valid.served_name == "qwen3-8b"
    assert valid.spec.engine.type == "sglang"


def test_served_name_is_taken_from_the_spec_when_set(spec_with: SpecWith) -> None:
    spec = spec_with(model={"source": "hf://Qwen/Qwen3-8B", "servedName": "chat"})
    assert validate("qwen", spec).served_name == "chat"


def test_unknown_generation_names_field_value_and_allowed(spec_with: SpecWith) -> None:
    found = problems_of(spec_with(tpu={"generation": "v9", "topology": "4x4"}))
    message, _ = found["spec.tpu.generation"]
    assert "'v9'" in message
    assert "v5e, v5p, v6e, tpu7x" in message


def test_topology_not_in_catalog_lists_the_generations_topologies(spec_with: SpecWith) -> None:
    found = problems_of(spec_with(tpu={"generation": "v6e", "topology": "3x3"}))
    message, reason = found["spec.tpu.topology"]
    assert reason == "UnsupportedTopology"
    assert "'3x3'" in message
    assert ", ".join(topologies_for("v6e")) in message


def test_three_dimensional_generation_needs_three_dimensions(spec_with: SpecWith) -> None:
    found = problems_of(spec_with(tpu={"generation": "tpu7x", "topology": "2x2"}))
    message, reason = found["spec.tpu"]
    assert reason == "FailedValidationRule"
    assert "three dimensions" in message


def test_eagle3_needs_a_draft_model(spec_with: SpecWith) -> None:
    spec = spec_with(engine={"speculative": {"algorithm": "EAGLE3"}})
    message, reason = problems_of(spec)["spec.engine.speculative"]
    assert reason == "FailedValidationRule"
    assert "draftModel is required" in message


def test_mtp_needs_no_draft_model(spec_with: SpecWith) -> None:
    valid = validate("qwen", spec_with(engine={"speculative": {"algorithm": "MTP"}}))
    assert valid.spec.engine.speculative is not None
    assert valid.spec.engine.speculative.algorithm == "MTP"
    assert valid.spec.engine.speculative.draft_model is None


@pytest.mark.parametrize(
    "source",
    ["s3://bucket/model", "Qwen/Qwen3-8B", "hf://Qwen", "gs://B/path", "pvc://Claim/x"],
)
def test_source_scheme_is_checked(source: str, spec_with: SpecWith) -> None:
    message, _ = problems_of(spec_with(model={"source": source}))["spec.model"]
    assert "hf://ORG/NAME[@REVISION], gs://BUCKET/PATH or pvc://CLAIM/PATH" in message


@pytest.mark.parametrize(
    "source", ["hf://Qwen/Qwen3-8B@main", "gs://my-bucket/qwen3-8b", "pvc://weights/qwen3-8b"]
)
def test_each_source_scheme_is_accepted(source: str, spec_with: SpecWith) -> None:
    valid = validate("qwen", spec_with(model={"source": source}))
    assert valid.spec.model.source == source
    assert valid.served_name == "qwen3-8b"


def test_autoscaling_min_must_not_exceed_max(spec_with: SpecWith) -> None:
    spec = spec_with(autoscaling={"minReplicas": 5, "maxReplicas": 2})
    message, _ = problems_of(spec)["spec.autoscaling"]
    assert "minReplicas must be less than or equal to autoscaling.maxReplicas" in message


def test_rollout_cannot_forbid_both_unavailability_and_surge(spec_with: SpecWith) -> None:
    spec = spec_with(rollout={"maxUnavailable": 0, "maxSurge": 0})
    assert "cannot both be 0" in problems_of(spec)["spec.rollout"][0]


def test_negative_replicas_are_refused_with_the_bound(spec_with: SpecWith) -> None:
    message, _ = problems_of(spec_with(replicas=-1))["spec.replicas"]
    assert "-1" in message
    assert "greater than or equal to 0" in message


def test_enum_fields_list_allowed_values(spec_with: SpecWith) -> None:
    spec = spec_with(model={"source": "hf://Qwen/Qwen3-8B", "quantization": "int4"})
    message, _ = problems_of(spec)["spec.model.quantization"]
    assert "'int4'" in message
    assert "'fp8'" in message
    assert "'nvfp4'" in message


def test_unknown_fields_are_refused_not_dropped(spec_with: SpecWith) -> None:
    spec = spec_with(tpu={"generation": "v6e", "topology": "4x4", "topolgy": "2x4"})
    assert "not a field" in problems_of(spec)["spec.tpu.topolgy"][0]


def test_missing_required_field() -> None:
    assert problems_of({"tpu": {"generation": "v6e", "topology": "4x4"}})["spec.model"] == (
        "is required",
        "InvalidSpec",
    )


def test_long_names_are_refused(spec_with: SpecWith) -> None:
    found = problems_of(spec_with(), name="x" * 41)
    assert "at most 40" in found["metadata.name"][0]


def test_every_problem_is_reported_at_once(spec_with: SpecWith) -> None:
    spec = spec_with(
        tpu={"generation": "v6e", "topology": "3x3"},
        engine={"env": [{"name": "TPU_WORKER_ID", "value": "3"}]},
        rollout={"maxUnavailable": 0, "maxSurge": 0},
    )
    assert {"spec.tpu.topology", "spec.engine.env[0].name", "spec.rollout"} <= problems_of(
        spec
    ).keys()


@pytest.mark.parametrize(
    "name",
    ["TPU_WORKER_HOSTNAMES", "TPUSERVE_MODEL", "TORCH_TPU_TOPOLOGY", "NODE_RANK", "HF_TOKEN"],
)
def test_contract_variables_cannot_be_overridden(name: str, spec_with: SpecWith) -> None:
    spec = spec_with(engine={"env": [{"name": name, "value": "x"}]})
    message, reason = problems_of(spec)["spec.engine.env[0].name"]
    assert reason == "ReservedField"
    assert name in message


def test_other_env_vars_pass(spec_with: SpecWith) -> None:
    valid = validate("qwen", spec_with(engine={"env": [{"name": "XLA_FLAGS", "value": "--x"}]}))
    assert valid.spec.engine.env == [{"name": "XLA_FLAGS", "value": "--x"}]


@pytest.mark.parametrize("flag", ["port", "tp-size", "--dist-init-addr", "api-key"])
def test_flags_the_launcher_owns_are_refused(flag: str, spec_with: SpecWith) -> None:
    spec = spec_with(engine={"args": {flag: "1"}})
    message, reason = problems_of(spec)[f"spec.engine.args.{flag}"]
    assert reason == "ReservedField"
    assert flag.lstrip("-") in message


def test_extra_flags_must_be_scalars(spec_with: SpecWith) -> None:
    spec = spec_with(engine={"args": {"mem-fraction-static": [0.8]}})
    assert (
        "a string, number or boolean"
        in problems_of(spec)["spec.engine.args.mem-fraction-static"][0]
    )


def test_labels_the_operator_sets_are_refused(spec_with: SpecWith) -> None:
    spec = spec_with(template={"labels": {"model": "x", "team": "a"}})
    found = problems_of(spec)
    assert found["spec.template.labels.model"][1] == "ReservedField"
    assert "spec.template.labels.team" not in found


def test_tpu_resource_is_owned_by_the_operator(spec_with: SpecWith) -> None:
    spec = spec_with(engine={"resources": {"limits": {"google.com/tpu": "8"}}})
    assert "spec.engine.resources.limits.google.com/tpu" in problems_of(spec)


def test_engine_cpu_and_memory_that_cannot_be_scheduled_are_refused(spec_with: SpecWith) -> None:
    spec = spec_with(
        engine={
            "resources": {
                "requests": {"cpu": "2", "memory": "800Gi"},
                "limits": {"cpu": "1", "memory": "lots"},
            }
        }
    )
    found = problems_of(spec)
    message, _ = found["spec.engine.resources.requests.memory"]
    assert "more than one ct6e-standard-4t host leaves to pods" in message
    assert "allowed: at most 715512Mi" in message
    assert (
        "not allowed; allowed: a positive Kubernetes quantity"
        in (found["spec.engine.resources.limits.memory"][0])
    )
    assert (
        "is above spec.engine.resources.limits.cpu ('1')"
        in (found["spec.engine.resources.requests.cpu"][0])
    )
    zero = spec_with(engine={"resources": {"limits": {"cpu": 0}}})
    assert "spec.engine.resources.limits.cpu" in problems_of(zero)


def test_a_simulated_engine_has_no_host_bound_on_its_resources(spec_with: SpecWith) -> None:
    big = {"requests": {"cpu": "500", "memory": "4Ti"}}
    validate("qwen", spec_with(engine={"type": "simulated", "resources": big}))
    bad = {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}
    found = problems_of(spec_with(engine={"type": "simulated", "resources": bad}))
    assert "spec.engine.resources.requests.cpu" in found


def test_a_model_too_large_for_the_slice_is_refused_by_the_fit_check(spec_with: SpecWith) -> None:
    spec = spec_with(
        model={"source": "hf://Qwen/Qwen3-235B-A22B"}, tpu={"generation": "v5e", "topology": "2x4"}
    )
    message, reason = problems_of(spec)["spec.tpu.topology"]
    assert reason == "ModelDoesNotFit"
    assert "does not fit v5e/2x4" in message


def test_fp8_makes_a_model_fit(spec_with: SpecWith) -> None:
    big = {"source": "hf://meta-llama/Llama-3.3-70B-Instruct"}
    slice_ = {"generation": "v5e", "topology": "2x4"}
    assert (
        problems_of(spec_with(model=big, tpu=slice_))["spec.tpu.topology"][1] == "ModelDoesNotFit"
    )
    valid = validate(
        "llama", spec_with(model={**big, "quantization": "fp8", "contextLength": 8192}, tpu=slice_)
    )
    assert (valid.shape.key, valid.spec.model.quantization) == ("v5e/2x4", "fp8")


def test_four_bit_weights_are_sized_by_the_fit_check(spec_with: SpecWith) -> None:
    big = {"source": "hf://meta-llama/Llama-3.3-70B-Instruct", "contextLength": 8192}
    four_chips = {"generation": "v5e", "topology": "2x2"}
    one_chip = {"generation": "v5e", "topology": "1x1"}
    fp8 = spec_with(model={**big, "quantization": "fp8"}, tpu=four_chips)
    assert problems_of(fp8)["spec.tpu.topology"][1] == "ModelDoesNotFit"
    for quantization in ("mxfp4", "nvfp4"):
        fits = validate(
            "llama", spec_with(model={**big, "quantization": quantization}, tpu=four_chips)
        )
        assert (fits.shape.key, fits.spec.model.quantization) == ("v5e/2x2", quantization)
        too_small = spec_with(model={**big, "quantization": quantization}, tpu=one_chip)
        message, reason = problems_of(too_small)["spec.tpu.topology"]
        assert reason == "ModelDoesNotFit"
        assert f"{quantization} weights" in message


def test_unknown_models_get_no_fit_opinion(spec_with: SpecWith) -> None:
    """Even on a one-chip slice: only the performance model's models are sized."""
    spec = spec_with(
        model={"source": "hf://acme/secret-model"}, tpu={"generation": "v5e", "topology": "1x1"}
    )
    valid = validate("m", spec)
    assert (valid.shape.chips, valid.served_name) == (1, "secret-model")


def test_the_simulator_needs_a_known_model(spec_with: SpecWith) -> None:
    spec = spec_with(model={"source": "hf://acme/secret-model"}, engine={"type": "simulated"})
    message, reason = problems_of(spec)["spec.model.source"]
    assert reason == "UnknownModel"
    assert "Qwen/Qwen3-8B" in message


def test_the_launch_contract_is_checked_in_the_same_step(spec_with: SpecWith) -> None:
    """Render cannot fail afterwards: what the launcher would refuse is refused here, even on
    the operator's path, which leaves the CRD's CEL rules to the apiserver."""
    spec = spec_with(engine={"speculative": {"algorithm": "EAGLE3"}})
    with pytest.raises(InvalidSpec) as caught:
        validate_server({"name": "qwen", "namespace": "ml"}, spec, RenderConfig(), cel_rules=False)
    (problem,) = caught.value.problems
    assert problem.field == "spec.engine.speculative.draftModel"
    assert "the launch contract refuses it (TPUSERVE_SPECULATIVE_DRAFT_MODEL)" in problem.message


def test_names_the_hosts_cannot_resolve_are_refused(spec_with: SpecWith) -> None:
    for name in ("Qwen_3", "3qwen", "qwen.3", "qwen-"):  # children include Services
        with pytest.raises(InvalidSpec, match=r"metadata.name: .* is not allowed; allowed: lower"):
            validate_server({"name": name, "namespace": "ml"}, spec_with(), RenderConfig())


def test_a_value_of_the_wrong_json_type_is_refused(spec_with: SpecWith) -> None:
    for replicas in (True, "3", 3.0):
        message, _ = problems_of(spec_with(replicas=replicas))["spec.replicas"]
        assert "valid integer" in message


def test_a_huge_or_deep_spec_is_refused_before_it_is_looked_at(spec_with: SpecWith) -> None:
    level: list[object] = ["x"] * 10
    for _ in range(7):  # an alias bomb: 10^7 values once expanded, a few objects in memory
        level = [level] * 10
    spec = spec_with(template={"affinity": {"a": level}})
    assert "more than 100000 values" in problems_of(spec)["spec"][0]
    deep: object = "x"
    for _ in range(100):
        deep = {"a": deep}
    assert (
        "nested deeper than 64 levels"
        in problems_of(spec_with(template={"affinity": deep}))["spec"][0]
    )


def test_no_comma_in_an_adapter_source_or_a_gcs_compile_cache(spec_with: SpecWith) -> None:
    spec = spec_with(
        model={
            "source": "hf://Qwen/Qwen3-8B",
            "loraAdapters": [{"name": "sql", "source": "gs://bkt/a,b"}],
        },
        engine={"compileCache": {"gcs": "gs://bkt/xla,rw"}},
    )
    problems = problems_of(spec)
    assert "spec.model.loraAdapters[0].source" in problems
    assert "spec.engine.compileCache.gcs" in problems
    assert "gs://bkt/xla,rw" in problems["spec.engine.compileCache.gcs"][0]
