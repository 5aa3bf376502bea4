"""The performance profile of a server's model: its spec.model.architecture, else a built-in.

One place answers "which `ModelProfile` does this TPUModelServer serve" for the fit check,
the autoscaler's prefill figure, the host KV tier and the simulated engine: the profile made
from ``spec.model.architecture`` (the model's config.json facts, `sglang_tpu.model_config`)
when the spec gives one, else the built-in profile of ``spec.model.source``'s model id
(`perf_model.lookup_hf_model`), else None (the model is unknown).
"""

from __future__ import annotations

from pydantic.alias_generators import to_camel

from sglang_tpu import model_config, perf_model
from sglang_tpu.model_source import model_id
from tpuserve_operator.api import TPUModelServerSpec

FIELD = "spec.model.architecture"


def profile_of(spec: TPUModelServerSpec) -> perf_model.ModelProfile | None:
    """The model's profile (see the module doc); None when unknown or its architecture is
    refused (`problem` says why)."""
    architecture = spec.model.architecture
    if architecture is None:
        return perf_model.lookup_hf_model(model_id(spec.model.source))
    try:
        name = model_id(spec.model.source).rstrip("/").rsplit("/", 1)[-1].lower()
        return model_config.profile_from_config(architecture.hf_config(), FIELD, name)
    except model_config.ModelConfigError:
        return None


def problem(spec: TPUModelServerSpec) -> str | None:
    """What is wrong with spec.model.architecture beyond its schema, None when nothing is
    (the message starts with the field)."""
    architecture = spec.model.architecture
    if architecture is None:
        return None
    try:
        model_config.profile_from_config(architecture.hf_config(), FIELD, "")
    except model_config.ModelConfigError as err:
        # "FIELD: num_key_value_heads: 64 ..." -> "FIELD.numKeyValueHeads: 64 ..."
        key, _, rest = str(err).removeprefix(f"{FIELD}: ").partition(": ")
        return f"{FIELD}.{to_camel(key)}: {rest}" if rest else str(err)
    return None
