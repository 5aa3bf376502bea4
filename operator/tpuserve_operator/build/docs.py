"""The generated sections of docs/operator.md: resource reference, catalog, labels, RBAC.

Each section sits between `<!-- generated:NAME -->` and `<!-- /generated:NAME -->`; the text
around them is written by hand. `fill` replaces every section, so a unit test can compare
the file with `fill(file)` and fail when it is stale.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator

from sglang_tpu.topology import GIB, SLICE_SHAPES
from tpuserve_operator import conditions, engine_resources, labels, rbac
from tpuserve_operator.build.crd import PRINTER_COLUMNS, openapi_schema
from tpuserve_operator.build.openapi import JSON


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type(node: JSON) -> str:
    kind = str(node.get("type", "any"))
    if kind == "array" and isinstance(node.get("items"), dict):
        return f"[]{_type(node['items'])}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map[string]{_type(node['additionalProperties'])}"
    return kind


def _fields(node: JSON, path: str) -> Iterator[tuple[str, JSON, bool]]:
    required = set(node.get("required", []))
    for name, child in node.get("properties", {}).items():
        child_path = f"{path}.{name}"
        yield child_path, child, name in required
        target = child.get("items") if child.get("type") == "array" else child
        if isinstance(target, dict) and "properties" in target:
            yield from _fields(target, f"{child_path}[]" if target is not child else child_path)


def _reference_table(root: JSON, path: str) -> list[str]:
    lines = ["| field | type | default | description |", "|---|---|---|---|"]
    for field, node, required in _fields(root, path):
        default = node.get("default")
        shown = "required" if required else ("" if default is None else json.dumps(default))
        enum = node.get("enum")
        desc = str(node.get("description", ""))
        if enum:
            desc += " One of: " + ", ".join(f"`{v}`" for v in enum) + "."
        lines.append(f"| `{field}` | {_type(node)} | {_cell(shown)} | {_cell(desc)} |")
    return lines


def _rules(node: JSON, path: str) -> Iterator[tuple[str, str, str]]:
    for rule in node.get("x-kubernetes-validations", []):
        yield path, rule["rule"], rule["message"]
    for name, child in node.get("properties", {}).items():
        yield from _rules(child, f"{path}.{name}")


def reference() -> list[str]:
    schema = openapi_schema()
    lines = ["### spec", ""]
    lines += _reference_table(schema["properties"]["spec"], "spec")
    lines += ["", "### status", ""]
    lines += _reference_table(schema["properties"]["status"], "status")
    lines += [
        "",
        "### Validation rules (CEL, checked by the apiserver and by `tpuserve render`)",
        "",
    ]
    lines += ["| at | message | rule |", "|---|---|---|"]
    for at, rule, message in _rules(schema, "object"):
        lines.append(f"| `{at}` | {_cell(message)} | `{_cell(rule)}` |")
    lines += ["", "### Printer columns (`kubectl get tms`)", ""]
    lines += ["| column | JSON path |", "|---|---|"]
    lines += [f"| {c['name'].upper()} | `{c['jsonPath']}` |" for c in PRINTER_COLUMNS]
    return lines


def gateway_reference() -> list[str]:
    """The TPUGateway's fields (gateway_api.py; docs/gateway.md says what it does)."""
    from tpuserve_operator.build.crd import gateway_openapi_schema

    schema = gateway_openapi_schema()
    lines = ["### TPUGateway spec", ""]
    lines += _reference_table(schema["properties"]["spec"], "spec")
    lines += ["", "### TPUGateway status", ""]
    lines += _reference_table(schema["properties"]["status"], "status")
    return lines


def catalog() -> list[str]:
    lines = [
        "| generation | topology | machine type | hosts (pods) | google.com/tpu per pod | chips "
        "| HBM per replica | cpu / memory per pod |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in SLICE_SHAPES:
        engine = engine_resources.defaults(s.machine)
        lines.append(
            f"| {s.generation.name} | `{s.topology}` | {s.machine_type} | {s.hosts} "
            f"| {s.chips_per_host} | {s.chips} | {s.hbm_bytes / GIB:.0f} GiB "
            f"| {engine['cpu']:.1f} / {engine['memory'] / GIB:.0f} GiB |"
        )
    return lines


def label_table() -> list[str]:
    lines = ["| key | kind | value |", "|---|---|---|"]
    lines += [f"| `{k}` | label | {_cell(v)} |" for k, v in labels.LABEL_DOCS.items()]
    lines += [f"| `{k}` | annotation | {_cell(v)} |" for k, v in labels.ANNOTATION_DOCS.items()]
    return lines


def rbac_table() -> list[str]:
    def rows(rules: tuple[rbac.Rule, ...], scope: str) -> list[str]:
        return [
            f"| {scope} | `{r.group or 'core'}` | {', '.join(r.resources)} "
            f"| {', '.join(r.verbs)} | {_cell(r.why)} |"
            for r in rules
        ]

    lines = ["| scope | API group | resources | verbs | why |", "|---|---|---|---|---|"]
    lines += rows(rbac.OPERATOR_RULES, "namespaced")
    lines += rows(rbac.OPERATOR_CLUSTER_RULES, "cluster")
    lines += rows(rbac.OPERATOR_CLUSTER_WIDE_RULES, "cluster (cluster-wide mode)")
    lines += rows(rbac.ROUTER_RULES, "router Role")
    return lines


def condition_table() -> list[str]:
    lines = ["| condition | status | reason | meaning |", "|---|---|---|---|"]
    for c in conditions.REASONS:
        lines.append(f"| {c.type} | {c.status} | `{c.reason}` | {_cell(c.meaning)} |")
    return lines


GENERATED_NOTE = "<!-- generated by python -m tpuserve_operator.build.generate; do not edit -->"

SECTIONS: dict[str, Callable[[], list[str]]] = {
    "reference": reference,
    "gateway-reference": gateway_reference,
    "catalog": catalog,
    "labels": label_table,
    "conditions": condition_table,
    "rbac": rbac_table,
}


def fill(text: str) -> str:
    """`text` with every generated section rewritten; raises if a marker pair is missing."""
    for name, make in SECTIONS.items():
        begin, end = f"<!-- generated:{name} -->", f"<!-- /generated:{name} -->"
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
        match = pattern.search(text)
        if match is None:
            raise ValueError(f"docs/operator.md lacks the {begin} ... {end} markers")
        body = "\n".join([begin, GENERATED_NOTE, *make(), end])
        text = text[: match.start()] + body + text[match.end() :]
    return text
