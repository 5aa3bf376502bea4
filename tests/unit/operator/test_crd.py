"""The generated CRD is a valid, structural apiextensions.k8s.io/v1 CRD that documents itself."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import celpy
import kubernetes_validate
import pytest

from tpuserve_operator import labels
from tpuserve_operator.api import TPUModelServerSpec
from tpuserve_operator.build.crd import custom_resource_definition, openapi_schema

pytestmark = pytest.mark.unit


def _nodes(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _nodes(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{path}{{}}")


def test_crd_validates_against_the_apiextensions_v1_schema() -> None:
    kubernetes_validate.validate(
        custom_resource_definition(), kubernetes_validate.latest_version(), strict=True
    )


def test_schema_is_structural() -> None:
    for path, node in _nodes(openapi_schema(), "object"):
        assert not {"$ref", "anyOf", "allOf", "oneOf", "$defs", "title"} & node.keys(), path
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
        if "properties" in node:
            assert "additionalProperties" not in node, path
        if node.get("exclusiveMinimum") is not None:
            assert isinstance(node["exclusiveMinimum"], bool), path


def test_every_spec_and_status_field_has_a_description() -> None:
    schema = openapi_schema()
    for root in ("spec", "status"):
        for path, node in _nodes(schema["properties"][root], root):
            if path.endswith(("[]", "{}")):
                continue
            assert node.get("description"), f"{path} has no description (kubectl explain)"


def test_spec_descriptions_start_with_the_json_name() -> None:
    for path, node in _nodes(openapi_schema()["properties"]["spec"], "spec"):
        name = path.rsplit(".", 1)[-1]
        if path == "spec" or path.endswith(("[]", "{}")):
            continue
        assert node["description"].split()[0].rstrip(":") == name, path


def test_names_subresources_and_printer_columns() -> None:
    crd = custom_resource_definition()
    assert crd["metadata"]["name"] == "tpumodelservers.serving.tpuserve.dev"
    spec = crd["spec"]
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["shortNames"] == ["tms"]
    (version,) = spec["versions"]
    assert version["name"] == labels.VERSION
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert version["subresources"]["status"] == {}
    columns = [c["name"].upper() for c in version["additionalPrinterColumns"]]
    assert columns == ["MODEL", "TPU", "TOPOLOGY", "REPLICAS", "READY", "ENDPOINT", "AGE"]


def test_every_cel_rule_compiles_and_has_a_message() -> None:
    env = celpy.Environment()
    rules = [
        (path, rule)
        for path, node in _nodes(openapi_schema(), "object")
        for rule in node.get("x-kubernetes-validations", [])
    ]
    assert len(rules) >= 7
    for path, rule in rules:
        env.compile(rule["rule"])
        assert rule["message"], path


def _presence_only(rule: str) -> bool:
    """A rule of field presence alone (``has(self.tpu) || !has(self.slo)``): constant cost,
    whatever the sizes below it."""
    return re.fullmatch(r"[\s()|&!=]*", re.sub(r"has\(self\.\w+\)", "", rule)) is not None


def test_presence_only_rules_are_told_apart() -> None:
    assert _presence_only("has(self.tpu) || (has(self.slo) && has(self.demand))")
    assert _presence_only("has(self.slo) == has(self.demand)")
    assert not _presence_only("!has(self.slo) || self.slo.size() < 3")
    assert not _presence_only("self.generation != 'v5p'")


def test_cel_strings_and_lists_are_bounded_for_the_cost_estimator() -> None:
    """The apiserver rejects CEL rules whose worst-case cost it cannot bound, so every string
    and list below a node carrying rules has a maximum size."""
    ruled = [
        (path, node)
        for path, node in _nodes(openapi_schema()["properties"]["spec"], "spec")
        if any(not _presence_only(r["rule"]) for r in node.get("x-kubernetes-validations", []))
    ]
    assert ruled
    for root_path, root in ruled:
        for path, node in _nodes(root, root_path):
            if node.get("type") == "string" and "enum" not in node:
                assert "maxLength" in node, path
            if node.get("type") == "array":
                assert "maxItems" in node, path


def test_crd_defaults_are_the_model_defaults() -> None:
    """Defaulting by the apiserver and by pydantic must give the same spec."""
    minimal = {
        "model": {"source": "hf://Qwen/Qwen3-8B"},
        "tpu": {"generation": "v6e", "topology": "2x4"},
    }
    spec_schema = openapi_schema()["properties"]["spec"]

    def apply_defaults(value: Any, node: dict[str, Any]) -> Any:
        if not isinstance(value, dict):
            return value
        out = dict(value)
        for name, child in node.get("properties", {}).items():
            if name not in out and "default" in child:
                out[name] = child["default"]
            if name in out:
                out[name] = apply_defaults(out[name], child)
        return out

    by_apiserver = apply_defaults(minimal, spec_schema)
    by_pydantic = TPUModelServerSpec.model_validate(minimal).model_dump(
        by_alias=True, exclude_none=True
    )

    # pydantic also materialises empty maps and lists the CRD leaves absent.
    def strip_empty(value: Any) -> Any:
        if isinstance(value, dict):
            stripped = {k: strip_empty(v) for k, v in value.items()}
            return {k: v for k, v in stripped.items() if v not in ({}, [])}
        return value

    assert strip_empty(by_apiserver) == strip_empty(by_pydantic)
