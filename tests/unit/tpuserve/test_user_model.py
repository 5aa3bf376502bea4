"""A model outside the nine built-in profiles: its config.json gives the performance model
its profile in `tpuserve plan --hf-config` and, through spec.model.architecture, in the
operator's validation, render, launch contract and the simulated engine (issue 58, item 4).
Refused by name only when the config is missing or not a decoder's."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_tpu import launch, model_config, perf_model
from sglang_tpu.contract.launch_contract import LaunchContract
from sglang_tpu.contract.problems import ContractError
from sglang_tpu.sim import cli as sim_cli
from sglang_tpu.topology import GIB, lookup
from tests.contract_env import contract_env
from tests.fake_kube import operator_verdict, tms_object
from tpuserve.cli import main
from tpuserve.plan.planner import PlanError, profile_from_hf_config
from tpuserve_operator import model_profile
from tpuserve_operator.api import TPUModelServerSpec
from tpuserve_operator.conditions import Reason
from tpuserve_operator.errors import InvalidSpec
from tpuserve_operator.validation import validate

pytestmark = pytest.mark.unit

# Decoder configs in the shape of two families the built-in profiles lack (values as their
# config.json files spell them; weights never read).
MISTRAL_STYLE: dict[str, Any] = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral",
    "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "head_dim": 128, "vocab_size": 32768, "tie_word_embeddings": False,
    "rope_theta": 1000000.0, "sliding_window": None, "torch_dtype": "bfloat16",
}  # fmt: skip
GEMMA_STYLE: dict[str, Any] = {
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
    "hidden_size": 3584, "intermediate_size": 14336, "max_position_embeddings": 8192,
    "num_attention_heads": 16, "num_hidden_layers": 42, "num_key_value_heads": 8,
    "head_dim": 256, "vocab_size": 256000, "tie_word_embeddings": True,
}  # fmt: skip
MISTRAL_SOURCE = "hf://mistralai/Mistral-7B-Instruct-v0.3"
QUICK = ["--window", "20", "--sim-replicas", "1", "--preset", "chat"]


def by_hand(cfg: dict[str, Any]) -> float:
    """The parameter count of a dense decoder, written out independently of model_config."""
    h, layers, heads = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    kv, hd = cfg["num_key_value_heads"], cfg["head_dim"]
    per_layer = h * heads * hd + h * kv * hd * 2 + heads * hd * h + 3 * h * cfg["intermediate_size"]
    tables = 1 if cfg["tie_word_embeddings"] else 2
    return float(layers * per_layer + tables * cfg["vocab_size"] * h)


def write(tmp_path: Path, cfg: dict[str, Any], name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def with_architecture(obj: dict[str, Any], architecture: dict[str, Any]) -> dict[str, Any]:
    obj["spec"]["model"]["architecture"] = architecture
    return obj


def architecture_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """spec.model.architecture for ``cfg``: the keys the model reads, camelCased."""
    from tpuserve_operator.api import ModelArchitecture

    keys = model_config.canonical(cfg, "test")
    return ModelArchitecture.model_validate(keys).model_dump(by_alias=True, exclude_none=True)


@pytest.mark.parametrize("cfg", [MISTRAL_STYLE, GEMMA_STYLE], ids=["mistral", "gemma2"])
def test_a_decoder_outside_the_profiles_gets_its_profile_from_config_json(
    tmp_path: Path, cfg: dict[str, Any]
) -> None:
    assert perf_model.lookup_hf_model(str(cfg["model_type"])) is None  # not one of the nine
    profile = profile_from_hf_config(write(tmp_path, cfg))
    assert profile.parameters == by_hand(cfg)
    assert profile.kv_bytes_per_token() == 2 * 2 * cfg["num_hidden_layers"] * 8 * cfg["head_dim"]
    assert profile.context_length == cfg["max_position_embeddings"]
    assert profile.tied_embeddings is cfg["tie_word_embeddings"]


def test_plan_emits_the_architecture_and_the_emitted_server_renders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tpuserve plan --hf-config --emit` for a Mistral-shaped model: a plan, a TPUModelServer
    whose spec.model.architecture gives the operator the same profile, and `tpuserve render`
    of it (every child), with the fit check run on the profile."""
    config = write(tmp_path, MISTRAL_STYLE)
    out = tmp_path / "planned.yaml"
    argv = ["plan", "--hf-config", str(config), "--model-source", MISTRAL_SOURCE,
            "--rate", "4", "--generations", "v6e", "--topologies", "1x1,2x2", "--json",
            "--emit", str(out), *QUICK]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    result = json.loads(capsys.readouterr().out)
    assert result["choice"] in ("v6e 1x1", "v6e 2x2")
    fits = {c["slice"]: c["fits"] for c in result["candidates"]}
    assert fits == {"v6e 1x1": True, "v6e 2x2": True}, result["candidates"]
    manifest = yaml.safe_load(out.read_text())
    architecture = manifest["spec"]["model"]["architecture"]
    assert architecture["numHiddenLayers"] == 32
    assert architecture["headDim"] == 128
    spec = TPUModelServerSpec.model_validate(manifest["spec"])
    profile = model_profile.profile_of(spec)
    assert profile is not None
    assert profile.parameters == profile_from_hf_config(config).parameters
    assert validate("planned", manifest["spec"]).shape.generation.name == "v6e"

    assert main(["render", "-f", str(out)]) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert kinds.count("StatefulSet") == 1
    assert "HorizontalPodAutoscaler" in kinds

    # The fit check now has an opinion: 13.5 GiB of weights + 4 GiB of KV on a 16 GiB v5e.
    small = {**manifest["spec"], "tpu": {"generation": "v5e", "topology": "1x1"}}
    small["model"] = {**small["model"], "contextLength": 32768}
    weights = profile.weight_bytes("none")
    kv = profile.kv_bytes_per_token() * 32768
    assert weights + kv > perf_model.usable_hbm_bytes(lookup("v5e", "1x1"))
    verdict = operator_verdict({"metadata": {"name": "planned"}, "spec": small})
    assert verdict is not None
    assert verdict.startswith("spec.tpu.topology: mistral-7b-instruct-v0.3 (none weights")
    assert f"{weights / GIB:.1f} GiB" in verdict


