"""Validate a TPUModelServer spec: the CRD's rules, then the catalog and the fit check.

`validate` runs every layer and reports every problem at once, each naming the field, the
value and what is allowed:

1. types, enums, bounds and patterns (the pydantic models the CRD is generated from);
2. the CRD's CEL rules, evaluated offline (`build/cel.py`), as the apiserver would;
3. what CEL cannot know: the (generation, topology) pair is in the topology catalog, the
   model fits the slice's HBM (the engine twin's performance model, when the model is
   known), no override touches what the operator owns (launch-contract variables,
   SGLang flags, labels, google.com/tpu), and the engine's cpu and memory can be scheduled
   (`engine_resources`).

`render.validate_server` runs these and then the last layer, which needs the server's name,
namespace and workload kind: the launch contract its replica groups get (host names, ports,
flags), checked by the contract's own validators. After it, rendering cannot fail. The
operator reports the result as the `Valid` condition; `tpuserve render` prints it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic

from sglang_tpu import lora, model_source, perf_model
from sglang_tpu.topology import TPU_RESOURCE, CatalogError, SliceShape, lookup
from tpuserve_operator import (
    disaggregation,
    engine_resources,
    host_kv,
    labels,
    launch_contract,
    model_profile,
    slo_plan,
)
from tpuserve_operator.api import (
    MAX_NAME_LENGTH,
    SERVER_NAME,
    TPU_ENGINE_TYPES,
    TPUModelServerSpec,
)
from tpuserve_operator.build import cel
from tpuserve_operator.build.crd import openapi_schema
from tpuserve_operator.conditions import Reason
from tpuserve_operator.errors import InvalidSpec, Problem

log = logging.getLogger(__name__)

OWNED_LABEL_KEYS = (labels.MODEL, labels.TPU_GENERATION, labels.TPU_TOPOLOGY)
OWNED_LABEL_PREFIXES = ("app.kubernetes.io/", f"{labels.GROUP}/")
_LABEL_VALUE_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True, slots=True)
class ValidSpec:
    """A spec that passed every check, with what the checks resolved."""

    spec: TPUModelServerSpec
    shape: SliceShape
    served_name: str
    plan: slo_plan.SloPlan | None = None
    """The planner's choice when the spec states spec.slo (`slo_plan`); its slice and replicas
    are already in ``spec``."""


def validate(
    name: str,
    spec: Mapping[str, Any],
    *,
    cel_rules: bool = True,
    plan_slices: Sequence[SliceShape] = slo_plan.DEFAULT_SLICES,
) -> ValidSpec:
    """The typed spec, or InvalidSpec listing every problem (fields as `spec.a.b`).

    `cel_rules=False` skips the CRD's CEL rules: the operator reads objects the apiserver
    already checked them on (evaluating them in Python costs milliseconds per server).
    A spec sized from spec.slo is planned first (`slo_plan.resolve`, among `plan_slices`),
    and checked as if it named the plan's slice and replicas.
    """
    problems = check_bounds(spec, "spec")
    if problems:  # a structure this large or deep is not looked at further
        raise InvalidSpec(problems)
    if len(name) > MAX_NAME_LENGTH:
        problems.append(
            Problem(
                "metadata.name",
                f"{name!r} is {len(name)} characters; allowed: at most {MAX_NAME_LENGTH}",
            )
        )
    if not re.fullmatch(SERVER_NAME, name):
        problems.append(
            Problem(
                "metadata.name",
                f"{name!r} is not allowed; allowed: lower-case letters, digits and '-', "
                "starting with a letter and ending with a letter or digit",
            )
        )
    try:
        model = TPUModelServerSpec.model_validate(dict(spec))
    except pydantic.ValidationError as err:
        raise InvalidSpec(problems + [_problem_from_pydantic(e) for e in err.errors()]) from None
    model, plan, unplanned = slo_plan.resolve(model, plan_slices)
    if unplanned:
        raise InvalidSpec(problems + unplanned)
    if cel_rules:
        defaulted = model.model_dump(by_alias=True, exclude_none=True)
        problems += cel.check(_spec_schema(), defaulted, "spec")
    shape: SliceShape | None = None
    try:
        shape = lookup(model.tpu.generation, model.tpu.topology, field_path="spec.tpu.topology")
    except CatalogError as err:
        problems.append(
            Problem(err.field, _catalog_message(err), reason=Reason.UNSUPPORTED_TOPOLOGY)
        )
    problems += _sources(model)
    problems += disaggregation.problems(model, shape)
    problems += _owned_overrides(model)
    problems += _sgl_jax_router(model)
    if shape is not None:
        problems += _fit(model, shape)
        profile = model_profile.profile_of(model)
        problems += host_kv.problems(model, shape, profile)
    on_tpu = model.engine.type in TPU_ENGINE_TYPES
    machine = shape.machine if shape is not None and on_tpu else None
    problems += engine_resources.problems(model.engine.resources, machine)
    if model.disaggregation is not None:
        for role in disaggregation.ROLES:
            role_tpu = disaggregation.role_of(model, role).tpu
            if role_tpu is not None:
                with contextlib.suppress(CatalogError):  # reported by disaggregation.problems
                    role_shape = lookup(role_tpu.generation, role_tpu.topology)
                    problems += [
                        Problem(f"spec.disaggregation.{role}.tpu.topology", p.message, p.reason)
                        for p in _fit(model, role_shape)
                    ]
    if problems or shape is None:
        raise InvalidSpec(problems)
    return ValidSpec(spec=model, shape=shape, served_name=served_name(model), plan=plan)


MAX_DEPTH = 64
MAX_VALUES = 100_000
MAX_CHARS = 16 * 1024 * 1024
"""Characters of every string once YAML aliases are expanded (a 4 MB string aliased a thousand
times is 4 GB once rendered)."""


def check_bounds(value: Any, field: str) -> list[Problem]:
    """Whether ``value`` (parsed YAML or JSON) is small enough to look at: at most
    `MAX_DEPTH` levels deep, `MAX_VALUES` values and `MAX_CHARS` characters of strings once
    YAML aliases are expanded (an "anchor bomb" of a few lines expands to billions). Shared
    objects are counted once per reference but walked once, so the check itself is fast
    whatever the expansion."""
    sizes: dict[int, tuple[int, int]] = {}

    def size(node: Any, depth: int) -> tuple[int, int]:
        """(values, characters) under ``node``, aliases expanded."""
        if isinstance(node, str):
            return 1, len(node)
        if not isinstance(node, dict | list):
            return 1, 0
        if depth > MAX_DEPTH:
            raise _TooLarge(f"nested deeper than {MAX_DEPTH} levels")
        known = sizes.get(id(node))
        if known is not None:
            return known
        children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
        values, chars = 1, 0
        for child in children:
            more, longer = size(child, depth + 1)
            values += more
            chars += longer
            if values > MAX_VALUES:
                raise _TooLarge(
                    f"more than {MAX_VALUES} values (with YAML aliases expanded); allowed: fewer"
                )
            if chars > MAX_CHARS:
                raise _TooLarge(
                    f"more than {MAX_CHARS} characters of strings (with YAML aliases "
                    "expanded); allowed: fewer"
                )
        sizes[id(node)] = (values, chars)
        return values, chars

    try:
        size(value, 0)
    except _TooLarge as err:
        return [Problem(field, str(err))]
    return []


class _TooLarge(Exception):
    pass


@functools.cache
def _spec_schema() -> dict[str, Any]:
    """The CRD's spec schema (generated once; holds the CEL rules)."""
    schema: dict[str, Any] = openapi_schema()["properties"]["spec"]
    return schema


