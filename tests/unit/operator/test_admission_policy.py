"""The admission policy refuses exactly what the operator's validation refuses, in its words.

The policy's CEL is evaluated here with cel-python, given the few functions of Kubernetes' CEL
libraries it uses (strings, regex, lists, format). Every case is compared with
`validation.validate` on the same spec: the policy's message must be the operator's `Valid`
message. The same policy runs in kube-apiserver in tests/e2e/test_admission.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import celpy
import pytest
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError, CELFunction

from sglang_tpu import perf_model
from sglang_tpu.topology import SLICE_SHAPES, generation_names
from tests.fake_kube import operator_verdict, tms_object
from tpuserve_operator.build import admission

pytestmark = pytest.mark.unit

# --- Kubernetes' CEL extension functions the policy calls, as cel-go defines them ---------


def _format(template: Any, args: Any) -> celtypes.StringType:
    """cel-go's `format`: %s, %d, %.Nf; like cel-go, %f groups thousands with commas."""
    values = iter(args)

    def one(match: re.Match[str]) -> str:
        value: Any = next(values)
        if match.group(2) == "f":
            return f"{float(value):,.{int(match.group(1) or 6)}f}"
        return str(value)

    return celtypes.StringType(re.sub(r"%(?:\.(\d+))?([sdf])", one, str(template)))


def _substring(text: Any, start: Any, end: Any = None) -> celtypes.StringType:
    return celtypes.StringType(str(text)[int(start) : None if end is None else int(end)])


def _find(text: Any, pattern: Any) -> celtypes.StringType:
    found = re.search(str(pattern), str(text))
    return celtypes.StringType(found.group(0) if found else "")


def _index_of(target: Any, item: Any) -> celtypes.IntType:
    return celtypes.IntType(str(target).find(str(item)))


def _join(items: Any, sep: Any) -> celtypes.StringType:
    return celtypes.StringType(str(sep).join(str(i) for i in items))


def _split(text: Any, sep: Any) -> celtypes.ListType:
    return celtypes.ListType([celtypes.StringType(s) for s in str(text).split(str(sep))])


def _replace(text: Any, old: Any, new: Any) -> celtypes.StringType:
    return celtypes.StringType(str(text).replace(str(old), str(new)))


def _lower_ascii(text: Any) -> celtypes.StringType:
    return celtypes.StringType(str(text).lower())


def _range(_lists: Any, n: Any) -> celtypes.ListType:
    """`lists.range(n)`: `lists` is bound to an empty map, so this is a method call on it."""
    return celtypes.ListType([celtypes.IntType(i) for i in range(int(n))])


K8S_FUNCTIONS: dict[str, CELFunction] = {
    "format": _format,
    "join": _join,
    "split": _split,
    "replace": _replace,
    "lowerAscii": _lower_ascii,
    "substring": _substring,
    "find": _find,
    "indexOf": _index_of,
    "range": _range,
}


class Policy:
    """The generated policy's variables and validation, evaluated in order (as the apiserver's
    lazy evaluation would, for the variables a failing validation reads)."""

    def __init__(self) -> None:
        env = celpy.Environment()
        spec = admission.policy_spec()
        self.variables = [
            (v["name"], env.program(env.compile(v["expression"]), functions=K8S_FUNCTIONS))
            for v in spec["variables"]
        ]
        (validation_rule,) = spec["validations"]
        self.valid = env.program(
            env.compile(validation_rule["expression"]), functions=K8S_FUNCTIONS
        )
        self.message = env.program(
            env.compile(validation_rule["messageExpression"]), functions=K8S_FUNCTIONS
        )
        self.params = json_to_cel({"data": admission.parameters()})

    def denies(self, obj: Mapping[str, Any]) -> str | None:
        """The policy's message for `obj`, or None when it admits it."""
        variables: dict[str, Any] = {}
        activation: dict[str, Any] = {
            "object": json_to_cel(dict(obj)),
            "params": self.params,
            "lists": celtypes.MapType({}),
        }
        for name, program in self.variables:
            activation["variables"] = celtypes.MapType(
                {celtypes.StringType(k): v for k, v in variables.items()}
            )
            value = program.evaluate(activation)
            assert not isinstance(value, CELEvalError), f"variable {name}: {value!r}"
            variables[name] = value
        activation["variables"] = celtypes.MapType(
            {celtypes.StringType(k): v for k, v in variables.items()}
        )
        if self.valid.evaluate(activation):
            return None
        return str(self.message.evaluate(activation))


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy()


def assert_same_verdict(policy: Policy, obj: Mapping[str, Any]) -> str | None:
    expected = operator_verdict(obj)
    assert policy.denies(obj) == expected
    return expected


