"""Turn a pydantic model's JSON Schema into a Kubernetes structural OpenAPI v3 schema.

Kubernetes accepts only "structural" schemas: every node has a type (or preserves unknown
fields), no `$ref`, no `anyOf` with null, no `additionalProperties` beside `properties`.
Pydantic emits all of those, so this module inlines references, drops the null branch of
optional fields (absent means unset), drops titles, and keeps descriptions, defaults,
enums, bounds, patterns and CEL rules.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

JSON = dict[str, Any]

_KEEP = {
    "type",
    "description",
    "default",
    "enum",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "items",
    "properties",
    "required",
    "additionalProperties",
    "x-kubernetes-validations",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-int-or-string",
}


def structural_schema(model: type[BaseModel]) -> JSON:
    """The model's schema with descriptions and rules, ready for a CRD's openAPIV3Schema."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    definitions: dict[str, JSON] = raw.pop("$defs", {})
    return _convert(raw, definitions)


def _resolve(node: JSON, definitions: dict[str, JSON]) -> JSON:
    ref = node.get("$ref")
    if ref is None:
        return node
    target = definitions[ref.rsplit("/", 1)[-1]]
    # Keywords beside a $ref (description, default) win over the referenced definition's.
    siblings = {k: v for k, v in node.items() if k != "$ref"}
    return {**target, **siblings}


def _convert(node: JSON, definitions: dict[str, JSON]) -> JSON:
    node = _resolve(node, definitions)
    if "allOf" in node and len(node["allOf"]) == 1:
        base = _resolve(node["allOf"][0], definitions)
        node = {**base, **{k: v for k, v in node.items() if k != "allOf"}}
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"only optional single types map onto a structural schema: {node}")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if rest.get("default", 0) is None:
            del rest["default"]
        node = {**_resolve(branches[0], definitions), **rest}
    out: JSON = {k: v for k, v in node.items() if k in _KEEP}
    if out.get("default", 0) is None:
        del out["default"]
    if "properties" in out:
        out["properties"] = {
            name: _convert(child, definitions) for name, child in out["properties"].items()
        }
        out.pop("additionalProperties", None)
        if not out.get("required"):
            out.pop("required", None)
    if out.get("x-kubernetes-preserve-unknown-fields") and out.get("type") == "object":
        # A pass-through object (pod overrides) keeps whatever Kubernetes would accept.
        if not isinstance(out.get("additionalProperties"), dict):
            out.pop("additionalProperties", None)
    elif isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _convert(out["additionalProperties"], definitions)
    elif out.get("additionalProperties") is False or out.get("additionalProperties") is True:
        del out["additionalProperties"]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        # JSON Schema 2020 writes the bound as a number; OpenAPI v3.0 as a flag beside it.
        if isinstance(out.get(bound), int | float) and not isinstance(out[bound], bool):
            out[plain] = out[bound]
            out[bound] = True
    if isinstance(out.get("items"), dict):
        out["items"] = _convert(out["items"], definitions)
    if out.get("default") == {} and "properties" in out:
        # The apiserver checks a default against the node's CEL rules as written, without
        # defaulting inside it, so an object default spells out its fields' defaults.
        out["default"] = _materialized(out)
    return _ordered(out)


def _materialized(node: JSON) -> JSON:
    value: JSON = {}
    for name, child in node.get("properties", {}).items():
        if "default" in child:
            value[name] = child["default"]
    return value


def _ordered(node: JSON) -> JSON:
    """Stable, readable key order: description first, then type, then the rest."""
    order = ["description", "type", "format", "enum", "default"]
    head = {k: node[k] for k in order if k in node}
    return {**head, **{k: v for k, v in sorted(node.items()) if k not in head}}