def served_name(spec: TPUModelServerSpec) -> str:
    """spec.model.servedName, else the source's last path segment, lower-cased, label-safe."""
    if spec.model.served_name:
        return spec.model.served_name
    location = spec.model.source.split("://", 1)[-1].split("@", 1)[0].rstrip("/")
    last = location.rsplit("/", 1)[-1].lower()
    return _LABEL_VALUE_UNSAFE.sub("-", last).strip("-._")[:63] or "model"


def _problem_from_pydantic(error: Mapping[str, Any]) -> Problem:
    path = "spec" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "missing":
        return Problem(path, "is required")
    if error["type"] == "extra_forbidden":
        return Problem(path, "is not a field of this object (check the spelling)")
    return Problem(path, f"{error.get('input')!r} is not valid: {message}")


def _catalog_message(err: CatalogError) -> str:
    return str(err).removeprefix(f"{err.field}: ")


def _sources(spec: TPUModelServerSpec) -> list[Problem]:
    """What the launcher's own parser says about the weight locations, and whether the
    simulated engine has a performance profile for the model."""
    problems: list[Problem] = []
    sources = [("spec.model.source", spec.model.source)]
    if spec.engine.speculative is not None and spec.engine.speculative.draft_model:
        sources.append(("spec.engine.speculative.draftModel", spec.engine.speculative.draft_model))
    adapters = spec.model.lora_adapters
    sources += [(f"spec.model.loraAdapters[{i}].source", a.source) for i, a in enumerate(adapters)]
    names_problem = lora.adapters_problem([adapter.name for adapter in adapters])
    if names_problem is not None:
        problems.append(Problem("spec.model.loraAdapters", names_problem))
    for path, text in sources:
        try:
            model_source.parse_model_source(text)
        except model_source.ModelSourceError as err:
            problems.append(Problem(path, f"{err}; allowed: {model_source.ALLOWED_FORMS}"))
    architecture_problem = model_profile.problem(spec)
    if architecture_problem is not None:
        field, _, message = architecture_problem.partition(": ")
        problems.append(Problem(field, message))
    elif spec.engine.type == "simulated" and model_profile.profile_of(spec) is None:
        problems.append(
            Problem(
                "spec.model.source",
                f"the simulated engine has no performance profile for {spec.model.source!r}; "
                f"allowed: hf:// ids of known models ({', '.join(known_model_ids())}), or "
                "any decoder with spec.model.architecture (its config.json's facts)",
                reason=Reason.UNKNOWN_MODEL,
            )
        )
    return problems


