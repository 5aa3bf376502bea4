"""A disaggregated TPUModelServer (``spec.disaggregation``): its two roles, what each role's
engines get, and the checks that refuse roles that cannot pair.

Each role's replica groups have their own index space and names: ``<name>-p0 .. p(P-1)``
for prefill, ``<name>-d0 .. d(D-1)`` for decode (P, D: the roles' replicas), so resizing or
changing one role never touches the other's groups. Inside the operator a group is one int,
its **group key** (`group_key`): a plain server's group k is k, a role's group k is
``ROLE_KEY_BASE[role] + k``; observed views, reports, plans and restarts all key on it, and
its pods' labels give it back (`key_of_labels`: the replica label is the index within the
role, the role label says which). One slice per group. A role's groups are
rendered from the role's own spec (`role_spec`): the server's spec with the role's TPU
slice, replicas, image and SGLang flags, plus the disaggregation flags the operator owns
(``--disaggregation-mode``, ``--disaggregation-transfer-backend``, and for prefill
``--disaggregation-bootstrap-port``). Their pods carry the role label the router's discovery
reads (`sglang_tpu.disaggregation.PD_ROLE_LABEL`), prefill pods the bootstrap port as the
annotation sglang-router reads (``sglang.ai/bootstrap-port``), and both roles prefer one zone
(a KV transfer between slices crosses the data-centre network; across zones it would cross
more of it).

Checks (`problems`), each naming the field, in the operator's ``Valid`` condition:

- the transfer backend must move KV between the engine's slices: SGLang 0.5.23 has no TPU
  backend, so with ``engine.type: sglang`` every value is refused
  (``UnsupportedTransferBackend``); the simulated engine takes any SGLang value;
- both roles run one engine image (``UnpairableRoles``), one page size and KV dtype (SGLang's
  decode refuses a prefill whose differ), and TP sizes where the larger is a multiple of the
  smaller (SGLang maps ranks by integer division); DP sizes pair freely (``room % dp_size``);
- the disaggregation flags are the operator's, in ``engine.args`` and the roles' ``args``
  (the other flags the operator owns are refused in the roles' ``args`` as in
  ``engine.args``, by `validation`);
- ``spec.autoscaling`` is refused with roles (one scale subresource cannot count two roles);
  each role scales on its own (``spec.disaggregation.<role>.autoscaling``, through its
  TPUModelServerRole, `render.roles.role_scale`), by a metric that measures that role's load
  (`ROLE_METRICS`: prefill by queue or ttft, decode by queue or tokensInFlight) and never to
  zero (scale to zero holds requests for one replica count, `scale_to_zero`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

from sglang_tpu import disaggregation as pd
from sglang_tpu.topology import CatalogError, SliceShape, lookup
from tpuserve_operator.api import AutoscalingSpec, PdRoleSpec, TPUModelServerSpec
from tpuserve_operator.conditions import Reason
from tpuserve_operator.errors import Problem

PREFILL: Final = "prefill"
DECODE: Final = "decode"
ROLES: Final = (PREFILL, DECODE)
OWNED_FLAGS: Final = (
    "disaggregation-mode",
    "disaggregation-transfer-backend",
    "disaggregation-bootstrap-port",
)
PAIRED_FLAGS: Final = ("page-size", "kv-cache-dtype")

# The refusals' messages, as templates: `validation` fills them in Python and
# `build.admission` in CEL (the admission policy says the operator's words, word for word).
# Values are Python reprs ('text', 32, None), as the operator prints them.
ENGINE_ARG_MESSAGE: Final = (
    "--{flag} is set by the operator from spec.disaggregation; allowed: spec.disaggregation"
)
ROLE_ARG_MESSAGE: Final = (
    "--{flag} is set by the operator from spec.disaggregation; allowed: SGLang flags the "
    "operator does not set"
)
TRANSFER_BACKEND_MESSAGE: Final = (
    "{value} is not allowed with spec.engine.type sglang: SGLang "
    f"{pd.SGLANG_VERSION} has no transfer backend that moves KV between TPU slices "
    "(mooncake, mori, nixl and ascend are RDMA GPU/NPU backends, fake moves none); "
    "allowed: none yet, or spec.engine.type simulated"
)
SGL_JAX_MESSAGE: Final = (
    "is not allowed with spec.engine.type sglang-jax yet: SGLang-JAX pairs its own prefill "
    "and decode engines (--disaggregation-mode, a bootstrap server, KV over "
    "jax.experimental.transfer) that the operator does not launch; allowed: no "
    "spec.disaggregation, or spec.engine.type simulated"
)
AUTOSCALING_MESSAGE: Final = (
    "is not allowed with spec.disaggregation (one scale subresource cannot count two roles); "
    "allowed: spec.disaggregation.prefill.autoscaling and spec.disaggregation.decode.autoscaling"
)
ROLE_METRICS: Final = {
    PREFILL: ("queue", "ttft", "backlogSeconds"),
    DECODE: ("queue", "tokensInFlight", "kvCacheUsage"),
}
"""The autoscaling metrics that measure each role's load (`autoscaling.metric` values)."""
ROLE_METRIC_WHY: Final = {
    PREFILL: "a prefill engine frees a prompt's KV once it is sent, so KV in use is not its load",
    DECODE: (
        "a decode engine's time to first token and prefill backlog are the prefill role's and "
        "the KV transfer's"
    ),
}
ROLE_METRIC_MESSAGE: Final = (
    "{value} is not allowed for the {role} role ({why}); allowed: {allowed}"
)
ROLE_MIN_REPLICAS_MESSAGE: Final = (
    "0 is not allowed with spec.disaggregation (scale to zero holds requests for one replica "
    "count, not for a pair of roles); allowed: 1 to maxReplicas"
)
IMAGE_MESSAGE: Final = (
    "{decode} differs from the prefill role's {prefill}; allowed: one engine image for both "
    "roles (KV layouts of different engine versions cannot pair)"
)
PAIRED_MESSAGE: Final = (
    "{decode} differs from the prefill role's {prefill}; allowed: the same --{flag} for both "
    "roles (SGLang's decode refuses a prefill whose differs)"
)
TP_MESSAGE: Final = (
    "TP {decode_tp} ({decode_slice}) does not pair with the prefill role's TP {prefill_tp} "
    "({prefill_slice}); allowed: TP sizes where the larger is a multiple of the smaller "
    "(SGLang maps KV ranks by integer division)"
)


