"""A disaggregated TPUModelServer: each role rendered as its own replica groups (its slice,
its SGLang flags, its pod label; the prefill's bootstrap port advertised), the router in PD
mode, both roles preferring one zone, status per role; and every refusal names its field."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sglang_tpu import disaggregation as pd
from tests.unit.operator.conftest import RenderFn, SpecWith
from tpuserve_operator.conditions import Reason
from tpuserve_operator.disaggregation import group_key
from tpuserve_operator.errors import InvalidSpec
from tpuserve_operator.render import Manifest, RenderConfig, validate_server
from tpuserve_operator.render.roles import ZONE_KEY
from tpuserve_operator.status import GroupReport
from tpuserve_operator.status_writer import role_statuses

pytestmark = pytest.mark.unit

SIMULATED = {"type": "simulated"}


def pd_spec(spec_with: SpecWith, **disaggregation: Any) -> dict[str, Any]:
    return spec_with(
        engine=SIMULATED,
        tpu={"generation": "v6e", "topology": "2x4"},
        disaggregation={
            "prefill": {"replicas": 1, "tpu": {"generation": "v6e", "topology": "4x4"}},
            "decode": {"replicas": 2},
            **disaggregation,
        },
    )


def templates(children: list[Manifest]) -> Iterator[tuple[str, Manifest]]:
    for c in children:
        if c["kind"] == "StatefulSet":
            yield c["metadata"]["name"], c["spec"]["template"]


def engine_args(template: Manifest) -> str:
    env = template["spec"]["containers"][0]["env"]
    return " ".join(str(e.get("value", "")) for e in env)


def test_each_role_is_its_own_replica_groups_with_its_slice_and_flags(
    spec_with: SpecWith, rendered: RenderFn
) -> None:
    result = rendered(pd_spec(spec_with))
    assert result.replicas == 3
    by_name = dict(templates(result.children))
    assert sorted(by_name) == ["qwen-d0", "qwen-d1", "qwen-p0", "qwen-p0-w"]  # 4x4: 4 hosts
    prefill, decode = by_name["qwen-p0"], by_name["qwen-d0"]
    assert prefill["metadata"]["labels"][pd.PD_ROLE_LABEL] == "prefill"
    assert by_name["qwen-p0-w"]["metadata"]["labels"][pd.PD_ROLE_LABEL] == "prefill"
    assert decode["metadata"]["labels"][pd.PD_ROLE_LABEL] == "decode"
    assert prefill["metadata"]["annotations"][pd.BOOTSTRAP_PORT_ANNOTATION] == "8998"
    assert pd.BOOTSTRAP_PORT_ANNOTATION not in decode["metadata"].get("annotations", {})
    ports = {p["name"]: p["containerPort"] for p in prefill["spec"]["containers"][0]["ports"]}
    assert ports["pd-bootstrap"] == 8998
    assert "--disaggregation-mode prefill" in engine_args(prefill)
    assert "--disaggregation-bootstrap-port 8998" in engine_args(prefill)
    assert "--disaggregation-transfer-backend mooncake" in engine_args(prefill)
    assert "--disaggregation-mode decode" in engine_args(decode)
    assert "bootstrap-port" not in engine_args(decode)
    assert result.group_hosts(group_key("prefill", 0)) == 4
    assert result.group_hosts(group_key("decode", 0)) == 1
    for template in by_name.values():  # one placement domain: the server's pods, one zone
        terms = template["spec"]["affinity"]["podAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ]
        assert any(t["podAffinityTerm"]["topologyKey"] == ZONE_KEY for t in terms)


def test_the_router_routes_pairs_of_discovered_roles(
    spec_with: SpecWith, rendered: RenderFn
) -> None:
    children = rendered(pd_spec(spec_with, policy="always")).children
    (router,) = [c for c in children if c["kind"] == "Deployment"]
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--pd-disaggregation" in args
    assert "--pd-policy=always" in args
    (engines,) = [c for c in children if c["metadata"]["name"] == "qwen-engines"]
    router_ports = {p["port"] for p in engines["spec"]["ingress"][1]["ports"]}
    assert 8998 in router_ports  # the router asks the bootstrap server the DP size


def groups_by_name(result: Any) -> dict[str, list[Manifest]]:
    return {result.group_name(k): result.group(k) for k in result.group_keys}


def test_a_role_change_rolls_that_role_alone(spec_with: SpecWith, rendered: RenderFn) -> None:
    before = rendered(pd_spec(spec_with))
    changed = rendered(
        pd_spec(spec_with, decode={"replicas": 2, "args": {"max-running-requests": 64}})
    )
    assert changed.revision != before.revision  # status.revision: every role's templates
    assert changed.role_revisions["prefill"] == before.role_revisions["prefill"]
    assert changed.role_revisions["decode"] != before.role_revisions["decode"]
    old, new = groups_by_name(before), groups_by_name(changed)
    assert new["qwen-p0"] == old["qwen-p0"]  # byte for byte: the prefill group is not touched
    assert new["qwen-d1"] != old["qwen-d1"]
    (workload,) = [m for m in new["qwen-d1"] if m["kind"] == "StatefulSet"]
    revision = workload["spec"]["template"]["metadata"]["labels"]["serving.tpuserve.dev/revision"]
    assert revision == changed.role_revisions["decode"]


def test_resizing_a_role_leaves_the_others_groups_as_they_were(
    spec_with: SpecWith, rendered: RenderFn
) -> None:
    before = groups_by_name(rendered(pd_spec(spec_with)))
    after = groups_by_name(rendered(pd_spec(spec_with, prefill={"replicas": 3})))
    assert sorted(after) == ["qwen-d0", "qwen-d1", "qwen-p0", "qwen-p1", "qwen-p2"]
    assert after["qwen-d0"] == before["qwen-d0"]
    assert after["qwen-d1"] == before["qwen-d1"]
    (service, *_) = after["qwen-d1"]
    assert service["spec"]["selector"][pd.PD_ROLE_LABEL] == "decode"  # index 1 of decode only
    assert service["metadata"]["labels"]["serving.tpuserve.dev/replica"] == "1"


def test_a_pairing_change_rolls_both_roles(spec_with: SpecWith, rendered: RenderFn) -> None:
    before = rendered(pd_spec(spec_with)).role_revisions
    image = {"type": "simulated", "image": "example.com/engine:2"}
    after = rendered(spec_with(**{**pd_spec(spec_with), "engine": image})).role_revisions
    assert all(after[role] != before[role] for role in ("prefill", "decode"))


def test_a_decode_count_that_changes_keeps_the_revision(
    spec_with: SpecWith, rendered: RenderFn
) -> None:
    """Its HPA scales a role: the prefill groups must not roll when decode grows."""
    before = rendered(pd_spec(spec_with)).revision
    assert rendered(pd_spec(spec_with, decode={"replicas": 5})).revision == before


def test_status_reports_each_role(spec_with: SpecWith, rendered: RenderFn) -> None:
    result = rendered(pd_spec(spec_with))

    def report(role: str, k: int, ready: bool) -> GroupReport:
        return GroupReport(
            index=group_key(role, k), name=f"qwen-{role[0]}{k}",
            state="Ready" if ready else "Starting", reason=Reason.SERVING, message="", since="",
            hosts=1, ready_hosts=1, updated=True, ready=ready, exists=True,
        )  # fmt: skip

    reports = [report("prefill", 0, True), report("decode", 0, True), report("decode", 1, False)]
    roles = role_statuses(result, {r.index: r for r in reports})
    assert [(r.role, r.desired, r.replicas, r.ready_replicas, r.groups) for r in roles] == [
        ("prefill", 1, 1, 1, [0]), ("decode", 2, 2, 1, [0, 1]),
    ]  # fmt: skip
    assert [(g.role, g.index) for g in (r.as_status() for r in reports)] == [
        ("prefill", 0), ("decode", 0), ("decode", 1),
    ]  # fmt: skip
    assert role_statuses(rendered(spec_with(engine=SIMULATED)), {}) == []


def problems(spec: dict[str, Any]) -> dict[str, tuple[str, str]]:
    with pytest.raises(InvalidSpec) as caught:
        validate_server({"name": "qwen", "namespace": "ml"}, spec, RenderConfig())
    return {p.field: (p.message, str(p.reason)) for p in caught.value.problems}


def test_no_transfer_backend_moves_kv_between_tpu_slices_in_sglang(spec_with: SpecWith) -> None:
    spec = pd_spec(spec_with)
    spec["engine"] = {"type": "sglang"}
    message, reason = problems(spec)["spec.disaggregation.transferBackend"]
    assert reason == "UnsupportedTransferBackend"
    assert "'mooncake' is not allowed" in message
    assert "allowed: none yet, or spec.engine.type simulated" in message


def test_roles_of_different_engine_versions_are_refused(spec_with: SpecWith) -> None:
    spec = pd_spec(spec_with)
    spec["disaggregation"]["decode"]["image"] = "example.com/other:1"
    message, reason = problems(spec)["spec.disaggregation.decode.image"]
    assert reason == "UnpairableRoles"
    assert "allowed: one engine image for both roles" in message


def test_roles_with_different_kv_pages_are_refused(spec_with: SpecWith) -> None:
    spec = pd_spec(spec_with)
    spec["disaggregation"]["decode"]["args"] = {"page-size": 32}
    message, reason = problems(spec)["spec.disaggregation.decode.args.page-size"]
    assert reason == "UnpairableRoles"
    assert "32 differs from the prefill role's None" in message


def test_the_disaggregation_flags_are_the_operators(spec_with: SpecWith) -> None:
    spec = pd_spec(spec_with)
    spec["engine"] = {**spec["engine"], "args": {"disaggregation-mode": "decode"}}
    spec["disaggregation"]["prefill"]["args"] = {"disaggregation-bootstrap-port": 1}
    found = problems(spec)
    assert found["spec.engine.args.disaggregation-mode"][1] == "ReservedField"
    assert "spec.disaggregation.prefill.args.disaggregation-bootstrap-port" in found
    plain = spec_with(engine={**SIMULATED, "args": {"disaggregation-mode": "prefill"}})
    assert (
        "allowed: spec.disaggregation" in problems(plain)["spec.engine.args.disaggregation-mode"][0]
    )


def test_autoscaling_and_unknown_role_slices_are_refused(spec_with: SpecWith) -> None:
    spec = pd_spec(spec_with)
    spec["autoscaling"] = {"maxReplicas": 4}
    spec["disaggregation"]["decode"]["tpu"] = {"generation": "v6e", "topology": "3x3"}
    found = problems(spec)
    assert "spec.autoscaling" in found
    message, reason = found["spec.disaggregation.decode.tpu.topology"]
    assert reason == "UnsupportedTopology"
    assert message.startswith("'3x3' is not allowed; not a v6e topology")  # the field once


def test_top_level_autoscaling_points_to_the_roles_own(spec_with: SpecWith) -> None:
    spec = pd_spec(spec_with)
    spec["autoscaling"] = {"maxReplicas": 4}
    message, _ = problems(spec)["spec.autoscaling"]
    assert message.endswith(
        "allowed: spec.disaggregation.prefill.autoscaling and "
        "spec.disaggregation.decode.autoscaling"
    )


def test_each_role_autoscales_by_a_metric_of_its_own_load_and_never_to_zero(
    spec_with: SpecWith,
) -> None:
    spec = pd_spec(spec_with)
    spec["disaggregation"]["prefill"]["autoscaling"] = {"maxReplicas": 4, "metric": "ttft"}
    spec["disaggregation"]["decode"]["autoscaling"] = {"maxReplicas": 4, "metric": "queue"}
    validate_server({"name": "qwen", "namespace": "ml"}, spec, RenderConfig())
    spec["disaggregation"]["prefill"]["autoscaling"]["metric"] = "tokensInFlight"
    spec["disaggregation"]["decode"]["autoscaling"] |= {"metric": "ttft", "minReplicas": 0}
    found = problems(spec)
    message, _ = found["spec.disaggregation.prefill.autoscaling.metric"]
    assert message.startswith("'tokensInFlight' is not allowed for the prefill role (")
    assert message.endswith("allowed: queue, ttft, backlogSeconds")
    message, _ = found["spec.disaggregation.decode.autoscaling.metric"]
    assert message.startswith("'ttft' is not allowed for the decode role (")
    assert message.endswith("allowed: queue, tokensInFlight, kvCacheUsage")
    message, _ = found["spec.disaggregation.decode.autoscaling.minReplicas"]
    assert message.startswith("0 is not allowed with spec.disaggregation")
    assert message.endswith("allowed: 1 to maxReplicas")


def test_a_roles_args_cannot_set_what_the_operator_owns(spec_with: SpecWith) -> None:
    spec = pd_spec(spec_with)
    spec["disaggregation"]["decode"]["args"] = {"port": 1, "--tp-size": 4, "api-key": "k"}
    spec["disaggregation"]["prefill"]["args"] = {"mem-fraction-static": 0.8, "x": [1]}
    found = problems(spec)
    for flag in ("port", "--tp-size", "api-key"):
        message, reason = found[f"spec.disaggregation.decode.args.{flag}"]
        assert reason == "ReservedField"
        assert "is set by the operator from the spec" in message
    assert "spec.disaggregation.prefill.args.mem-fraction-static" not in found
    assert "allowed: a string, number or boolean" in found["spec.disaggregation.prefill.args.x"][0]


def test_tp_sizes_pair_when_the_larger_is_a_multiple_of_the_smaller() -> None:
    from tpuserve_operator.disaggregation import tp_pairs

    assert tp_pairs(8, 16)
    assert tp_pairs(16, 8)
    assert tp_pairs(4, 4)
    assert not tp_pairs(6, 8)  # none of the catalog's slices: all are powers of two


def test_the_transfer_backend_is_one_of_sglangs(spec_with: SpecWith) -> None:
    from sglang_tpu.disaggregation import TRANSFER_BACKENDS
    from tpuserve_operator.api import DisaggregationSpec

    field = DisaggregationSpec.model_fields["transfer_backend"]
    assert tuple(field.annotation.__args__) == TRANSFER_BACKENDS  # type: ignore[union-attr]
    spec = pd_spec(spec_with, transferBackend="tpu")
    message, _ = problems(spec)["spec.disaggregation.transferBackend"]
    assert "'mooncake', 'mori', 'nixl', 'ascend' or 'fake'" in message


def test_both_roles_carry_one_pairing_contract_that_an_image_change_changes(
    spec_with: SpecWith, rendered: RenderFn
) -> None:
    """The router pairs only equal contracts, so mid-rollout old engines pair with old."""

    def contracts(spec: dict[str, Any]) -> set[str]:
        return {
            t["metadata"]["labels"][pd.PD_CONTRACT_LABEL]
            for _, t in templates(rendered(spec).children)
        }

    before = contracts(pd_spec(spec_with))
    assert len(before) == 1  # prefill and decode, leaders and workers: one contract
    image = {"type": "simulated", "image": "example.com/engine:2"}
    changed = spec_with(**{**pd_spec(spec_with), "engine": image})
    assert len(contracts(changed)) == 1
    assert contracts(changed) != before
    replicas = pd_spec(spec_with, decode={"replicas": 3})
    assert contracts(replicas) == before  # what does not change the pairing keeps it
