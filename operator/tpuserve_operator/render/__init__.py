"""Pure rendering: a TPUModelServer's metadata and spec -> every child manifest. No API calls.

Two steps, in this order: `validate_server` runs every check and raises InvalidSpec naming
every problem; `render` turns what it returns into manifests and cannot fail.
`build_children` is what `tpuserve render` prints and what the operator applies; both take
these two steps, so they can never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tpuserve_operator import disaggregation, labels, slo_plan
from tpuserve_operator.api import PlanStatus
from tpuserve_operator.errors import InvalidSpec
from tpuserve_operator.render import roles
from tpuserve_operator.render.autoscaler import autoscaler, autoscaler_problems
from tpuserve_operator.render.context import (
    Manifest,
    RenderConfig,
    Server,
    ValidServer,
    group_name,
    stable_hash,
)
from tpuserve_operator.render.demand import demand_lease
from tpuserve_operator.render.inference_pool import pool_children, pool_problems
from tpuserve_operator.render.monitors import monitors
from tpuserve_operator.render.network_policy import engine_network_policy
from tpuserve_operator.render.pdb import disruption_budget
from tpuserve_operator.render.router import router_children
from tpuserve_operator.render.services import endpoint_service, leaders_service
from tpuserve_operator.render.workload import (
    check_group_contract,
    engine_templates,
    group_children,
)
from tpuserve_operator.validation import validate

__all__ = [
    "Manifest",
    "RenderConfig",
    "Rendered",
    "Server",
    "ValidServer",
    "build_children",
    "render",
    "validate_server",
]


@dataclass(frozen=True, slots=True)
class Rendered:
    """Everything a server should have, with replica groups kept apart for rolling.

    Groups are named by their group key (`disaggregation.group_key`): a plain server's group
    k is k; a disaggregated server's are each role's indices, offset per role.

    `revision` hashes every group's pod templates (status.revision); a disaggregated server's
    groups each carry their role's own (`role_revisions`: the role's templates alone), so a
    change to one role's templates rolls that role's groups only."""

    server: ValidServer
    revision: str
    shared: list[Manifest]
    plan: PlanStatus
    role_revisions: Mapping[str, str] = field(default_factory=dict)
    _groups: dict[int, list[Manifest]] = field(default_factory=dict, compare=False, repr=False)
    _roles: dict[str, ValidServer] = field(default_factory=dict, compare=False, repr=False)

    def role_server(self, role: str) -> ValidServer:
        """The server as one role's groups see it (`roles.role_server`), made once."""
        if role not in self._roles:
            self._roles[role] = roles.role_server(self.server, role)
        return self._roles[role]

    def group(self, key: int) -> list[Manifest]:
        """Replica group `key` at the current revision (also for surge groups)."""
        if key not in self._groups:
            role = disaggregation.key_role(key)
            if role is not None and self.server.valid.spec.disaggregation is not None:
                view = self.role_server(role)
                index = disaggregation.key_index(key)
                revision = self.role_revisions[role]
                self._groups[key] = roles.group(self.server, view, index, revision)
            else:
                self._groups[key] = group_children(self.server, key, self.revision)
        return self._groups[key]

    def group_revision(self, key: int) -> str:
        """The revision group `key`'s pods should run: its role's, else the server's."""
        role = disaggregation.key_role(key)
        return self.role_revisions.get(role, self.revision) if role else self.revision

    @property
    def replicas(self) -> int:
        """Replica groups: spec.replicas, or both roles' when disaggregated."""
        return disaggregation.replicas(self.server.valid.spec)

    @property
    def group_keys(self) -> tuple[int, ...]:
        """The keys of the groups the spec wants (surge groups aside)."""
        return disaggregation.group_keys(self.server.valid.spec)

    def group_name(self, key: int) -> str:
        """The workload name of group `key`."""
        role = disaggregation.key_role(key)
        return group_name(self.server.name, role, disaggregation.key_index(key))

    def group_hosts(self, key: int) -> int:
        """Hosts (pods) of group `key`: its role's slice when disaggregated."""
        spec = self.server.valid.spec
        role = disaggregation.key_role(key)
        if (
            role is None
            or spec.disaggregation is None
            or disaggregation.role_of(spec, role).tpu is None
        ):
            return self.server.valid.shape.hosts
        return self.role_server(role).valid.shape.hosts

    @property
    def children(self) -> list[Manifest]:
        groups = [m for k in self.group_keys for m in self.group(k)]
        return [*self.shared, *groups]

    @property
    def selector(self) -> str:
        return labels.selector_string(labels.leader_selector(self.server.name))

    @property
    def endpoint(self) -> str:
        return self.server.endpoint


