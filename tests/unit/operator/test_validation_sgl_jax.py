"""Validation of a TPUModelServer with engine.type sglang-jax: what SGLang-JAX's server has.

spec.engine.args are held against SGLang-JAX's own flags (generated from its ServerArgs): an
unknown flag is refused naming the field, the flag, the nearest flags and the allowed set; a
flag the operator sets is refused as reserved; what SGLang-JAX lacks is refused through the
launch contract; prefill/decode disaggregation is refused for it.
"""

from __future__ import annotations

from typing import Any

import pytest

from tpuserve_operator.conditions import Reason
from tpuserve_operator.errors import InvalidSpec
from tpuserve_operator.render import ValidServer, validate_server
from tpuserve_operator.render.context import RenderConfig

pytestmark = pytest.mark.unit


def spec(**engine: Any) -> dict[str, Any]:
    return {
        "model": {"source": "hf://Qwen/Qwen3-8B"},
        "tpu": {"generation": "v5e", "topology": "4x4"},
        "engine": {"type": "sglang-jax", **engine},
    }


def validated(value: dict[str, Any]) -> ValidServer:
    return validate_server({"name": "qwen", "namespace": "ml"}, value, RenderConfig())


def problems(value: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(InvalidSpec) as err:
        validated(value)
    return {p.field: p.message for p in err.value.problems}


def test_sgl_jax_flags_pass_and_render() -> None:
    valid = validated(spec(args={"mem-fraction-static": 0.8, "page-size": 64}))
    assert valid.valid.spec.engine.type == "sglang-jax"


def test_an_unknown_flag_is_refused_with_the_nearest_and_the_allowed_set() -> None:
    found = problems(spec(args={"mem-frac": 0.8, "enable-torch-compile": True}))
    message = found["spec.engine.args.mem-frac"]
    assert message.startswith("--mem-frac (did you mean --mem-fraction-static")
    assert "is not a flag of SGLang-JAX's server; allowed: the 162 flags" in message
    assert "spec.engine.args.enable-torch-compile" in found


def test_flags_the_operator_sets_are_reserved() -> None:
    with pytest.raises(InvalidSpec) as err:
        validated(spec(args={"tp-size": 4, "dist-init-addr": "x:1"}))
    reasons = {p.field: p.reason for p in err.value.problems}
    assert reasons == {
        "spec.engine.args.tp-size": Reason.RESERVED_FIELD,
        "spec.engine.args.dist-init-addr": Reason.RESERVED_FIELD,
    }


def test_torchtpus_eager_mode_is_refused_by_the_launch_contract() -> None:
    found = problems(spec(executionMode="eager"))
    assert "TPUSERVE_EXECUTION_MODE" in found["spec.engine.executionMode"]
    assert "must be compiled" in found["spec.engine.executionMode"]


def test_disaggregation_is_refused_for_sgl_jax() -> None:
    value = spec()
    value["disaggregation"] = {
        "prefill": {"replicas": 1},
        "decode": {"replicas": 1},
    }
    found = problems(value)
    assert "is not allowed with spec.engine.type sglang-jax yet" in found["spec.disaggregation"]


def test_jaxs_platform_and_cache_variables_are_the_operators() -> None:
    found = problems(spec(env=[{"name": "JAX_COMPILATION_CACHE_DIR", "value": "/elsewhere"}]))
    assert "is set by the operator (launch contract)" in found["spec.engine.env[0].name"]


def test_a_list_flags_value_becomes_its_values_on_the_command_line() -> None:
    valid = validated(spec(args={"precompile-bs-paddings": "8 16, 32", "page-size": 64}))
    group = valid.contract  # the contract every pod of replica group 0 gets
    assert group.sglang_extra_args == (
        "--precompile-bs-paddings", "8", "16", "32", "--page-size", "64",
    )  # fmt: skip


def test_a_router_subscribing_to_kv_events_is_refused_for_sgl_jax() -> None:
    value = spec()
    value["router"] = {"kvEvents": True}
    found = problems(value)
    assert found["spec.router.kvEvents"].startswith("true is not allowed with spec.engine.type")
    value["router"] = {"kvEvents": False}
    assert validated(value).valid.spec.router.kv_events is False