def known_model_ids() -> list[str]:
    """The Hugging Face ids the performance model (and so the simulated engine) knows."""
    return sorted(
        {hf for name in perf_model.profile_names() for hf in perf_model.get_profile(name).hf_ids}
    )


def _owned_overrides(spec: TPUModelServerSpec) -> list[Problem]:
    problems: list[Problem] = []
    for i, entry in enumerate(spec.engine.env):
        env_name = entry.get("name")
        if not isinstance(env_name, str) or not env_name:
            problems.append(Problem(f"spec.engine.env[{i}].name", "is required"))
        elif launch_contract.is_owned_env(env_name):
            problems.append(
                Problem(
                    f"spec.engine.env[{i}].name",
                    f"{env_name!r} is set by the operator (launch contract); allowed: any other "
                    "name",
                    reason=Reason.RESERVED_FIELD,
                )
            )
    problems += _owned_args(spec, "spec.engine.args", spec.engine.args)
    if spec.disaggregation is not None:
        for role in disaggregation.ROLES:
            role_args = disaggregation.role_of(spec, role).args
            problems += _owned_args(spec, f"spec.disaggregation.{role}.args", role_args)
    for key in spec.template.labels:
        if key in OWNED_LABEL_KEYS or key.startswith(OWNED_LABEL_PREFIXES):
            problems.append(
                Problem(
                    f"spec.template.labels.{key}",
                    "is set by the operator; allowed: keys other than "
                    f"{', '.join(OWNED_LABEL_KEYS)} and {', '.join(OWNED_LABEL_PREFIXES)}*",
                    reason=Reason.RESERVED_FIELD,
                )
            )
    for section in ("requests", "limits"):
        amounts = spec.engine.resources.get(section)
        if isinstance(amounts, Mapping) and TPU_RESOURCE in amounts:
            problems.append(
                Problem(
                    f"spec.engine.resources.{section}.{TPU_RESOURCE}",
                    "is set by the operator to the chips of one host (topology catalog); "
                    "allowed: cpu, memory and other resources",
                    reason=Reason.RESERVED_FIELD,
                )
            )
    return problems


def _owned_args(spec: TPUModelServerSpec, field: str, args: Mapping[str, Any]) -> list[Problem]:
    """Flags in ``args`` (spec.engine.args or a PD role's args) that the operator sets, and
    values that are not scalars."""
    problems: list[Problem] = []
    for flag, value in args.items():
        path = f"{field}.{flag}"
        if spec.model.lora_adapters and "--" + flag.lstrip("-") in lora.LORA_FLAGS:
            problems.append(
                Problem(
                    path,
                    f"--{flag.lstrip('-')} is set by the operator from spec.model.loraAdapters; "
                    "allowed: adapters in spec.model.loraAdapters only, or these engine args "
                    "without loraAdapters",
                    reason=Reason.RESERVED_FIELD,
                )
            )
        elif (unknown := launch_contract.unknown_flag(flag, spec.engine.type)) is not None:
            problems.append(Problem(path, unknown))
        elif launch_contract.is_owned_flag(flag, spec.engine.type):
            problems.append(
                Problem(
                    path,
                    f"--{flag.lstrip('-')} is set by the operator from the spec; allowed: "
                    f"{'SGLang-JAX' if spec.engine.type == 'sglang-jax' else 'SGLang'} flags "
                    "the operator does not set",
                    reason=Reason.RESERVED_FIELD,
                )
            )
        elif not isinstance(value, str | int | float | bool):
            problems.append(
                Problem(path, f"{value!r} is not allowed; allowed: a string, number or boolean")
            )
    return problems


def _sgl_jax_router(spec: TPUModelServerSpec) -> list[Problem]:
    """SGLang-JAX publishes no KV events: a router told to subscribe would wait for none."""
    if spec.engine.type != "sglang-jax" or spec.router.kv_events is not True:
        return []
    return [
        Problem(
            "spec.router.kvEvents",
            "true is not allowed with spec.engine.type sglang-jax: SGLang-JAX publishes no KV "
            "events (its router learns prefixes from what it routes); allowed: false or unset",
        )
    ]


def _fit(spec: TPUModelServerSpec, shape: SliceShape) -> list[Problem]:
    """The fit check, when the performance model knows the model; otherwise no opinion."""
    profile = model_profile.profile_of(spec)
    if profile is None:
        return []
    context_length = spec.model.context_length or profile.context_length
    try:
        perf_model.check_fits(
            shape,
            profile,
            spec.model.quantization,
            spec.engine.kv_cache_dtype,
            context_length,
            engine=spec.engine.type,
        )
    except perf_model.ModelDoesNotFit as err:
        return [Problem("spec.tpu.topology", str(err), reason=Reason.MODEL_DOES_NOT_FIT)]
    except ValueError as err:
        # The performance model does not cover this quantization yet: no opinion.
        log.debug("fit check skipped for %s: %s", profile.name, err)
    return []