def _first_ids() -> Iterator[str]:
    for profile in perf_model.PROFILES.values():
        yield profile.hf_ids[0]


# --- the checks ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SLICE_SHAPES, ids=lambda s: s.key)
def test_every_catalog_slice_with_every_model_is_judged_as_the_operator_does(
    policy: Policy, shape: Any
) -> None:
    verdicts = [
        assert_same_verdict(
            policy,
            tms_object(f"hf://{hf_id}", shape.generation.name, shape.topology, quantization=q),
        )
        for hf_id in _first_ids()
        for q in ("none", "fp8")
    ]
    if shape.chips == 1:
        assert any(v and "does not fit" in v for v in verdicts)


@pytest.mark.parametrize("quantization", admission.quantizations())
@pytest.mark.parametrize("kv_cache_dtype", admission.kv_cache_dtypes())
def test_every_quantization_and_kv_dtype_is_sized_as_the_operator_does(
    policy: Policy, quantization: str, kv_cache_dtype: str
) -> None:
    for hf_id in _first_ids():
        for generation, topology in (("v5e", "2x4"), ("v6e", "4x4"), ("v5e", "1x1")):
            assert_same_verdict(
                policy,
                tms_object(
                    f"hf://{hf_id}",
                    generation,
                    topology,
                    quantization=quantization,
                    kv_cache_dtype=kv_cache_dtype,
                ),
            )


@pytest.mark.parametrize("context_length", [1, 4096, 131072, 1_000_000, 10_485_760])
def test_context_length_enters_the_fit_check(policy: Policy, context_length: int) -> None:
    message = assert_same_verdict(
        policy,
        tms_object("hf://meta-llama/Llama-3.1-8B", "v6e", "2x4", context_length=context_length),
    )
    if context_length == 10_485_760:  # KV beyond 1000 GiB: no thousands separator, as Python
        assert message is not None
        assert "1280.0 GiB)" in message


@pytest.mark.parametrize("generation", generation_names())
def test_a_topology_the_generation_lacks_is_refused_listing_the_valid_ones(
    policy: Policy, generation: str
) -> None:
    topology = "3x3x3" if generation in ("v5p", "tpu7x") else "3x3"
    message = assert_same_verdict(policy, tms_object(generation=generation, topology=topology))
    assert message is not None
    assert message.startswith(f"spec.tpu.topology: '{topology}' is not allowed")


@pytest.mark.parametrize(
    "source",
    [
        "hf://meta-llama/Meta-Llama-3.1-8B-Instruct",
        "hf://META-LLAMA/llama-3.1-8b-instruct@main",
        "hf://someone/Llama-3.3-70B-Instruct-FP8",
        "hf://someone/Qwen3-235B-A22B-Instruct-2507",
        "hf://someone/meta-llama-3.1-70b-instruct-awq",
        "gs://models-bucket/exports/Qwen3-32B/",
        "pvc://weights/llama-3.3-70b",
        "/models/qwen3-8b-int4",
        "hf://someone/qwen3-8b-chat",
        "hf://someone/unknown-model",
    ],
)
@pytest.mark.parametrize("engine_type", ["sglang", "simulated"])
def test_model_ids_resolve_to_the_operators_profile(
    policy: Policy, source: str, engine_type: str
) -> None:
    assert_same_verdict(policy, tms_object(source, "v5e", "1x1", engine_type=engine_type))
    assert_same_verdict(policy, tms_object(source, "v6e", "4x4", engine_type=engine_type))


MISTRAL_ARCHITECTURE = {
    "numHiddenLayers": 32, "hiddenSize": 4096, "numAttentionHeads": 32, "numKeyValueHeads": 8,
    "headDim": 128, "intermediateSize": 14336, "vocabSize": 32768,
    "maxPositionEmbeddings": 32768,
}  # fmt: skip


@pytest.mark.parametrize("engine_type", ["sglang", "simulated"])
@pytest.mark.parametrize(
    "source", ["hf://mistralai/Mistral-7B-Instruct-v0.3", "hf://Qwen/Qwen3-8B"]
)
def test_a_model_given_by_its_architecture_is_admitted_as_the_operator_admits_it(
    policy: Policy, source: str, engine_type: str
) -> None:
    """spec.model.architecture: a simulated engine needs no built-in profile, and the fit
    check is the operator's (on v6e 1x1 Mistral 7B fits; a built-in name in the source does not
    decide the fit)."""
    obj = tms_object(source, "v6e", "1x1", engine_type=engine_type)
    obj["spec"]["model"]["architecture"] = MISTRAL_ARCHITECTURE
    assert assert_same_verdict(policy, obj) is None
    del obj["spec"]["model"]["architecture"]
    unknown = engine_type == "simulated" and "Mistral" in source
    assert (assert_same_verdict(policy, obj) is not None) is unknown


