"""The ValidatingAdmissionPolicy that refuses at `kubectl apply` what the operator would refuse.

The CRD's schema and CEL rules cannot know the topology catalog, the model profiles or the
launch contract, so without this a v6e `3x3` or a 70B model on one v5e chip is accepted and only
turns into `Valid=False` later. The policy runs, inside kube-apiserver, the checks of
`validation.validate` that need those facts, with the operator's own messages word for word
(field first, then value and what is allowed), joined with "; " as `InvalidSpec` joins them:

- the (generation, topology) pair is in the catalog (reason UnsupportedTopology);
- a simulated engine has a performance profile for the model, built in or given by
  `spec.model.architecture` (UnknownModel);
- no override touches what the operator owns: launch-contract variables in `engine.env`
  (and every entry has a name), flags in `engine.args` (SGLang's, or SGLang-JAX's with
  engine type sglang-jax), label keys in `template.labels`,
  `google.com/tpu` in `engine.resources` (ReservedField);
- the model fits the slice's HBM when the performance model knows it (ModelDoesNotFit);
- `kvCache.host.sizeGB` fits the host's engine memory when `engine.resources` leaves memory at
  its default (`host_kv.problems`, HostKvCacheDoesNotFit, its message template);
- prefill/decode roles (`disaggregation.problems`, messages from its templates): no SGLang
  engine, no `spec.autoscaling`, each role's autoscaling by a metric of that role and never to
  zero, one image, page size and KV dtype, role slices in the catalog, TP
  sizes that pair, no disaggregation flag in `engine.args` or a role's `args`, and no flag
  the operator owns in a role's `args`.

Left to the operator: `kvCache.host.sizeGB` with a memory override in `engine.resources`,
`kvCache.host.ratio` (it needs the device pool), the fit of a model given by
`spec.model.architecture` (its parameter count is the operator's arithmetic), the fine print
of model sources (gs:// bucket and pvc:// claim names, paths), non-scalar `engine.args` (and
role `args`) values, `engine.args` that are no flag of SGLang-JAX's server and the
engine settings SGLang-JAX lacks (engine type sglang-jax: the launch contract refuses them),
`spec.disaggregation` and `router.kvEvents: true` with engine type sglang-jax, and whether
a role's own slice fits the model; the CRD's own rules already cover the rest.

The facts come as the policy's parameters, a ConfigMap whose data this module generates from
`sglang_tpu.topology`, `sglang_tpu.perf_model` and the launch contract (numbers as Python
`repr`, so kube-apiserver reads the same doubles); the expressions only look them up. ConfigMap
values are strings, so a list is one value joined with ", ". Two things are written here a
second time, in CEL, and `tests/unit/operator/test_admission_policy.py` holds them equal to the
Python they mirror for every catalog entry, model, quantization and KV dtype: the message
templates, and the model-id normalisation of `perf_model.lookup_hf_model`.

Why a ValidatingAdmissionPolicy and not a webhook served by the operator: docs/operator.md,
"Admission".
"""

from __future__ import annotations

import string
import typing
from typing import Any

from sglang_tpu import hicache, perf_model
from sglang_tpu.topology import GIB, SLICE_SHAPES, TPU_RESOURCE, generation_names, topologies_for
from tpuserve_operator import disaggregation, host_kv, labels, launch_contract, validation
from tpuserve_operator.api import EngineSpec, ModelSpec
from tpuserve_operator.render import inference_pool

JSON = dict[str, Any]
LIST_SEPARATOR = ", "
DEFAULT_ENGINE_TYPE = EngineSpec.model_fields["type"].default


def quantizations() -> tuple[str, ...]:
    """spec.model.quantization's allowed values (the CRD's enum)."""
    return typing.get_args(ModelSpec.model_fields["quantization"].annotation)


def kv_cache_dtypes() -> tuple[str, ...]:
    """spec.engine.kvCacheDtype's allowed values (the CRD's enum)."""
    return typing.get_args(EngineSpec.model_fields["kv_cache_dtype"].annotation)