def validate_server(
    meta: Mapping[str, Any],
    spec: Mapping[str, Any],
    config: RenderConfig,
    *,
    cel_rules: bool = True,
) -> ValidServer:
    """The one validation step: the spec's own checks (`validate`), then, bound to its identity
    and settings, the launch contract its replica groups get. InvalidSpec names every problem.

    The operator passes `cel_rules=False`: the apiserver enforced the CRD's CEL rules.
    """
    name = str(meta.get("name") or "")
    valid = validate(
        name, spec, cel_rules=cel_rules, plan_slices=config.plan_slices or slo_plan.DEFAULT_SLICES
    )
    checked = valid.spec
    problems = pool_problems(
        checked.inference_pool, checked.router.enabled, config, checked.disaggregation is not None
    )
    problems += roles.role_scale_problems(valid.spec, config)
    problems += autoscaler_problems(valid.spec, config)
    if problems:
        raise InvalidSpec(problems)
    annotations = meta.get("annotations") or {}
    server = Server(
        name=name,
        namespace=str(meta.get("namespace") or "default"),
        valid=valid,
        config=config,
        uid=meta.get("uid"),
        restarted_at=annotations.get(labels.RESTARTED_AT),
    )
    if valid.spec.disaggregation is not None:
        for role in disaggregation.ROLES:  # each role's contract is checked as well
            roles.role_server(server, role)
    return ValidServer(
        name=server.name,
        namespace=server.namespace,
        valid=server.valid,
        config=server.config,
        uid=server.uid,
        restarted_at=server.restarted_at,
        contract=check_group_contract(server),
    )


def render(server: ValidServer) -> Rendered:
    """Every child of a validated server (replica groups built on demand); cannot fail."""
    role_revisions: dict[str, str] = {}
    if server.valid.spec.disaggregation is not None:
        templates = {role: roles.templates(server, role) for role in disaggregation.ROLES}
        role_revisions = {
            role: stable_hash([server.workload_kind, *role_templates])
            for role, role_templates in templates.items()
        }
        revision = stable_hash(
            [server.workload_kind, *(t for ts in templates.values() for t in ts)]
        )
    else:
        revision = stable_hash([server.workload_kind, *engine_templates(server, 0)])
    shared = [
        endpoint_service(server),
        leaders_service(server),
        disruption_budget(server),
        *engine_network_policy(server),
        *autoscaler(server),
        *roles.role_scales(server),
        *router_children(server),
        # without a router of its own, a TPUGateway renews the Lease (render/gateway.py)
        *(demand_lease(server) if not server.valid.spec.router.enabled else []),
        *monitors(server),
        *pool_children(server),
    ]
    shape = server.valid.shape
    plan = PlanStatus(
        workload=server.workload_kind,
        machine_type=shape.machine_type,
        hosts=shape.hosts,
        chips_per_host=shape.chips_per_host,
        chips=shape.chips,
        generation=shape.generation.name,
        topology=shape.topology,
    )
    sized = server.valid.plan
    if sized is not None:
        plan = plan.model_copy(
            update={
                "source": sized.source,
                "min_replicas": sized.min_replicas,
                "max_replicas": sized.max_replicas,
                "operating_point": sized.operating_point(),
                "error_band": sized.error_band(),
                "message": sized.message,
            }
        )
    return Rendered(
        server=server, revision=revision, shared=shared, plan=plan, role_revisions=role_revisions
    )


def build_children(
    meta: Mapping[str, Any], spec: Mapping[str, Any], config: RenderConfig
) -> list[Manifest]:
    """Every child of the server, validated: what `tpuserve render` prints."""
    return render(validate_server(meta, spec, config)).children
