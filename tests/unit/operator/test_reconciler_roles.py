"""`Reconciler.converge` on a server with roles: an autoscaled role needs the role CRD, KEDA its
CRDs, a role's scale object is seeded then followed, and a change to one role (its size, its
decode settings, its contract) rolls that role's groups alone."""

from __future__ import annotations

from typing import Any

import pytest

from sglang_tpu import disaggregation as pd
from tests.fake_kube import pod_object
from tests.unit.operator.reconciler_harness import (
    NAMESPACE,
    ONE_HOST,
    Operator,
    make_operator,
)
from tpuserve_operator import labels

pytestmark = pytest.mark.unit


@pytest.fixture
def operator() -> Operator:
    return make_operator()


PD_DECODE_AUTOSCALED = {
    **ONE_HOST,
    "disaggregation": {
        "prefill": {"replicas": 1},
        "decode": {"replicas": 5, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}},
    },
}


async def test_an_autoscaled_role_without_the_role_crd_is_invalid_naming_the_field(
    operator: Operator,
) -> None:
    # `helm upgrade` does not install a chart's new CRDs: say so, rather than fail every pass
    operator.kube.resources.discard((labels.API_VERSION, labels.ROLE_PLURAL))
    key = operator.create(PD_DECODE_AUTOSCALED)
    await operator.converge(key)
    assert operator.conditions(key)["Valid"][0] == "False"
    _, _, message = operator.events[-1]
    assert "spec.disaggregation.decode.autoscaling: needs the TPUModelServerRole API" in message
    assert "kubectl apply --server-side" in message
    assert operator.kube.names(labels.ROLE_KIND) == []
    assert operator.reconciles("invalid") == 1
    # the CRD applied: the next pass sees it, with no change to the server
    operator.kube.resources.add((labels.API_VERSION, labels.ROLE_PLURAL))
    await operator.converge(key)
    assert operator.conditions(key)["Valid"] == ("True", "SpecValid")
    assert operator.kube.names(labels.ROLE_KIND) == ["qwen-decode"]


KEDA_SCALED = {
    **ONE_HOST,
    "autoscaling": {"engine": "keda", "maxReplicas": 4, "metric": "backlogSeconds", "target": 1},
}


async def test_keda_without_its_crds_is_invalid_naming_the_field_until_they_are_applied(
    operator: Operator,
) -> None:
    operator.kube.resources.discard(("keda.sh/v1alpha1", "scaledobjects"))
    key = operator.create(KEDA_SCALED)
    await operator.converge(key)
    assert operator.conditions(key)["Valid"][0] == "False"
    _, _, message = operator.events[-1]
    assert "spec.autoscaling.engine: keda needs KEDA's ScaledObject API" in message
    assert operator.kube.names("ScaledObject") == []
    # KEDA installed: the next pass sees it, with no change to the server
    operator.kube.resources.add(("keda.sh/v1alpha1", "scaledobjects"))
    await operator.converge(key)
    assert operator.conditions(key)["Valid"] == ("True", "SpecValid")
    assert operator.kube.names("ScaledObject") == ["qwen"]
    assert operator.kube.names("HorizontalPodAutoscaler") == []


async def test_a_role_scale_object_is_seeded_then_its_count_is_the_roles(
    operator: Operator,
) -> None:
    key = operator.create(PD_DECODE_AUTOSCALED)
    await operator.converge(key)
    scale = operator.kube.get_object(labels.API_VERSION, labels.ROLE_KIND, NAMESPACE, "qwen-decode")
    # seeded with the role's replicas within min..max (5 -> 4), owned by the server
    assert scale["spec"] == {"role": "decode", "replicas": 4}
    assert scale["metadata"]["ownerReferences"][0]["uid"] == "qwen-uid"
    assert operator.kube.names("StatefulSet") == [*(f"qwen-d{k}" for k in range(4)), "qwen-p0"]
    assert operator.kube.names(labels.ROLE_KIND) == ["qwen-decode"]  # prefill: no autoscaling
    (hpa,) = [
        operator.kube.get_object(*k)
        for k in operator.kube.objects
        if k[1] == "HorizontalPodAutoscaler"
    ]
    assert hpa["spec"]["scaleTargetRef"]["name"] == "qwen-decode"
    prefill_group = operator.kube.get_object("apps/v1", "StatefulSet", NAMESPACE, "qwen-p0")
    revision = operator.status(key)["revision"]

    # the HPA (or kubectl scale) sets 2 through the scale subresource: decode shrinks to 2
    operator.kube.scale(labels.API_VERSION, labels.ROLE_KIND, NAMESPACE, "qwen-decode", 2)
    await operator.converge(key)
    await operator.converge(key)  # the second pass prunes what the first stopped wanting
    assert operator.kube.names("StatefulSet") == ["qwen-d0", "qwen-d1", "qwen-p0"]
    assert operator.status(key)["revision"] == revision
    after = operator.kube.get_object("apps/v1", "StatefulSet", NAMESPACE, "qwen-p0")
    assert after["metadata"]["generation"] == prefill_group["metadata"]["generation"]
    roles = {r["role"]: r for r in operator.status(key)["roles"]}
    assert (roles["decode"]["desired"], roles["prefill"]["desired"]) == (2, 1)
    scale = operator.kube.get_object(labels.API_VERSION, labels.ROLE_KIND, NAMESPACE, "qwen-decode")
    assert scale["spec"]["replicas"] == 2  # applying the object did not take the count back
    assert scale["status"] == {
        "replicas": roles["decode"]["replicas"],
        "selector": "app.kubernetes.io/instance=qwen,app.kubernetes.io/component=model-server,"
        "serving.tpuserve.dev/role=leader,serving.tpuserve.dev/pd-role=decode",
    }

    # autoscaling removed: the scale object and the HPA go, the role's replicas count again
    body = operator.body(key)
    body["spec"]["disaggregation"]["decode"].pop("autoscaling")
    body["metadata"]["generation"] += 1
    operator.kube.put(body)
    await operator.converge(key)
    await operator.converge(key)
    assert operator.kube.names(labels.ROLE_KIND) == []
    assert operator.kube.names("HorizontalPodAutoscaler") == []
    assert len(operator.kube.names("StatefulSet")) == 6


