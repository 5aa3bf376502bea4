"""`spec.kvCache.host`: rendered into the launch contract, refused when the host cannot hold it."""

from __future__ import annotations

from typing import Any

import pytest

from sglang_tpu import hicache, launch
from sglang_tpu.topology import GIB, SLICE_SHAPES, lookup
from tests.fake_kube import operator_verdict, tms_object
from tests.unit.operator.conftest import RenderFn, SpecWith
from tpuserve_operator import engine_resources
from tpuserve_operator.errors import InvalidSpec
from tpuserve_operator.validation import validate

pytestmark = pytest.mark.unit

V5E_8 = {"generation": "v5e", "topology": "2x4"}  # ct5lp-hightpu-8t: 8 ranks on one host


def problems_of(spec: dict[str, Any]) -> dict[str, tuple[str, str]]:
    with pytest.raises(InvalidSpec) as caught:
        validate("qwen", spec)
    return {p.field: (p.message, p.reason) for p in caught.value.problems}


def engine_container(rendered: Any) -> dict[str, Any]:
    (statefulset,) = [c for c in rendered.group(0) if c["kind"] == "StatefulSet"]
    containers = statefulset["spec"]["template"]["spec"]["containers"]
    (engine,) = [c for c in containers if c["name"] == "engine"]
    return dict(engine)


