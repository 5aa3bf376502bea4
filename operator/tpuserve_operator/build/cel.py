"""Evaluate the CRD's own CEL rules (`x-kubernetes-validations`) without a cluster.

`tpuserve render` must reject what the apiserver would reject, with the same messages, and
the rules must exist once: so this walks the generated schema and evaluates each rule with
cel-python, `self` bound to the value at that node, as the apiserver does. Only what the
rules here use is needed (comparisons, `in`, `has()`, `size()`, `matches()`).
"""

from __future__ import annotations

import functools
from typing import Any

import celpy
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from tpuserve_operator.build.openapi import JSON
from tpuserve_operator.conditions import Reason
from tpuserve_operator.errors import Problem


@functools.lru_cache(maxsize=256)
def _program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def rule_holds(rule: str, value: Any) -> bool:
    """True when the rule accepts `value` as `self`. A rule that errors counts as failed."""
    try:
        result = _program(rule).evaluate({"self": json_to_cel(value)})
    except CELEvalError:
        return False
    return not isinstance(result, CELEvalError) and bool(result)


def check(schema: JSON, value: Any, path: str) -> list[Problem]:
    """Every failed rule in `schema` (and below it) for `value`, located at `path`."""
    problems = [
        Problem(field=path, message=rule["message"], reason=Reason.FAILED_VALIDATION_RULE)
        for rule in schema.get("x-kubernetes-validations", [])
        if not rule_holds(rule["rule"], value)
    ]
    if isinstance(value, dict):
        for name, child in schema.get("properties", {}).items():
            if name in value:
                problems += check(child, value[name], f"{path}.{name}")
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name, child_value in value.items():
                problems += check(extra, child_value, f"{path}.{name}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problems += check(schema["items"], item, f"{path}[{i}]")
    return problems