def test_overrides_of_what_the_operator_owns_are_refused_each_named(policy: Policy) -> None:
    obj = tms_object(
        engine={
            "env": [
                {"name": "TPU_WORKER_ID", "value": "3"},
                {"name": "FINE", "value": "1"},
                {"value": "no name"},
                {"name": "HF_TOKEN", "value": "secret"},
                {"name": "TPUSERVE_MODEL", "value": "x"},
            ],
            "args": {"port": 1, "--tp-size": 2, "mem-fraction-static": 0.8, "api-key": "k"},
            "resources": {"limits": {"google.com/tpu": "8", "memory": "1Gi"}},
        },
        template={"labels": {"model": "x", "team": "a", "app.kubernetes.io/name": "y"}},
    )
    message = assert_same_verdict(policy, obj)
    assert message is not None
    for field in (
        "spec.engine.env[0].name",
        "spec.engine.env[2].name: is required",
        "spec.engine.env[3].name",
        "spec.engine.env[4].name",
        "spec.engine.args.port",
        "spec.engine.args.--tp-size",
        "spec.engine.args.api-key",
        "spec.engine.resources.limits.google.com/tpu",
        "spec.template.labels.model",
        "spec.template.labels.app.kubernetes.io/name",
    ):
        assert field in message
    for fine in ("env[1]", "mem-fraction-static", "labels.team", "limits.memory"):
        assert fine not in message


def test_valid_examples_are_admitted(policy: Policy) -> None:
    assert policy.denies(tms_object()) is None
    simulated = tms_object("hf://Qwen/Qwen3-8B", "v6e", "4x4", engine_type="simulated")
    assert policy.denies(simulated) is None


def test_sgl_jax_flags_the_operator_owns_are_refused_as_the_operator_refuses_them(
    policy: Policy,
) -> None:
    obj = tms_object(
        "hf://Qwen/Qwen3-8B", "v5e", "4x4", engine_type="sglang-jax",
        engine={"args": {"tp-size": 2, "dist-init-addr": "x:1", "api-key": "k",
                         "mem-fraction-static": 0.8, "page-size": 64}},
    )  # fmt: skip
    message = assert_same_verdict(policy, obj)
    assert message is not None
    for field in ("spec.engine.args.tp-size", "spec.engine.args.dist-init-addr",
                  "spec.engine.args.api-key"):  # fmt: skip
        assert f"{field}: " in message
    assert "allowed: SGLang-JAX flags the operator does not set" in message
    assert "mem-fraction-static" not in message
    assert "page-size" not in message
    admitted = tms_object("hf://Qwen/Qwen3-8B", "v5e", "4x4", engine_type="sglang-jax")
    assert assert_same_verdict(policy, admitted) is None


# --- prefill/decode roles (spec.disaggregation) -------------------------------------------


def pd_object(engine_type: str = "simulated", **spec: Any) -> dict[str, Any]:
    """A disaggregated server as the apiserver passes it (the CRD's defaults filled in)."""
    obj = tms_object(engine_type=engine_type)
    obj["spec"]["disaggregation"] = {
        "transferBackend": "mooncake",
        "bootstrapPort": 8998,
        "policy": "conditional",
        "prefill": {"replicas": 1},
        "decode": {"replicas": 1},
    }
    for key, value in spec.items():
        if key in ("prefill", "decode"):
            obj["spec"]["disaggregation"][key].update(value)
        else:
            obj["spec"][key] = value
    return obj


