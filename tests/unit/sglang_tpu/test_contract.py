"""The launch contract reads every variable once, reports every problem, and renders pod env."""

from __future__ import annotations

import pytest

from sglang_tpu.contract.doc_rows import variables
from sglang_tpu.contract.env_names import Var
from sglang_tpu.contract.group_contract import GroupContract
from sglang_tpu.contract.launch_contract import LaunchContract
from sglang_tpu.contract.pod_env import (
    LWS_GROUP_INDEX,
    LWS_GROUP_KEY,
    LWS_WORKER_INDEX,
    lws_hostnames,
    pod_env,
    statefulset_hostnames,
)
from sglang_tpu.contract.problems import ContractError
from sglang_tpu.contract.torch_tpu import torch_tpu_env
from tests.contract_env import contract_env

pytestmark = pytest.mark.unit

SINGLE_HOST = contract_env()

IRONWOOD = contract_env(
    "tpu7x",
    "2x2x2",
    hosts=2,
    chips_per_host=4,
    host_index=1,
    model="hf://Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8@main",
    worker_hostnames=("qwen-{replica}.qwen.ml.svc", "qwen-{replica}-1.qwen.ml.svc"),
) | {"TPUSERVE_REPLICA_INDEX": "3", "TPUSERVE_WEIGHTS_CACHE_DIR": "/var/cache/tpuserve/weights"}


def problems_of(env: dict[str, str]) -> dict[str, str]:
    with pytest.raises(ContractError) as err:
        LaunchContract.from_env(env)
    return {p.variable: p.message for p in err.value.problems}


def test_single_host_contract_uses_defaults() -> None:
    c = LaunchContract.from_env(SINGLE_HOST)
    assert (c.shape.hosts, c.shape.devices, c.hostnames, c.leader_address) == (
        1,
        8,
        ("localhost",),
        "localhost",
    )
    assert (c.http_port, c.kv_events_port, c.engine, c.execution_mode) == (
        30000,
        5557,
        "sglang",
        "compiled",
    )
    assert c.served_name == "llama"
    assert c.is_leader


def test_replica_placeholder_gives_this_groups_hostnames() -> None:
    c = LaunchContract.from_env(IRONWOOD)
    assert c.hostnames == ("qwen-3.qwen.ml.svc", "qwen-3-1.qwen.ml.svc")
    assert c.served_name == "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8"
    assert not c.is_leader


@pytest.mark.parametrize("variable", [v.name for v in variables() if v.required], ids=str)
def test_a_missing_required_variable_is_named(variable: str) -> None:
    env = dict(IRONWOOD)
    del env[variable]
    assert problems_of(env)[variable] == "required"


def test_multi_host_needs_worker_hostnames_and_download_needs_a_cache() -> None:
    env = {k: v for k, v in IRONWOOD.items() if "HOSTNAMES" not in k and "WEIGHTS" not in k}
    problems = problems_of(env)
    assert problems["TPUSERVE_WORKER_HOSTNAMES"] == "required: the slice has 2 hosts"
    assert "hf://Qwen" in problems["TPUSERVE_WEIGHTS_CACHE_DIR"]


def test_all_problems_are_reported_at_once() -> None:
    env = {
        **IRONWOOD,
        "TPUSERVE_HTTP_PORT": "x",
        "TPUSERVE_QUANTIZATION": "int4",
        "TPUSERVE_HOSTS": "4",
    }
    del env["TPUSERVE_MODEL"]
    problems = problems_of(env)
    assert {
        "TPUSERVE_HTTP_PORT",
        "TPUSERVE_QUANTIZATION",
        "TPUSERVE_HOSTS",
        "TPUSERVE_MODEL",
    } <= set(problems)
    assert problems["TPUSERVE_HOSTS"] == "tpu7x/2x2x2 has 2 hosts, not 4"


def test_error_message_names_variable_value_and_allowed_values() -> None:
    with pytest.raises(ContractError) as err:
        LaunchContract.from_env({**SINGLE_HOST, "TPUSERVE_ENGINE": "vllm"})
    assert "TPUSERVE_ENGINE='vllm'" in str(err.value)
    assert "allowed: sglang, sglang-jax, simulated" in str(err.value)


