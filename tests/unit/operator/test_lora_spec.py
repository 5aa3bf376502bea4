"""spec.model.loraAdapters: validated with field-named errors, rendered into the launch contract
(and a pvc:// adapter's claim mounted); engine.args may not set the LoRA flags beside it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.operator.conftest import RenderFn, SpecWith
from tests.unit.operator.test_validation import problems_of

pytestmark = pytest.mark.unit

SQL = {"name": "sql", "source": "hf://org/sql-lora"}
LAW = {"name": "law", "source": "pvc://adapters/law"}


def model_with(*adapters: dict[str, str]) -> dict[str, Any]:
    return {"source": "hf://Qwen/Qwen3-8B", "loraAdapters": list(adapters)}


def engine_env(rendered: RenderFn, spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The leader's engine env (name -> value) and its pod spec."""
    (template,) = [
        c["spec"]["template"]["spec"]
        for c in rendered(spec).children
        if c["kind"] == "StatefulSet" and c["metadata"]["name"] == "qwen-r0"
    ]
    (engine,) = template["containers"]
    return {e["name"]: e.get("value") for e in engine["env"]}, template


def test_adapters_reach_the_launch_contract_and_pvc_claims_are_mounted(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    env, pod = engine_env(rendered, spec_with(model=model_with(SQL, LAW)))
    assert env["TPUSERVE_LORA_ADAPTERS"] == "sql=hf://org/sql-lora,law=pvc://adapters/law"
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert "adapters" in claims


def test_without_adapters_there_is_no_adapter_variable(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    env, _ = engine_env(rendered, spec_with())
    assert "TPUSERVE_LORA_ADAPTERS" not in env


@pytest.mark.parametrize(
    ("adapter", "field", "says"),
    [
        (
            {"name": "qwen:sql", "source": "hf://org/a"},
            "spec.model.loraAdapters[0].name",
            "'qwen:sql'",
        ),
        ({"name": "sql", "source": "s3://b/a"}, "spec.model.loraAdapters[0].source", "'s3://b/a'"),
    ],
    ids=["colon-in-name", "unknown-scheme"],
)
def test_a_bad_adapter_names_its_field_and_value(
    spec_with: SpecWith, adapter: dict[str, str], field: str, says: str
) -> None:
    found = problems_of(spec_with(model=model_with(adapter)))
    message, _ = found[field]
    assert says in message


def test_a_bad_source_lists_the_allowed_forms(spec_with: SpecWith) -> None:
    found = problems_of(spec_with(model=model_with({"name": "sql", "source": "s3://b/a"})))
    message, _ = found["spec.model.loraAdapters[0]"]
    assert "model.loraAdapters[].source must be hf://ORG/NAME[@REVISION]" in message


def test_repeated_names_are_refused(spec_with: SpecWith) -> None:
    found = problems_of(spec_with(model=model_with(SQL, {**LAW, "name": "sql"})))
    message, _ = found["spec.model.loraAdapters"]
    assert "'sql' repeats" in message


def test_too_many_adapters_are_refused(spec_with: SpecWith) -> None:
    many = [{"name": f"a{i}", "source": f"hf://org/a{i}"} for i in range(33)]
    found = problems_of(spec_with(model=model_with(*many)))
    message, _ = found["spec.model.loraAdapters"]
    assert "at most 32" in message


@pytest.mark.parametrize("flag", ["lora-paths", "enable-lora"])
def test_engine_args_may_not_set_lora_flags_beside_the_field(
    spec_with: SpecWith, flag: str
) -> None:
    spec = spec_with(model=model_with(SQL), engine={"args": {flag: "x=/y"}})
    message, reason = problems_of(spec)[f"spec.engine.args.{flag}"]
    assert f"--{flag}" in message
    assert "spec.model.loraAdapters" in message
    assert reason == "ReservedField"


def test_engine_args_lora_flags_alone_still_pass(rendered: RenderFn, spec_with: SpecWith) -> None:
    env, _ = engine_env(rendered, spec_with(engine={"args": {"lora-paths": "sql=/mnt/sql"}}))
    assert env["TPUSERVE_SGLANG_EXTRA_ARGS"] == "--lora-paths sql=/mnt/sql"