def role_of(spec: TPUModelServerSpec, role: str) -> PdRoleSpec:
    assert spec.disaggregation is not None
    return spec.disaggregation.prefill if role == PREFILL else spec.disaggregation.decode


GROUP_PREFIX: Final = {PREFILL: "p", DECODE: "d"}
"""A role's groups are named ``<name>-<prefix><k>`` (a plain server's ``<name>-r<k>``)."""
ROLE_KEY_BASE: Final = {PREFILL: 1 << 20, DECODE: 2 << 20}
"""Where each role's group keys start. Replicas and surge are at most 1024 each, so a plain
server's keys (``0 .. replicas+maxSurge-1``) and each role's never meet."""


def replicas(spec: TPUModelServerSpec) -> int:
    """Replica groups of the server: both roles' when disaggregated."""
    if spec.disaggregation is None:
        return spec.replicas
    return spec.disaggregation.prefill.replicas + spec.disaggregation.decode.replicas


def group_key(role: str | None, index: int) -> int:
    """The group key of group ``index`` of ``role`` (None: a plain server's group)."""
    return index if role is None else ROLE_KEY_BASE[role] + index


def key_role(key: int) -> str | None:
    """The role of the group with key ``key`` (None: a plain server's group)."""
    for role in reversed(ROLES):
        if key >= ROLE_KEY_BASE[role]:
            return role
    return None


def key_index(key: int) -> int:
    """The index of the group with key ``key`` within its role (its replica label)."""
    role = key_role(key)
    return key if role is None else key - ROLE_KEY_BASE[role]


def key_of_labels(labels: Mapping[str, str], replica: int | None) -> int | None:
    """The group key of a pod or child with these labels and replica label ``replica``; None
    when it is not a group's (or names a role the operator does not know)."""
    if replica is None or replica < 0:
        return None
    role = labels.get(pd.PD_ROLE_LABEL)
    if role is None:
        return replica
    return group_key(role, replica) if role in ROLES else None