def test_empty_variable_is_a_problem_not_a_default() -> None:
    problems = problems_of({**SINGLE_HOST, "TPUSERVE_KV_EVENTS_PORT": ""})
    assert problems["TPUSERVE_KV_EVENTS_PORT"].startswith("empty")


def test_misspelled_variable_is_caught() -> None:
    problems = problems_of({**SINGLE_HOST, "TPUSERVE_HTTP_PROT": "8000"})
    assert "did you mean TPUSERVE_HTTP_PORT" in problems["TPUSERVE_HTTP_PROT"]


def test_unrelated_prefixed_variable_is_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    LaunchContract.from_env({**SINGLE_HOST, "TPUSERVE_CACHE": "/root/.cache/tpuserve"})
    assert "TPUSERVE_CACHE is not a launch contract variable" in caplog.text


def test_port_ranges_may_not_overlap() -> None:
    problems = problems_of({**IRONWOOD, "TPUSERVE_KV_EVENTS_PORT": "8075"})
    message = problems["TPUSERVE_SLICEBUILDER_BASE_PORT"]
    assert message == "overlaps TPUSERVE_KV_EVENTS_PORT (8075); this uses 8070-8077"
    master = problems_of({**IRONWOOD, "TPUSERVE_MASTER_PORT": "20006"})["TPUSERVE_MASTER_PORT"]
    assert master == "overlaps TPUSERVE_DIST_INIT_PORT (20000-20006); this uses 20006"


def test_extra_args_may_not_override_owned_flags_or_carry_secrets() -> None:
    env = {
        **SINGLE_HOST,
        "TPUSERVE_SGLANG_EXTRA_ARGS": "--port=1 --api-key s3cret --trust-remote-code",
    }
    message = problems_of(env)["TPUSERVE_SGLANG_EXTRA_ARGS"]
    assert "--port" in message
    assert "--api-key" in message
    ok = LaunchContract.from_env(
        {**SINGLE_HOST, "TPUSERVE_SGLANG_EXTRA_ARGS": "--mem-fraction-static 0.8"}
    )
    assert ok.sglang_extra_args == ("--mem-fraction-static", "0.8")


def test_speculation_rules() -> None:
    eagle = {**SINGLE_HOST, "TPUSERVE_SPECULATIVE_ALGORITHM": "EAGLE3"}
    assert problems_of(eagle)["TPUSERVE_SPECULATIVE_DRAFT_MODEL"] == "required for EAGLE3"
    mtp = LaunchContract.from_env(
        {
            **SINGLE_HOST,
            "TPUSERVE_SPECULATIVE_ALGORITHM": "MTP",
            "TPUSERVE_SPECULATIVE_NUM_STEPS": "3",
        }
    )
    assert (mtp.draft_source, mtp.speculative_num_steps) == (None, 3)


def test_hostname_list_must_match_the_slice() -> None:
    too_few = problems_of({**IRONWOOD, "TPUSERVE_WORKER_HOSTNAMES": "a.svc"})
    assert too_few["TPUSERVE_WORKER_HOSTNAMES"] == "1 names for 2 hosts"
    repeated = problems_of({**IRONWOOD, "TPUSERVE_WORKER_HOSTNAMES": "a.svc,a.svc"})
    assert repeated["TPUSERVE_WORKER_HOSTNAMES"] == "names repeat"
    bad = problems_of({**IRONWOOD, "TPUSERVE_WORKER_HOSTNAMES": "a.svc,b_c.svc"})
    assert "'b_c.svc'" in bad["TPUSERVE_WORKER_HOSTNAMES"]


def test_group_contract_round_trips_through_its_environment() -> None:
    group = GroupContract(
        model="gs://weights/llama-70b",
        generation="v6e",
        topology="4x4",
        hosts=4,
        chips_per_host=4,
        worker_hostnames=statefulset_hostnames("llama-r0", "llama-hl", "ml", 4),
        gcs_fuse_root="/mnt/gcs",
        sglang_extra_args=("--chat-template", "my template.jinja"),
        drain_timeout_seconds=40,
    )
    env = {**group.to_env(), "TPUSERVE_HOST_INDEX": "2"}
    back = LaunchContract.from_env(env)
    assert back.model_dump(exclude={"host_index", "pod_name", "pod_ip"}) == group.model_dump()
    assert back.hostnames[2] == "llama-r0-2.llama-hl.ml.svc"