def _join(items: typing.Iterable[str]) -> str:
    return LIST_SEPARATOR.join(items)


def _gib(value: float, digits: int) -> str:
    return f"{value / GIB:.{digits}f}"


def parameters() -> dict[str, str]:
    """The parameter ConfigMap's data: the catalog, the model profiles, the owned names."""
    data: dict[str, str] = {}
    for generation in generation_names():
        data[f"topologies.{generation}"] = _join(topologies_for(generation))
    for shape in SLICE_SHAPES:
        usable = perf_model.usable_hbm_bytes(shape)
        key = f"slice.{shape.generation.name}.{shape.topology}"
        data[f"{key}.usableBytes"] = repr(usable)
        data[f"{key}.devices"] = str(shape.devices)
        limit = host_kv.default_memory_limit(shape)
        data[f"{key}.hostKvMaxSizeGB"] = str(hicache.max_size_gb(shape, limit))
        data[f"{key}.hostKvDescribe"] = host_kv.describe(shape, limit)
        data[f"{key}.describe"] = (
            f"{shape.key} ({shape.chips} chips, {_gib(usable, 1)} GiB usable of "
            f"{_gib(shape.hbm_bytes, 0)} GiB HBM)"
        )
    exact: dict[str, str] = {}
    bases: dict[str, str] = {}
    for profile in perf_model.PROFILES.values():
        for hf_id in profile.hf_ids:
            exact[hf_id.lower()] = profile.name
            # lookup_hf_model's fallback key; the CEL variable `base` recomputes it.
            bases[perf_model._normalise(hf_id)] = profile.name
        key = f"profile.{profile.name}"
        data[f"{key}.contextLength"] = str(profile.context_length)
        for quantization in quantizations():
            weights = profile.weight_bytes(quantization)
            data[f"{key}.weightBytes.{quantization}"] = repr(weights)
            data[f"{key}.weightGiB.{quantization}"] = _gib(weights, 1)
        for dtype in kv_cache_dtypes():
            data[f"{key}.kvBytesPerToken.{dtype}"] = repr(profile.kv_bytes_per_token(dtype))
    data["models.exact"] = " ".join(f"{k}={v}" for k, v in exact.items())
    data["models.base"] = " ".join(f"{k}={v}" for k, v in bases.items())
    data["models.known"] = _join(validation.known_model_ids())
    data["owned.envNames"] = _join(sorted(launch_contract.OWNED_ENV_NAMES))
    data["owned.envPrefixes"] = _join(launch_contract.OWNED_ENV_PREFIXES)
    data["owned.flags"] = _join(sorted(launch_contract.OWNED_FLAG_NAMES))
    data["owned.sglJaxFlags"] = _join(sorted(launch_contract.SGL_JAX_OWNED_FLAG_NAMES))
    data["owned.labelKeys"] = _join(validation.OWNED_LABEL_KEYS)
    data["owned.labelPrefixes"] = _join(validation.OWNED_LABEL_PREFIXES)
    return dict(sorted(data.items()))


def _param(key: str) -> str:
    """CEL for the parameter `key` (itself a CEL string expression)."""
    return f"params.data[{key}]"


def _param_list(name: str) -> str:
    return f"params.data['{name}'].split('{LIST_SEPARATOR}')"


def _has(path: str) -> str:
    """CEL: every step of `object.a.b.c` is present (CRD defaults fill most of them)."""
    steps = path.split(".")
    return " && ".join(f"has({'.'.join(steps[: i + 1])})" for i in range(1, len(steps)))


def _or_default(path: str, default: str) -> str:
    return f"{_has(path)} ? {path} : {default}"