PD_CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "valid": (pd_object(), None),
    "valid with role slices": (
        pd_object(prefill={"tpu": {"generation": "v6e", "topology": "4x4"}}),
        None,
    ),
    "sglang engine": (pd_object("sglang"), "spec.disaggregation.transferBackend"),
    "autoscaling": (pd_object(autoscaling={"maxReplicas": 4}), "spec.autoscaling"),
    "role autoscaling": (
        pd_object(
            prefill={"autoscaling": {"minReplicas": 1, "maxReplicas": 4, "metric": "ttft"}},
            decode={"autoscaling": {"minReplicas": 2, "maxReplicas": 4, "metric": "queue"}},
        ),
        None,
    ),
    "role autoscaling by another role's metric": (
        pd_object(
            prefill={
                "autoscaling": {"minReplicas": 1, "maxReplicas": 4, "metric": "tokensInFlight"}
            },
            decode={"autoscaling": {"minReplicas": 1, "maxReplicas": 4, "metric": "ttft"}},
        ),
        "spec.disaggregation.decode.autoscaling.metric: 'ttft' is not allowed for the decode role",
    ),
    "role autoscaling to zero": (
        pd_object(decode={"autoscaling": {"minReplicas": 0, "maxReplicas": 4, "metric": "queue"}}),
        "spec.disaggregation.decode.autoscaling.minReplicas: 0 is not allowed",
    ),
    "images": (pd_object(decode={"image": "example.com/other:1"}), "decode.image"),
    "images, one from the engine": (
        pd_object(engine={"type": "simulated", "image": "a:1"}, prefill={"image": "a:1"}),
        None,
    ),
    "images, both set": (
        pd_object(prefill={"image": "a:1"}, decode={"image": "a:2"}),
        "decode.image: 'a:2' differs from the prefill role's 'a:1'",
    ),
    "page size": (
        pd_object(decode={"args": {"page-size": 32}}),
        "decode.args.page-size: 32 differs from the prefill role's None",
    ),
    "page size from the engine": (
        pd_object(
            engine={"type": "simulated", "args": {"page-size": 16}},
            decode={"args": {"page-size": 32}},
        ),
        "decode.args.page-size: 32 differs from the prefill role's 16",
    ),
    "page size, the same": (
        pd_object(prefill={"args": {"page-size": 32}}, decode={"args": {"page-size": 32}}),
        None,
    ),
    "kv dtype": (
        pd_object(prefill={"args": {"kv-cache-dtype": "fp8_e5m2"}}),
        "decode.args.kv-cache-dtype: None differs from the prefill role's 'fp8_e5m2'",
    ),
    "flag types": (
        pd_object(prefill={"args": {"page-size": True}}, decode={"args": {"page-size": 0.5}}),
        "0.5 differs from the prefill role's True",
    ),
    "engine pd flag": (
        pd_object(engine={"type": "simulated", "args": {"--disaggregation-mode": "decode"}}),
        "spec.engine.args.--disaggregation-mode: --disaggregation-mode is set by the operator",
    ),
    "engine pd flag without roles": (
        tms_object(engine={"args": {"disaggregation-bootstrap-port": 1}}),
        "spec.engine.args.disaggregation-bootstrap-port",
    ),
    "role pd flag": (
        pd_object(prefill={"args": {"disaggregation-bootstrap-port": 1}}),
        "spec.disaggregation.prefill.args.disaggregation-bootstrap-port",
    ),
    "role owned flag": (
        pd_object(decode={"args": {"tp-size": 4, "api-key": "k"}}),
        "spec.disaggregation.decode.args.tp-size: --tp-size is set by the operator",
    ),
    "role slice": (
        pd_object(decode={"tpu": {"generation": "v6e", "topology": "3x3"}}),
        "spec.disaggregation.decode.tpu.topology: '3x3' is not allowed; not a v6e topology",
    ),
    "role slice, server slice unknown": (
        pd_object(
            tpu={"generation": "v6e", "topology": "3x3"},
            prefill={"tpu": {"generation": "v5e", "topology": "2x4"}},
            decode={"tpu": {"generation": "v6e", "topology": "2x4"}},
        ),
        "spec.tpu.topology",
    ),
    "everything at once": (
        pd_object(
            "sglang",
            autoscaling={"maxReplicas": 2},
            engine={"type": "sglang", "args": {"disaggregation-mode": "x", "port": 1}},
            prefill={
                "image": "a:1",
                "args": {"disaggregation-mode": "y", "page-size": 8},
                "autoscaling": {"minReplicas": 0, "maxReplicas": 2, "metric": "tokensInFlight"},
            },
            decode={"tpu": {"generation": "v6e", "topology": "9x9"}, "args": {"port": 2}},
        ),
        "spec.disaggregation.decode.args.port",
    ),
}


@pytest.mark.parametrize("case", PD_CASES)
def test_disaggregated_servers_are_judged_as_the_operator_does(policy: Policy, case: str) -> None:
    obj, expected = PD_CASES[case]
    message = assert_same_verdict(policy, obj)
    if expected is None:
        assert message is None
    else:
        assert message is not None
        assert expected in message


def test_tp_sizes_that_cannot_pair_are_refused(policy: Policy) -> None:
    """No two catalog slices fail to pair (all are powers of two): a catalog where a slice
    has 6 devices shows the policy's branch, with the operator's template."""
    from tpuserve_operator import disaggregation

    odd = Policy()
    odd.params = json_to_cel({"data": {**admission.parameters(), "slice.v6e.4x4.devices": "6"}})
    obj = pd_object(decode={"tpu": {"generation": "v6e", "topology": "4x4"}})
    assert policy.denies(obj) is None
    expected = disaggregation.TP_MESSAGE.format(
        decode_tp=6, decode_slice="v6e 4x4", prefill_tp=8, prefill_slice="v6e 2x4"
    )
    assert odd.denies(obj) == f"spec.disaggregation.decode.tpu.topology: {expected}"