def group_keys(spec: TPUModelServerSpec) -> tuple[int, ...]:
    """The keys of the server's wanted groups (without surge), in order."""
    if spec.disaggregation is None:
        return tuple(range(spec.replicas))
    return tuple(group_key(role, k) for role in ROLES for k in range(role_of(spec, role).replicas))


def describe(key: int) -> str:
    """How messages name a group: its index, with its role when it has one."""
    role = key_role(key)
    return str(key) if role is None else f"{role} {key_index(key)}"


def engine_flags(spec: TPUModelServerSpec, role: str) -> dict[str, Any]:
    """The SGLang flags the operator sets for ``role`` (as ``engine.args`` entries)."""
    assert spec.disaggregation is not None
    flags: dict[str, Any] = {
        "disaggregation-mode": role,
        "disaggregation-transfer-backend": spec.disaggregation.transfer_backend,
    }
    if role == PREFILL:
        flags["disaggregation-bootstrap-port"] = spec.disaggregation.bootstrap_port
    return flags


def role_spec(spec: TPUModelServerSpec, role: str) -> TPUModelServerSpec:
    """The spec a role's replica groups are rendered from."""
    part = role_of(spec, role)
    engine = spec.engine.model_copy(
        update={
            "image": part.image or spec.engine.image,
            "args": {**spec.engine.args, **part.args, **engine_flags(spec, role)},
        }
    )
    return spec.model_copy(
        update={
            "tpu": part.tpu or spec.tpu,
            "replicas": part.replicas,
            "engine": engine,
            "disaggregation": None,
        }
    )