def _cel_string(text: str) -> str:
    """``text`` as a CEL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fixed1(expression: str) -> str:
    """CEL: Python's f'{x:.1f}'. CEL's format groups thousands ('1,234.5'); Python does not."""
    return f"'%.1f'.format([{expression}]).replace(',', '')"


def _template(template: str, **values: str) -> str:
    """CEL that fills ``template`` (a `str.format` template) with CEL string expressions."""
    parts = []
    for literal, field, _, _ in string.Formatter().parse(template):
        if literal:
            parts.append(_cel_string(literal))
        if field is not None:
            parts.append(f"({values[field]})")
    return " + ".join(parts)


def _repr(expression: str) -> str:
    """CEL: Python's repr of a scalar JSON value (what the operator's messages print); other
    values (lists, maps) the operator refuses on their own, so their text does not matter."""
    return (
        f"(type({expression}) == string ? '\\'' + {expression} + '\\'' : "
        f"(type({expression}) == bool ? ({expression} ? 'True' : 'False') : "
        f"(type({expression}) == int || type({expression}) == double ? "
        f"string({expression}) : '...')))"
    )


def _strip_dashes(key: str) -> str:
    """CEL: ``key.lstrip('-')``."""
    return f"{key}.substring(size({key}.find('^-*')))"


GIB_CEL = f"{float(GIB)!r}"
# `lookup_hf_model`'s fallback (`perf_model._normalise`): last path segment, lower-cased,
# without a leading `meta-` and a trailing `-instruct`, `-MMDD` date and quantization suffix.
SUFFIX_PATTERN = "(-instruct)?(-[0-9]{4})?(-fp8|-awq|-int4|-int8)?$"


def _role_variables(role: str) -> tuple[tuple[str, str], ...]:
    """The variables of one PD role: its args, image, paired flags and slice."""
    part = f"object.spec.disaggregation.{role}"
    args = f"variables.{role}Args"
    image = (
        f"{_has(part + '.image')} ? '\\'' + {part}.image + '\\'' : "
        f"({_has('object.spec.engine.image')} ? '\\'' + object.spec.engine.image + '\\'' : "
        "'None')"
    )
    paired = tuple(
        (
            f"{role}{flag.title().replace('-', '')}",
            f"{_cel_string(flag)} in {args} ? {_repr(f'{args}[{_cel_string(flag)}]')} : "
            f"({_cel_string(flag)} in variables.args ? "
            f"{_repr(f'variables.args[{_cel_string(flag)}]')} : 'None')",
        )
        for flag in disaggregation.PAIRED_FLAGS
    )
    scaling = f"{part}.autoscaling"
    field_scaling = f"spec.disaggregation.{role}.autoscaling"
    allowed = "[" + ", ".join(_cel_string(m) for m in disaggregation.ROLE_METRICS[role]) + "]"
    tpu = f"{part}.tpu"
    own_slice = f"'slice.' + {tpu}.generation + '.' + {tpu}.topology"
    field = f"spec.disaggregation.{role}.tpu.topology"
    return (
        (f"{role}Args", _or_default(f"{part}.args", "{}")),
        (f"{role}Image", image),
        *paired,
        (f"{role}OwnSlice", f"{_has(tpu)} ? {own_slice} : ''"),
        (
            f"{role}CatalogProblems",
            f"variables.{role}OwnSlice != '' && "
            f"!((variables.{role}OwnSlice + '.usableBytes') in params.data) ? ["
            + _cel_string(f"{field}: '")
            + f" + {tpu}.topology + '\\' is not allowed; not a ' + {tpu}.generation + "
            f"' topology; allowed: ' + {_param(repr('topologies.') + f' + {tpu}.generation')}"
            "] : []",
        ),
        # the role's slice when in the catalog, else the server's when in it, else none
        (
            f"{role}Slice",
            f"variables.{role}OwnSlice != '' && "
            f"(variables.{role}OwnSlice + '.usableBytes') in params.data ? "
            f"variables.{role}OwnSlice : (variables.inCatalog ? variables.slice : '')",
        ),
        (
            f"{role}ArgProblems",
            f"{args}.filter(k, {_strip_dashes('k')} in variables.pdFlags).map(k, "
            + _cel_string(f"spec.disaggregation.{role}.args.")
            + " + k + ': ' + "
            + _template(disaggregation.ROLE_ARG_MESSAGE, flag=_strip_dashes("k"))
            + ")",
        ),
        (
            f"{role}AutoscalingProblems",
            f"!({_has(scaling)}) ? [] : "
            f"(has({scaling}.metric) && !({scaling}.metric in {allowed}) ? ["
            + _cel_string(f"{field_scaling}.metric: ")
            + " + "
            + _template(
                disaggregation.ROLE_METRIC_MESSAGE,
                value=f"'\\'' + {scaling}.metric + '\\''",
                role=_cel_string(role),
                why=_cel_string(disaggregation.ROLE_METRIC_WHY[role]),
                allowed=_cel_string(", ".join(disaggregation.ROLE_METRICS[role])),
            )
            + "] : []) + "
            f"(has({scaling}.minReplicas) && {scaling}.minReplicas == 0 ? ["
            + _cel_string(
                f"{field_scaling}.minReplicas: {disaggregation.ROLE_MIN_REPLICAS_MESSAGE}"
            )
            + "] : [])",
        ),
        (
            f"{role}OwnedArgProblems",
            f"{args}.filter(k, ('--' + {_strip_dashes('k')}).split('=')[0] "
            f"in {_param_list('owned.flags')}).map(k, "
            + _cel_string(f"spec.disaggregation.{role}.args.")
            + " + k + ': --' + "
            + _strip_dashes("k")
            + " + ' is set by the operator from the spec; allowed: SGLang flags the operator "
            "does not set')",
        ),
    )


def _devices(slice_key: str) -> str:
    return f"int(params.data[{slice_key} + '.devices'])"


def _slice_words(slice_key: str) -> str:
    """CEL: 'v6e 2x4' of a 'slice.v6e.2x4' key."""
    return f"{slice_key}.split('.')[1] + ' ' + {slice_key}.split('.')[2]"


PD_FIELD = "spec.disaggregation"
PD_VARIABLES: tuple[tuple[str, str], ...] = (
    ("dis", "has(object.spec.disaggregation)"),
    ("pdFlags", "[" + ", ".join(_cel_string(f) for f in disaggregation.OWNED_FLAGS) + "]"),
    (
        "pdEngineArgProblems",
        f"variables.args.filter(k, {_strip_dashes('k')} in variables.pdFlags)"
        ".map(k, 'spec.engine.args.' + k + ': ' + "
        + _template(disaggregation.ENGINE_ARG_MESSAGE, flag=_strip_dashes("k"))
        + ")",
    ),
    *(v for role in disaggregation.ROLES for v in _role_variables(role)),
    (
        "pdProblems",
        "variables.pdEngineArgProblems + (!variables.dis ? [] : "
        # transfer backend (engine sglang), autoscaling, images
        "(variables.engineType == 'sglang' ? ["
        + _cel_string(f"{PD_FIELD}.transferBackend: ")
        + " + "
        + _template(
            disaggregation.TRANSFER_BACKEND_MESSAGE,
            value="'\\'' + object.spec.disaggregation.transferBackend + '\\''",
        )
        + "] : []) + "
        "(has(object.spec.autoscaling) ? ["
        + _cel_string(f"spec.autoscaling: {disaggregation.AUTOSCALING_MESSAGE}")
        + "] : []) + "
        + " + ".join(f"variables.{role}AutoscalingProblems" for role in disaggregation.ROLES)
        + " + "
        "(variables.prefillImage != variables.decodeImage ? ["
        + _cel_string(f"{PD_FIELD}.decode.image: ")
        + " + "
        + _template(
            disaggregation.IMAGE_MESSAGE,
            decode="variables.decodeImage",
            prefill="variables.prefillImage",
        )
        + "] : []) + "
        + " + ".join(f"variables.{role}ArgProblems" for role in disaggregation.ROLES)
        + " + "
        + " + ".join(
            f"(variables.prefill{v} != variables.decode{v} ? ["
            + _cel_string(f"{PD_FIELD}.decode.args.{flag}: ")
            + " + "
            + _template(
                disaggregation.PAIRED_MESSAGE,
                decode=f"variables.decode{v}",
                prefill=f"variables.prefill{v}",
                flag=_cel_string(flag),
            )
            + "] : [])"
            for flag in disaggregation.PAIRED_FLAGS
            for v in (flag.title().replace("-", ""),)
        )
        + " + "
        + " + ".join(f"variables.{role}CatalogProblems" for role in disaggregation.ROLES)
        + " + (variables.prefillSlice != '' && variables.decodeSlice != '' && "
        # tp_pairs: the larger a multiple of the smaller
        f"({_devices('variables.prefillSlice')} > {_devices('variables.decodeSlice')} ? "
        f"{_devices('variables.prefillSlice')} % {_devices('variables.decodeSlice')} : "
        f"{_devices('variables.decodeSlice')} % {_devices('variables.prefillSlice')}) != 0 ? ["
        + _cel_string(f"{PD_FIELD}.decode.tpu.topology: ")
        + " + "
        + _template(
            disaggregation.TP_MESSAGE,
            decode_tp=f"string({_devices('variables.decodeSlice')})",
            decode_slice=_slice_words("variables.decodeSlice"),
            prefill_tp=f"string({_devices('variables.prefillSlice')})",
            prefill_slice=_slice_words("variables.prefillSlice"),
        )
        + "] : []))",
    ),
    (
        "roleArgProblems",
        "!variables.dis ? [] : "
        + " + ".join(f"variables.{role}OwnedArgProblems" for role in disaggregation.ROLES),
    ),
)

_ENV_NAME_MISSING = (
    "(!has(variables.env[i].name) || type(variables.env[i].name) != string || "
    "variables.env[i].name == '')"
)

VARIABLES: tuple[tuple[str, str], ...] = (
    ("generation", "object.spec.tpu.generation"),
    ("topology", "object.spec.tpu.topology"),
    ("slice", "'slice.' + variables.generation + '.' + variables.topology"),
    ("inCatalog", "(variables.slice + '.usableBytes') in params.data"),
    ("source", "object.spec.model.source"),
    (
        "modelId",
        "(variables.source.indexOf('://') >= 0 ? "
        "variables.source.substring(variables.source.indexOf('://') + 3) : variables.source)"
        ".split('@')[0].lowerAscii()",
    ),
    ("segment", "variables.modelId.find('[^/]*/*$').find('^[^/]*')"),
    (
        "unprefixed",
        "variables.segment.startsWith('meta-') ? variables.segment.substring(5) : "
        "variables.segment",
    ),
    (
        "base",
        "variables.unprefixed.substring(0, size(variables.unprefixed) - "
        f"size(variables.unprefixed.find('{SUFFIX_PATTERN}')))",
    ),
    (
        "exactMatches",
        "params.data['models.exact'].split(' ').filter(e, e.split('=')[0] == variables.modelId)",
    ),
    (
        "baseMatches",
        "params.data['models.base'].split(' ').filter(e, e.split('=')[0] == variables.base)",
    ),
    (
        "profile",
        "size(variables.exactMatches) > 0 ? variables.exactMatches[0].split('=')[1] : "
        "(size(variables.baseMatches) > 0 ? variables.baseMatches[0].split('=')[1] : '')",
    ),
    ("engineType", _or_default("object.spec.engine.type", f"'{DEFAULT_ENGINE_TYPE}'")),
    ("env", _or_default("object.spec.engine.env", "[]")),
    ("args", _or_default("object.spec.engine.args", "{}")),
    ("labels", _or_default("object.spec.template.labels", "{}")),
    ("resources", _or_default("object.spec.engine.resources", "{}")),
    # --- the fit check: weights + one contextLength sequence of KV against usable HBM ---
    # A model given by spec.model.architecture: its fit is left to the operator.
    (
        "fits",
        "!variables.inCatalog || variables.profile == '' || "
        f"({_has('object.spec.model.architecture')})",
    ),
    ("quantization", _or_default("object.spec.model.quantization", "'none'")),
    ("kvCacheDtype", _or_default("object.spec.engine.kvCacheDtype", "'auto'")),
    ("profileKey", "'profile.' + variables.profile"),
    (
        "contextLength",
        "variables.fits ? 0 : ("
        + _or_default(
            "object.spec.model.contextLength",
            "int(" + _param("variables.profileKey + '.contextLength'") + ")",
        )
        + ")",
    ),
    (
        "weightBytes",
        "variables.fits ? 0.0 : double("
        + _param("variables.profileKey + '.weightBytes.' + variables.quantization")
        + ")",
    ),
    (
        "kvBytes",
        "variables.fits ? 0.0 : double("
        + _param("variables.profileKey + '.kvBytesPerToken.' + variables.kvCacheDtype")
        + ") * double(variables.contextLength)",
    ),
    (
        "missingBytes",
        "variables.fits ? 0.0 : variables.weightBytes + variables.kvBytes - double("
        + _param("variables.slice + '.usableBytes'")
        + ")",
    ),
    # --- one list of problems per check, in the order validation.validate reports them ---
    (
        "catalogProblems",
        "variables.inCatalog ? [] : ['spec.tpu.topology: \\'' + variables.topology + "
        "'\\' is not allowed; not a ' + variables.generation + ' topology; allowed: ' + "
        + _param("'topologies.' + variables.generation")
        + "]",
    ),
    (
        "modelProblems",
        "variables.engineType == 'simulated' && variables.profile == '' && "
        f"!({_has('object.spec.model.architecture')}) ? "
        "['spec.model.source: the simulated engine has no performance profile for \\'' + "
        "variables.source + '\\'; allowed: hf:// ids of known models (' + "
        "params.data['models.known'] + '), or any decoder with spec.model.architecture (its "
        "config.json\\'s facts)'] : []",
    ),
    (
        "envProblems",
        f"lists.range(size(variables.env)).filter(i, {_ENV_NAME_MISSING} || "
        f"variables.env[i].name in {_param_list('owned.envNames')} || "
        f"{_param_list('owned.envPrefixes')}.exists(p, variables.env[i].name.startsWith(p)))"
        ".map(i, 'spec.engine.env[' + string(i) + '].name: ' + "
        f"({_ENV_NAME_MISSING} ? 'is required' : '\\'' + variables.env[i].name + "
        "'\\' is set by the operator (launch contract); allowed: any other name'))",
    ),
    (
        "sglJax",
        "variables.engineType == 'sglang-jax'",
    ),
    (
        "argProblems",
        "variables.args.filter(k, ('--' + k.substring(size(k.find('^-*')))).split('=')[0] "
        f"in (variables.sglJax ? {_param_list('owned.sglJaxFlags')} : "
        f"{_param_list('owned.flags')}))"
        ".map(k, 'spec.engine.args.' + k + ': --' + k.substring(size(k.find('^-*'))) + "
        "' is set by the operator from the spec; allowed: ' + "
        "(variables.sglJax ? 'SGLang-JAX' : 'SGLang') + ' flags the operator does not set')",
    ),
    (
        "labelProblems",
        f"variables.labels.filter(k, k in {_param_list('owned.labelKeys')} || "
        f"{_param_list('owned.labelPrefixes')}.exists(p, k.startsWith(p)))"
        ".map(k, 'spec.template.labels.' + k + ': is set by the operator; allowed: keys other "
        "than ' + params.data['owned.labelKeys'] + ' and ' + "
        "params.data['owned.labelPrefixes'] + '*')",
    ),
    (
        "resourceProblems",
        "['requests', 'limits'].filter(s, s in variables.resources && "
        f"type(variables.resources[s]) == map && '{TPU_RESOURCE}' in variables.resources[s])"
        f".map(s, 'spec.engine.resources.' + s + '.{TPU_RESOURCE}: is set by the operator to "
        "the chips of one host (topology catalog); allowed: cpu, memory and other resources')",
    ),
    (
        "fitProblems",
        "variables.missingBytes > 0.0 ? ['spec.tpu.topology: ' + variables.profile + ' (' + "
        "variables.quantization + ' weights ' + "
        + _param("variables.profileKey + '.weightGiB.' + variables.quantization")
        + " + ' GiB + ' + variables.kvCacheDtype + ' KV for ' + "
        "string(variables.contextLength) + ' tokens ' + "
        + _fixed1(f"variables.kvBytes / {GIB_CEL}")
        + " + ' GiB) does not fit ' + "
        + _param("variables.slice + '.describe'")
        + " + ': short by ' + "
        + _fixed1(f"variables.missingBytes / {GIB_CEL}")
        + " + ' GiB; use a larger topology, quantization fp8 or a shorter context'] : []",
    ),
    # --- host_kv.problems: sizeGB against the default engine memory ---
    (
        "hostKvSize",
        _or_default("object.spec.kvCache.host.sizeGB", "0"),
    ),
    (
        "memoryOverridden",
        "['requests', 'limits'].exists(s, s in variables.resources && "
        "type(variables.resources[s]) == map && 'memory' in variables.resources[s])",
    ),
    (
        "hostKvProblems",
        "variables.inCatalog && variables.hostKvSize > 0 && "
        "(variables.engineType != 'sglang' || !variables.memoryOverridden) && "
        "variables.hostKvSize > int("
        + _param("variables.slice + '.hostKvMaxSizeGB'")
        + ") ? ["
        + _cel_string(f"{host_kv.SIZE_FIELD}: ")
        + " + "
        + _template(
            host_kv.SIZE_MESSAGE,
            value="string(variables.hostKvSize)",
            host=_param("variables.slice + '.hostKvDescribe'"),
            largest=_param("variables.slice + '.hostKvMaxSizeGB'"),
        )
        + "] : []",
    ),
    # --- render.inference_pool.pool_problems, checked after the others ---
    (
        "poolProblems",
        "has(object.spec.inferencePool) ? ("
        "(has(object.spec.router) && has(object.spec.router.enabled) && "
        "!object.spec.router.enabled ? ["
        + _cel_string(f"{inference_pool.FIELD}: {inference_pool.NEEDS_ROUTER}")
        + "] : []) + "
        f"('{inference_pool.CLUSTER_PARAM}' in params.data && "
        f"params.data['{inference_pool.CLUSTER_PARAM}'] == 'false' ? ["
        + _cel_string(f"{inference_pool.FIELD}: {inference_pool.NO_CRD}")
        + "] : []) + "
        "(has(object.spec.disaggregation) ? ["
        + _cel_string(f"{inference_pool.FIELD}: {inference_pool.WITH_DISAGGREGATION}")
        + "] : [])) : []",
    ),
    *PD_VARIABLES,
    (
        "problems",
        "variables.catalogProblems + variables.modelProblems + variables.pdProblems + "
        "variables.envProblems + variables.argProblems + variables.roleArgProblems + "
        "variables.labelProblems + variables.resourceProblems + variables.fitProblems + "
        "variables.hostKvProblems + variables.poolProblems",
    ),
)


def policy_spec() -> JSON:
    """The ValidatingAdmissionPolicy's spec (the chart adds its name and the binding)."""
    group, version = labels.API_VERSION.split("/")
    return {
        "failurePolicy": "Fail",
        "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [group],
                    "apiVersions": [version],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": [labels.PLURAL],
                }
            ]
        },
        # Metadata-only updates (kopf's finalizer and annotations, `kubectl annotate`) pass, so
        # an object created before the policy (or before a catalog change) stays manageable.
        "matchConditions": [
            {
                "name": "spec-changed",
                "expression": "request.operation == 'CREATE' || object.spec != oldObject.spec",
            }
        ],
        "variables": [{"name": name, "expression": expr} for name, expr in VARIABLES],
        "validations": [
            {
                "expression": "size(variables.problems) == 0",
                "messageExpression": "variables.problems.join('; ')",
                "reason": "Invalid",
            }
        ],
    }


def chart_file() -> JSON:
    """`charts/tpuserve/files/admission-policy.yaml`: the policy's spec and its parameters."""
    return {"policy": {"spec": policy_spec()}, "parameters": {"data": parameters()}}
