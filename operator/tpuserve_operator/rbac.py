"""RBAC rules: what the operator may do, and what each router it creates may do. Defined once.

`python -m tpuserve_operator.build.generate` writes OPERATOR_RULES to
charts/tpuserve/files/operator-rbac-rules.yaml (the chart's ClusterRole/Role include it) and
to docs/operator.md. ROUTER_RULES go into the Role the operator creates per TPUModelServer
for its router's ServiceAccount; the operator holds every permission it grants there, so it
needs no `escalate` or `bind` verbs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpuserve_operator import labels

READ = ("get", "list", "watch")
MANAGE = ("get", "list", "watch", "create", "patch", "update", "delete")


@dataclass(frozen=True, slots=True)
class Rule:
    group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str

    def as_policy_rule(self) -> dict[str, Any]:
        return {
            "apiGroups": [self.group],
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }


# Namespaced resources: a ClusterRole in cluster-wide mode, a Role per watched namespace.
OPERATOR_RULES: tuple[Rule, ...] = (
    Rule(
        labels.GROUP,
        (labels.PLURAL,),
        ("get", "list", "watch", "patch"),
        "watch TPUModelServers; kopf records its finalizer on them",
    ),
    Rule(
        labels.GROUP,
        (f"{labels.PLURAL}/status",),
        ("get", "patch", "update"),
        "write status (conditions, replicas, endpoint)",
    ),
    Rule(
        labels.GROUP,
        (labels.ROLE_PLURAL,),
        ("get", "list", "watch", "create", "patch", "delete"),
        "one TPUModelServerRole per autoscaled role of a disaggregated server (its HPA scales "
        "it; the operator reads its replicas)",
    ),
    Rule(
        labels.GROUP,
        (f"{labels.ROLE_PLURAL}/status",),
        ("patch",),
        "write a TPUModelServerRole's status (the role's groups, its leaders' selector)",
    ),
    Rule(
        labels.GROUP,
        (labels.GATEWAY_PLURAL,),
        ("get", "list", "watch", "patch"),
        "watch TPUGateways (and list them: is a server fronted); kopf's finalizer",
    ),
    Rule(
        labels.GROUP,
        (f"{labels.GATEWAY_PLURAL}/status",),
        ("get", "patch"),
        "write a TPUGateway's status (endpoint, models)",
    ),
    Rule(
        "leaderworkerset.x-k8s.io",
        ("leaderworkersets",),
        MANAGE,
        "one LeaderWorkerSet per replica group (when LWS is installed)",
    ),
    Rule("apps", ("statefulsets",), MANAGE, "replica groups without LWS"),
    Rule("apps", ("deployments",), MANAGE, "the router Deployment"),
    Rule(
        "",
        ("services", "configmaps", "serviceaccounts"),
        MANAGE,
        "endpoint and headless Services, router ConfigMap and ServiceAccount",
    ),
    Rule(
        "",
        ("pods",),
        ("get", "list", "watch", "delete"),
        "group state for status; restart a StatefulSet group's pods together (rollout, restart)",
    ),
    Rule(
        "discovery.k8s.io",
        ("endpointslices",),
        READ,
        "granted on to routers (an operator may only grant what it holds)",
    ),
    Rule(
        "policy",
        ("poddisruptionbudgets",),
        MANAGE,
        "a PodDisruptionBudget over each server's engines and one over its router",
    ),
    Rule(
        "networking.k8s.io",
        ("networkpolicies",),
        MANAGE,
        "one NetworkPolicy per server: only its routers (and shared ones) and Prometheus reach "
        "its engines",
    ),
    Rule(
        "autoscaling",
        ("horizontalpodautoscalers",),
        MANAGE,
        "one HorizontalPodAutoscaler per server that sets spec.autoscaling",
    ),
    Rule(
        "keda.sh",
        ("scaledobjects",),
        MANAGE,
        "one KEDA ScaledObject per server (or role) whose autoscaling.engine is keda (when "
        "KEDA's CRDs are installed)",
    ),
    Rule(
        "rbac.authorization.k8s.io",
        ("roles", "rolebindings"),
        MANAGE,
        "the router's Role and RoleBinding (read pods and EndpointSlices)",
    ),
    Rule(
        "coordination.k8s.io",
        ("leases",),
        MANAGE,
        "the demand Lease of a server that scales to zero (its routers renew it)",
    ),
    Rule(
        "monitoring.coreos.com",
        ("podmonitors", "servicemonitors"),
        MANAGE,
        "Prometheus Operator monitors (when that CRD is installed)",
    ),
    Rule(
        "inference.networking.k8s.io",
        ("inferencepools",),
        MANAGE,
        "the InferencePool of a server that sets spec.inferencePool (when that CRD is installed)",
    ),
    Rule(
        "",
        ("secrets",),
        ("create",),
        "each server's router peering secret, created once with a random value; never read",
    ),
    Rule("", ("events",), ("create", "patch"), "Events on condition transitions"),
    Rule("events.k8s.io", ("events",), ("create", "patch"), "Events on condition transitions"),
    Rule(
        "kopf.dev",
        ("kopfpeerings",),
        ("get", "list", "watch", "patch", "create"),
        "peering between operator replicas (namespace-scoped mode)",
    ),
)

# Cluster-scoped resources: always a ClusterRole. Read-only, so a namespace-scoped install
# writes nothing outside its watched namespaces (a test keeps it so).
OPERATOR_CLUSTER_RULES: tuple[Rule, ...] = (
    Rule(
        "apiextensions.k8s.io",
        ("customresourcedefinitions",),
        ("get", "list", "watch"),
        "notice LeaderWorkerSet and Prometheus Operator CRDs appearing",
    ),
    Rule("", ("namespaces",), ("get", "list", "watch"), "kopf's namespace discovery"),
    Rule(
        "",
        ("nodes",),
        READ,
        "move replica groups off nodes GKE announces maintenance or preemption on (labels, taints)",
    ),
)

# Cluster-scoped resources only a cluster-wide install needs: in its ClusterRole alone.
OPERATOR_CLUSTER_WIDE_RULES: tuple[Rule, ...] = (
    Rule(
        "kopf.dev",
        ("clusterkopfpeerings",),
        ("get", "list", "watch", "patch", "create"),
        "peering between operator replicas (cluster-wide mode)",
    ),
)

ROUTER_RULES: tuple[Rule, ...] = (
    Rule("", ("pods",), READ, "discover leader pods by label selector"),
    Rule("discovery.k8s.io", ("endpointslices",), READ, "discover leader endpoints"),
)


def rules_file() -> dict[str, Any]:
    """The shape the chart reads: `rules` (namespaced), `clusterRules` (cluster-scoped, every
    install) and `clusterWideRules` (cluster-scoped, cluster-wide installs only)."""
    return {
        "rules": [r.as_policy_rule() for r in OPERATOR_RULES],
        "clusterRules": [r.as_policy_rule() for r in OPERATOR_CLUSTER_RULES],
        "clusterWideRules": [r.as_policy_rule() for r in OPERATOR_CLUSTER_WIDE_RULES],
    }