def test_the_tier_reaches_the_pods_env_and_the_sglang_command(
    rendered: RenderFn, spec_with: SpecWith, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = spec_with(tpu=V5E_8, kvCache={"host": {"sizeGB": 30, "writePolicy": "write_back"}})
    engine = engine_container(rendered(spec))
    env = {e["name"]: e.get("value") for e in engine["env"]}
    assert env["TPUSERVE_HOST_KV_CACHE"] == "write_back"
    assert env["TPUSERVE_HOST_KV_SIZE_GB"] == "30"
    assert "TPUSERVE_HOST_KV_RATIO" not in env
    # requests = limits = the host's engine memory, which holds 8 ranks x 30 GB + the rest
    memory = engine["resources"]["limits"]["memory"]
    assert engine["resources"]["requests"]["memory"] == memory
    limit = float(engine_resources.quantity(memory) or 0)
    shape = lookup("v5e", "2x4")
    assert hicache.pool_budget_bytes(limit) >= 8 * 30 * hicache.GB
    assert limit == pytest.approx(float(engine_resources.defaults(shape.machine)["memory"]))
    # what the launcher makes of those variables (the pod-scoped ones filled in by hand)
    contract_env = {k: v for k, v in env.items() if k.startswith("TPUSERVE_") and v is not None}
    contract_env |= {"TPUSERVE_HOST_INDEX": "0", "TPUSERVE_WEIGHTS_CACHE_DIR": "/w"}
    assert launch.launch(contract_env, dry_run=True) == 0
    command = capsys.readouterr().out
    assert '"--enable-hierarchical-cache"' in command
    assert '"--hicache-size", "30"' in command
    assert '"--hicache-write-policy", "write_back"' in command


def test_without_a_tier_the_pods_have_none(rendered: RenderFn, spec_with: SpecWith) -> None:
    env = {e["name"] for e in engine_container(rendered(spec_with(tpu=V5E_8)))["env"]}
    assert not [name for name in env if "HOST_KV" in name]


def test_a_size_beyond_the_hosts_memory_is_refused_naming_the_largest(
    spec_with: SpecWith,
) -> None:
    shape = lookup("v5e", "2x4")
    limit = float(engine_resources.defaults(shape.machine)["memory"])
    largest = hicache.max_size_gb(shape, limit)
    assert largest == 41  # docs/host-kv-tier.md's table
    validate("qwen", spec_with(tpu=V5E_8, kvCache={"host": {"sizeGB": largest}}))
    found = problems_of(spec_with(tpu=V5E_8, kvCache={"host": {"sizeGB": largest + 1}}))
    message, reason = found["spec.kvCache.host.sizeGB"]
    assert reason == "HostKvCacheDoesNotFit"
    assert message.startswith(f"{largest + 1} GB per rank does not fit one ct5lp-hightpu-8t host")
    assert message.endswith(f"allowed: at most {largest}")


def test_a_lower_memory_limit_lowers_the_largest_size(spec_with: SpecWith) -> None:
    spec = spec_with(
        tpu=V5E_8,
        kvCache={"host": {"sizeGB": 10}},
        engine={"resources": {"limits": {"memory": "100Gi"}}},
    )
    message, _ = problems_of(spec)["spec.kvCache.host.sizeGB"]
    expected = int((100 * GIB - hicache.ENGINE_HOST_BYTES - hicache.SGLANG_RESERVE_BYTES) / 8e9)
    assert message.endswith(f"allowed: at most {expected}")
    assert "100.0 GiB engine memory" in message


def test_a_ratio_beyond_the_hosts_memory_is_refused_naming_the_largest(
    spec_with: SpecWith,
) -> None:
    validate("qwen", spec_with(tpu=V5E_8, kvCache={"host": {"ratio": 2.0}}))
    found = problems_of(spec_with(tpu=V5E_8, kvCache={"host": {"ratio": 10.0}}))
    message, reason = found["spec.kvCache.host.ratio"]
    assert reason == "HostKvCacheDoesNotFit"
    largest = float(message.rsplit("at most ", 1)[1])
    assert 2.0 <= largest < 10.0
    validate("qwen", spec_with(tpu=V5E_8, kvCache={"host": {"ratio": largest}}))
    assert "spec.kvCache.host.ratio" in problems_of(
        spec_with(tpu=V5E_8, kvCache={"host": {"ratio": round(largest + 0.01, 2)}})
    )


def test_size_and_ratio_are_exclusive(spec_with: SpecWith) -> None:
    found = problems_of(spec_with(kvCache={"host": {"sizeGB": 10, "ratio": 2.0}}))
    assert any("one of sizeGB and ratio" in message for message, _ in found.values())


def test_an_unknown_write_policy_is_refused(spec_with: SpecWith) -> None:
    found = problems_of(spec_with(kvCache={"host": {"writePolicy": "write_around"}}))
    (message, _) = found["spec.kvCache.host.writePolicy"]
    assert "write_through" in message


@pytest.mark.parametrize("shape", SLICE_SHAPES, ids=lambda s: s.key)
def test_admission_refuses_what_the_operator_refuses(shape: Any) -> None:
    """The admission policy's sizeGB check says what the operator says, for every slice."""
    from tests.unit.operator.test_admission_policy import Policy

    policy = _policy(Policy)
    largest = hicache.max_size_gb(shape, float(engine_resources.defaults(shape.machine)["memory"]))
    for size, engine_type in (
        (largest, "sglang"),
        (largest + 1, "sglang"),
        (largest + 1, "simulated"),
    ):
        obj = tms_object(
            "hf://Qwen/Qwen3-0.6B", shape.generation.name, shape.topology, engine_type=engine_type
        )
        obj["spec"]["kvCache"] = {"host": {"sizeGB": size, "writePolicy": "write_through"}}
        expected = operator_verdict(obj)
        assert policy.denies(obj) == expected
        if size > largest:
            assert expected is not None
            assert "spec.kvCache.host.sizeGB" in expected


_POLICY: list[Any] = []


def _policy(kind: Any) -> Any:
    if not _POLICY:
        _POLICY.append(kind())
    return _POLICY[0]


def router_container(rendered: Any) -> dict[str, Any]:
    (deployment,) = [c for c in rendered.children if c["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_the_router_weighs_host_blocks_for_the_servers_slice_and_model(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    import argparse

    from sglang_tpu.perf_model import StepTimer, get_profile
    from tpuserve_router import cli as router_cli
    from tpuserve_router.policies.base import make_policy

    spec = spec_with(tpu=V5E_8, kvCache={"host": {"sizeGB": 30}})
    args = router_container(rendered(spec))["args"]
    timer = StepTimer(lookup("v5e", "2x4"), get_profile("qwen3-8b"))
    weight = round(timer.host_hit_value(), 3)
    assert f"--policy-param=host_hit_weight={weight}" in args
    assert 0 < weight < 1
    # what the router makes of it: its own parser, its default policy
    parser = argparse.ArgumentParser()
    router_cli.configure(parser)
    params = [a for a in args if a.startswith("--policy-param")]
    config = router_cli.build_config(
        parser.parse_args(["--worker", "http://127.0.0.1:30000", *params]), environ={}
    )
    extra: dict[str, Any] = dict(config.policy_params)
    policy = make_policy(config.policy, **extra)
    assert policy.params.host_hit_weight == pytest.approx(weight)  # type: ignore[attr-defined]
    # no tier, or a policy without a block index: no parameter
    plain = router_container(rendered(spec_with(tpu=V5E_8)))["args"]
    assert not [a for a in plain if "host_hit_weight" in a]
    rr = spec_with(tpu=V5E_8, kvCache={"host": {"sizeGB": 30}}, router={"policy": "round_robin"})
    assert not [a for a in router_container(rendered(rr))["args"] if "host_hit_weight" in a]