PD: dict[str, Any] = {
    "model": {"source": "hf://Qwen/Qwen3-8B"},
    "tpu": {"generation": "v6e", "topology": "2x4"},
    "engine": {"type": "simulated"},
    "disaggregation": {"prefill": {"replicas": 1}, "decode": {"replicas": 2}},
}


def serving(operator: Operator, group: str, role: str, index: int) -> None:
    """A ready leader pod of a disaggregated server's group, as its workload makes it."""
    workload = operator.kube.get_object("apps/v1", "StatefulSet", NAMESPACE, group)
    template = workload["spec"]["template"]["metadata"]["labels"]
    extra = {k: template[k] for k in (pd.PD_ROLE_LABEL, pd.PD_CONTRACT_LABEL)}
    revision = template[labels.REVISION]
    operator.kube.put(
        pod_object("qwen", f"{group}-0", replica=index, revision=revision, extra_labels=extra)
    )


async def test_resizing_one_role_leaves_the_other_roles_groups_alone(operator: Operator) -> None:
    key = operator.create(PD)
    await operator.converge(key)
    assert operator.kube.names("StatefulSet") == ["qwen-d0", "qwen-d1", "qwen-p0"]
    for group, role, index in (("qwen-p0", "prefill", 0), ("qwen-d0", "decode", 0),
                               ("qwen-d1", "decode", 1)):  # fmt: skip
        serving(operator, group, role, index)
    await operator.converge(key)
    status = operator.status(key)
    assert [(g["role"], g["index"], g["state"]) for g in status["groups"]] == [
        ("prefill", 0, "Ready"), ("decode", 0, "Ready"), ("decode", 1, "Ready"),
    ]  # fmt: skip
    assert [(r["role"], r["readyReplicas"], r["groups"]) for r in status["roles"]] == [
        ("prefill", 1, [0]), ("decode", 2, [0, 1]),
    ]  # fmt: skip
    assert operator.conditions(key)["Progressing"] == ("False", "Complete")

    applied, deleted = len(operator.kube.applied), len(operator.kube.deleted)
    operator.edit(key, disaggregation={"prefill": {"replicas": 2}, "decode": {"replicas": 1}})
    await operator.converge(key)
    assert operator.kube.applied[applied:] == [("Service", "qwen-p1"), ("StatefulSet", "qwen-p1")]
    assert sorted(operator.kube.deleted[deleted:]) == [
        ("Service", "qwen-d1"), ("StatefulSet", "qwen-d1"),
    ]  # fmt: skip
    assert operator.kube.names("StatefulSet") == ["qwen-d0", "qwen-p0", "qwen-p1"]
    assert not any(kind == "Pod" for kind, _ in operator.kube.deleted)  # nothing restarted


async def test_a_decode_only_change_rolls_decode_groups_alone(operator: Operator) -> None:
    key = operator.create(PD)
    await operator.converge(key)
    for group, role, index in (("qwen-p0", "prefill", 0), ("qwen-d0", "decode", 0),
                               ("qwen-d1", "decode", 1)):  # fmt: skip
        serving(operator, group, role, index)
    await operator.converge(key)
    prefill_revision = operator.status(key)["roles"][0]["revision"]

    applied, deleted = len(operator.kube.applied), len(operator.kube.deleted)
    decode = {"replicas": 2, "args": {"max-running-requests": 64}}
    operator.edit(key, disaggregation={**PD["disaggregation"], "decode": decode})
    await operator.converge(key)
    assert operator.kube.applied[applied:] == [("StatefulSet", "qwen-d0")]  # one at a time
    assert operator.kube.deleted[deleted:] == [("Pod", "qwen-d0-0")]
    roles = operator.status(key)["roles"]
    assert roles[0]["revision"] == prefill_revision
    assert [(r["role"], r["updatedReplicas"]) for r in roles] == [("prefill", 1), ("decode", 0)]
    assert operator.conditions(key)["Progressing"] == ("True", "RollingUpdate")


async def test_a_contract_change_with_one_group_per_role_surges_before_any_goes(
    operator: Operator,
) -> None:
    spec = {**PD, "disaggregation": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}}}
    key = operator.create(spec)
    await operator.converge(key)
    serving(operator, "qwen-p0", "prefill", 0)
    serving(operator, "qwen-d0", "decode", 0)
    await operator.converge(key)
    applied = len(operator.kube.applied)
    operator.edit(key, engine={"type": "simulated", "image": "example.com/engine:2"})
    await operator.converge(key)
    new = sorted(name for kind, name in operator.kube.applied[applied:] if kind == "StatefulSet")
    assert new == ["qwen-d1", "qwen-p1"]  # a surge group per role on the new contract
    assert not any(kind == "Pod" for kind, _ in operator.kube.deleted)  # the old pair serves

    serving(operator, "qwen-p1", "prefill", 1)  # the new prefill serves; no new decode yet
    await operator.converge(key)
    assert not any(kind == "Pod" for kind, _ in operator.kube.deleted)
    serving(operator, "qwen-d1", "decode", 1)  # a new pair: the old groups may go
    await operator.converge(key)
    assert sorted(n for kind, n in operator.kube.deleted if kind == "Pod") == [
        "qwen-d0-0", "qwen-p0-0",
    ]  # fmt: skip