def test_without_the_architecture_the_model_is_refused_by_name_where_a_profile_is_needed() -> None:
    obj = tms_object(MISTRAL_SOURCE, "v6e", "1x1", engine_type="simulated")
    verdict = operator_verdict(obj)
    assert verdict is not None
    assert verdict.startswith(
        f"spec.model.source: the simulated engine has no performance profile for '{MISTRAL_SOURCE}'"
    )
    assert "spec.model.architecture" in verdict
    with_arch = with_architecture(obj, architecture_of(MISTRAL_STYLE))
    assert operator_verdict(with_arch) is None


def test_a_simulated_server_hands_the_architecture_to_the_twin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """render -> the engine's contract env -> the launcher's twin command -> the twin's
    settings: the twin simulates the config's model (its KV size per token, its weights)."""
    obj = with_architecture(
        tms_object("hf://google/gemma-2-9b-it", "v6e", "1x1", engine_type="simulated"),
        architecture_of(GEMMA_STYLE),
    )
    path = tmp_path / "tms.yaml"
    path.write_text(yaml.safe_dump(obj))
    assert main(["render", "-f", str(path)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    (leader,) = [d for d in docs if d["kind"] == "StatefulSet"]
    containers = leader["spec"]["template"]["spec"]["containers"]
    (engine,) = [c for c in containers if c["name"] == "engine"]
    env = {e["name"]: e.get("value") for e in engine["env"]}
    given = json.loads(env["TPUSERVE_MODEL_ARCHITECTURE"])
    assert given["head_dim"] == 256
    assert given["tie_word_embeddings"] is True

    contract_vars = contract_env("v6e", "1x1", 1, 1, model="hf://google/gemma-2-9b-it")
    contract_vars |= {
        "TPUSERVE_ENGINE": "simulated",
        "TPUSERVE_WEIGHTS_CACHE_DIR": "/cache/weights",
        "TPUSERVE_MODEL_ARCHITECTURE": env["TPUSERVE_MODEL_ARCHITECTURE"],
    }
    command = launch.simulated_command(LaunchContract.from_env(contract_vars))
    assert command[:3] == ["tpuserve", "engine", "sim"]
    assert "--model-profile" not in command
    parser = argparse.ArgumentParser()
    sim_cli.configure(parser)
    settings = sim_cli.build_settings(parser.parse_args(command[3:]))
    profile = settings.timer.profile
    assert profile.parameters == by_hand(GEMMA_STYLE)
    assert settings.timer.kv_bytes_per_token == 2 * 2 * 42 * 8 * 256


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"architectures": ["T5ForConditionalGeneration"], "is_encoder_decoder": True,
          "num_layers": 12, "d_model": 768, "num_heads": 12, "vocab_size": 32128},
         "is_encoder_decoder: True is not allowed; allowed: a decoder-only model"),
        ({"architectures": ["BertForMaskedLM"], "num_hidden_layers": 12, "hidden_size": 768,
          "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522},
         "architectures: ['BertForMaskedLM'] is not allowed; allowed: a decoder"),
        ({**MISTRAL_STYLE, "num_key_value_heads": 64},
         "num_key_value_heads: 64 is not allowed; allowed: at most num_attention_heads (32)"),
    ],
    ids=["encoder-decoder", "encoder", "more-kv-heads-than-heads"],
)  # fmt: skip
def test_a_config_that_is_not_a_decoders_is_refused_by_name(
    tmp_path: Path, cfg: dict[str, Any], message: str
) -> None:
    path = write(tmp_path, cfg)
    with pytest.raises(PlanError) as err:
        profile_from_hf_config(path)
    assert str(err.value).startswith(f"--hf-config: {path}: {message}")