def test_hostname_patterns() -> None:
    assert statefulset_hostnames("s", "h", "ns", 2) == ("s-0.h.ns.svc", "s-1.h.ns.svc")
    assert lws_hostnames("m", "m", "ns", 3) == (
        "m-{replica}.m.ns.svc",
        "m-{replica}-1.m.ns.svc",
        "m-{replica}-2.m.ns.svc",
    )


def test_pod_env_takes_per_pod_values_from_the_downward_api() -> None:
    group = GroupContract(
        model="/models/m",
        generation="tpu7x",
        topology="2x2x2",
        hosts=2,
        chips_per_host=4,
        worker_hostnames=lws_hostnames("m", "m", "ns", 2),
    )
    env = pod_env(
        group,
        host_index=LWS_WORKER_INDEX,
        replica_index=LWS_GROUP_INDEX,
        group_key=LWS_GROUP_KEY,
    )
    by_name = {e["name"]: e for e in env}
    assert len(by_name) == len(env)
    worker_index = {"fieldRef": {"fieldPath": LWS_WORKER_INDEX.field_path}}
    assert by_name["TPUSERVE_HOST_INDEX"]["valueFrom"] == worker_index
    assert by_name["TPU_WORKER_ID"]["valueFrom"] == worker_index
    group_index = "metadata.labels['leaderworkerset.sigs.k8s.io/group-index']"
    assert by_name["TPUSERVE_REPLICA_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == group_index
    assert by_name["TPUSERVE_TPU_TOPOLOGY"] == {"name": "TPUSERVE_TPU_TOPOLOGY", "value": "2x2x2"}
    assert all(e.get("value") != "" for e in env)
    # what a pod of group 5, worker 1 would read back
    resolved = {e["name"]: e["value"] for e in env if "value" in e}
    resolved |= {"TPUSERVE_HOST_INDEX": "1", "TPUSERVE_REPLICA_INDEX": "5"}
    pod = LaunchContract.from_env(resolved)
    assert pod.hostnames == ("m-5.m.ns.svc", "m-5-1.m.ns.svc")


def test_pod_env_literal_host_index_is_checked() -> None:
    group = GroupContract(model="/m", generation="v5e", topology="2x2", hosts=1, chips_per_host=4)
    env = pod_env(group, host_index=0)
    assert {"name": "TPUSERVE_HOST_INDEX", "value": "0"} in env
    with pytest.raises(ValueError, match="outside"):
        pod_env(group, host_index=1)


def test_constructing_a_group_contract_in_python_validates_too() -> None:
    with pytest.raises(ValueError, match="has 4 hosts, not 3"):
        GroupContract(model="/m", generation="v6e", topology="4x4", hosts=3, chips_per_host=4)


def test_documented_variables_are_exactly_the_contract() -> None:
    rows = variables()
    assert [r.name for r in rows] == [v.value for v in Var]
    assert all(r.description and r.allowed for r in rows)


def test_single_host_torch_tpu_env_has_no_rendezvous_variables() -> None:
    env = torch_tpu_env(LaunchContract.from_env(SINGLE_HOST))
    assert env["TORCH_TPU_TOPOLOGY"] == "2,4,1"
    assert env["TPU_WORKER_HOSTNAMES"] == "localhost"
    assert not {"NNODES", "NODE_RANK", "MASTER_ADDR", "TORCH_TPU_SLICEBUILDER_ADDRESSES"} & set(env)


def test_xprof_session_id_is_shared_by_the_group_and_differs_between_groups() -> None:
    hosts = [LaunchContract.from_env({**IRONWOOD, "TPUSERVE_HOST_INDEX": str(i)}) for i in (0, 1)]
    other = LaunchContract.from_env({**IRONWOOD, "TPUSERVE_REPLICA_INDEX": "4"})
    assert hosts[0].xprof_session_id == hosts[1].xprof_session_id != other.xprof_session_id
    assert hosts[0].xprof_session_id.isdigit()