def pairing_contract(spec: TPUModelServerSpec, image: str) -> str:
    """What a prefill and a decode engine of ``spec`` must share to pair, hashed for the
    pods' `pd.PD_CONTRACT_LABEL` (``image``: the engine image the groups run, the roles'
    one, admission-checked equal): the model, the transfer backend and the paired flags.
    TP is left out: every TP size in the catalog is a power of two, so any two pair."""
    assert spec.disaggregation is not None
    args = {**spec.engine.args, **spec.disaggregation.prefill.args}
    contract = {
        "image": image,
        "model": spec.model.source,
        "transferBackend": spec.disaggregation.transfer_backend,
        **{flag: args.get(flag) for flag in PAIRED_FLAGS},
    }
    digest = hashlib.sha256(json.dumps(contract, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def tp_pairs(prefill_tp: int, decode_tp: int) -> bool:
    """Whether SGLang can map KV ranks between these TP sizes (integer division)."""
    small, large = sorted((prefill_tp, decode_tp))
    return small > 0 and large % small == 0


def role_metric_message(role: str, value: str) -> str:
    """`ROLE_METRIC_MESSAGE` for ``role`` and a metric ``value`` (as the operator prints it)."""
    allowed = ", ".join(ROLE_METRICS[role])
    return ROLE_METRIC_MESSAGE.format(
        value=value, role=role, why=ROLE_METRIC_WHY[role], allowed=allowed
    )


def _role_autoscaling(role: str, autoscaling: AutoscalingSpec | None) -> list[Problem]:
    if autoscaling is None:
        return []
    field = f"spec.disaggregation.{role}.autoscaling"
    found = []
    if autoscaling.metric not in ROLE_METRICS[role]:
        message = role_metric_message(role, repr(autoscaling.metric))
        found.append(Problem(f"{field}.metric", message))
    if autoscaling.min_replicas == 0:
        found.append(Problem(f"{field}.minReplicas", ROLE_MIN_REPLICAS_MESSAGE))
    return found


def autoscaled_roles(spec: TPUModelServerSpec) -> tuple[str, ...]:
    """The roles that scale on their own (``spec.disaggregation.<role>.autoscaling``)."""
    if spec.disaggregation is None:
        return ()
    return tuple(role for role in ROLES if role_of(spec, role).autoscaling is not None)


def seed_replicas(part: PdRoleSpec) -> int:
    """The count an autoscaled role starts from: its ``replicas`` within min..max."""
    assert part.autoscaling is not None
    return min(max(part.replicas, part.autoscaling.min_replicas), part.autoscaling.max_replicas)


def with_role_replicas(spec: Mapping[str, Any], counts: Mapping[str, int]) -> dict[str, Any]:
    """``spec`` (a TPUModelServer's, as JSON) with ``counts`` as its roles' replicas: how an
    autoscaled role's count (its TPUModelServerRole's) enters rendering, which stays pure."""
    if not counts:
        return dict(spec)
    dis = dict(spec.get("disaggregation") or {})
    for role, count in counts.items():
        dis[role] = {**(dis.get(role) or {}), "replicas": count}
    return {**spec, "disaggregation": dis}


def _shape(spec: TPUModelServerSpec, role: str, problems: list[Problem]) -> SliceShape | None:
    tpu = role_of(spec, role).tpu
    if tpu is None:
        return None  # spec.tpu, checked with the server
    path = f"spec.disaggregation.{role}.tpu.topology"
    try:
        return lookup(tpu.generation, tpu.topology, field_path=path)
    except CatalogError as err:
        message = str(err).removeprefix(f"{err.field}: ")  # Problem prints the field
        problems.append(Problem(err.field, message, reason=Reason.UNSUPPORTED_TOPOLOGY))
        return None


def problems(spec: TPUModelServerSpec, server_shape: SliceShape | None) -> list[Problem]:
    """Every reason the roles cannot work (empty without ``spec.disaggregation``)."""
    found: list[Problem] = []
    for flag in spec.engine.args:
        if flag.lstrip("-") in OWNED_FLAGS:
            found.append(
                Problem(
                    f"spec.engine.args.{flag}",
                    ENGINE_ARG_MESSAGE.format(flag=flag.lstrip("-")),
                    reason=Reason.RESERVED_FIELD,
                )
            )
    dis = spec.disaggregation
    if dis is None:
        return found
    if spec.engine.type == "sglang-jax":
        found.append(Problem("spec.disaggregation", SGL_JAX_MESSAGE))
    if spec.engine.type == "sglang":
        found.append(
            Problem(
                "spec.disaggregation.transferBackend",
                TRANSFER_BACKEND_MESSAGE.format(value=repr(dis.transfer_backend)),
                reason=Reason.UNSUPPORTED_TRANSFER_BACKEND,
            )
        )
    if spec.autoscaling is not None:
        found.append(Problem("spec.autoscaling", AUTOSCALING_MESSAGE))
    for role in ROLES:
        found += _role_autoscaling(role, role_of(spec, role).autoscaling)
    images = {role: role_of(spec, role).image or spec.engine.image for role in ROLES}
    if images[PREFILL] != images[DECODE]:
        found.append(
            Problem(
                "spec.disaggregation.decode.image",
                IMAGE_MESSAGE.format(decode=repr(images[DECODE]), prefill=repr(images[PREFILL])),
                reason=Reason.UNPAIRABLE_ROLES,
            )
        )
    for role in ROLES:
        for flag in role_of(spec, role).args:
            if flag.lstrip("-") in OWNED_FLAGS:
                found.append(
                    Problem(
                        f"spec.disaggregation.{role}.args.{flag}",
                        ROLE_ARG_MESSAGE.format(flag=flag.lstrip("-")),
                        reason=Reason.RESERVED_FIELD,
                    )
                )
    for flag in PAIRED_FLAGS:
        values = {
            role: repr({**spec.engine.args, **role_of(spec, role).args}.get(flag)) for role in ROLES
        }
        if values[PREFILL] != values[DECODE]:  # as written: 32 and 32.0 are two command lines
            found.append(
                Problem(
                    f"spec.disaggregation.decode.args.{flag}",
                    PAIRED_MESSAGE.format(
                        decode=values[DECODE], prefill=values[PREFILL], flag=flag
                    ),
                    reason=Reason.UNPAIRABLE_ROLES,
                )
            )
    shapes = {role: _shape(spec, role, found) or server_shape for role in ROLES}
    prefill, decode = shapes[PREFILL], shapes[DECODE]
    if prefill is not None and decode is not None and not tp_pairs(prefill.devices, decode.devices):
        found.append(
            Problem(
                "spec.disaggregation.decode.tpu.topology",
                TP_MESSAGE.format(
                    decode_tp=decode.devices,
                    decode_slice=f"{decode.generation.name} {decode.topology}",
                    prefill_tp=prefill.devices,
                    prefill_slice=f"{prefill.generation.name} {prefill.topology}",
                ),
                reason=Reason.UNPAIRABLE_ROLES,
            )
        )
    return found