def test_an_architecture_the_schema_refuses_names_the_field() -> None:
    """The CRD's schema and CEL rules (as `tpuserve render` and the apiserver run them), and the
    operator's own check behind them (what a server created without the schema would get)."""
    bad = {**architecture_of(MISTRAL_STYLE), "numKeyValueHeads": 64}
    obj = with_architecture(tms_object(MISTRAL_SOURCE), bad)
    with pytest.raises(InvalidSpec) as err:
        validate("m", obj["spec"], cel_rules=True)
    assert "model.architecture.numKeyValueHeads must be at most numAttentionHeads" in str(err.value)
    assert operator_verdict(obj) == (
        "spec.model.architecture.numKeyValueHeads: 64 is not allowed; allowed: at most "
        "num_attention_heads (32)"
    )
    with pytest.raises(InvalidSpec) as err:
        validate("m", obj["spec"], cel_rules=False)
    assert [p.reason for p in err.value.problems] == [Reason.INVALID_SPEC]
    zero = {**architecture_of(MISTRAL_STYLE), "numHiddenLayers": 0}
    with pytest.raises(InvalidSpec) as err:
        validate("m", with_architecture(tms_object(MISTRAL_SOURCE), zero)["spec"])
    assert "spec.model.architecture.numHiddenLayers" in str(err.value)
    moe = {**architecture_of(MISTRAL_STYLE), "numExpertsPerTok": 2}
    with pytest.raises(InvalidSpec) as err:
        validate("m", with_architecture(tms_object(MISTRAL_SOURCE), moe)["spec"], cel_rules=True)
    assert "numExpertsPerTok needs numExperts" in str(err.value)


def test_the_launch_contract_refuses_a_bad_architecture_naming_the_variable() -> None:
    env = contract_env() | {"TPUSERVE_MODEL_ARCHITECTURE": '{"layers": 3}'}
    with pytest.raises(ContractError) as err:
        LaunchContract.from_env(env)
    (problem,) = err.value.problems
    assert "TPUSERVE_MODEL_ARCHITECTURE" in str(problem)
    assert "'layers' is not allowed; allowed: the keys num_hidden_layers" in str(problem)
