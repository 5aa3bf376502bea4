"""The TPUModelServer API: the one schema source.

These pydantic models are the single definition of the resource. From them come:

- the CRD's OpenAPI v3 schema, with every description, default, enum, bound and CEL rule
  (`build/crd.py`, written to `charts/tpuserve/crds/` by
  `python -m tpuserve_operator.build.generate`);
- the resource reference in docs/operator.md (same generator);
- the operator's typed view of a spec (`TPUModelServerSpec.model_validate(spec)`), and
  `tpuserve render`'s validation with no cluster (pydantic for types and bounds, the CRD's
  own CEL rules evaluated by `build/cel.py`).

Descriptions start with the JSON name and say what the field controls, its default and
how it interacts with other fields (the LeaderWorkerSet API style), so `kubectl explain`
documents the resource. Rules that need the topology catalog or the performance model are
not CEL: the operator checks them (`validation.py`) and reports `Valid=False`.

The models are written in `schema/`, one module per part of the resource: `base` (the
`Schema` base, shared patterns and rule helpers), `model`, `tpu`, `engine`, `kv_cache`,
`router`, `inference_pool`, `autoscaling`, `disaggregation`, `sizing` (slo and demand),
`server` (`TPUModelServerSpec` and its pod-level sections), `status` and `role` (the
TPUModelServerRole resource). This module is where callers import them from.
"""

from tpuserve_operator.schema.autoscaling import (
    AUTOSCALERS,
    KEDA_METRICS,
    KEDA_ONLY_MESSAGE,
    KEDA_SETTINGS_MESSAGE,
    SCALE_DOWN_MESSAGE,
    SCALE_UP_MESSAGE,
    AutoscalingSpec,
    KedaSpec,
    PredictiveFloorSpec,
    ScaleToZeroSpec,
)
from tpuserve_operator.schema.base import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    ENGINE_ARGS_SCHEMA,
    GCS_BUCKET,
    GCS_PREFIX_PATTERN,
    LABEL_VALUE,
    MAX_GRACE_SECONDS,
    MAX_NAME_LENGTH,
    MAX_REQUEST_SECONDS,
    NAME_RULE,
    NO_COMMA,
    SECRET_KEY,
    SERVER_NAME,
    SOURCE_PATTERNS,
    Schema,
    SecretKeyRef,
    free_form,
    rules,
    section,
    source_rule,
)
from tpuserve_operator.schema.disaggregation import (
    DisaggregationSpec,
    PdRoleSpec,
)
from tpuserve_operator.schema.engine import (
    TPU_ENGINE_TYPES,
    CompileCacheSpec,
    EngineSpec,
    SpeculativeSpec,
)
from tpuserve_operator.schema.inference_pool import (
    GATEWAY_FROM_RULE,
    GATEWAY_NAMED_RULE,
    GATEWAY_ONE_WAY_RULE,
    GATEWAY_POD_LABEL,
    PEER_FIELDS,
    TOKEN_AUTH_RULE,
    InferencePoolSpec,
)
from tpuserve_operator.schema.kv_cache import (
    HostKvCacheSpec,
    KvCacheSpec,
)
from tpuserve_operator.schema.model import (
    ARCHITECTURE_MAX,
    LoraAdapterSpec,
    ModelArchitecture,
    ModelSpec,
)
from tpuserve_operator.schema.role import (
    TPUModelServerRoleSpec,
    TPUModelServerRoleStatus,
)
from tpuserve_operator.schema.router import (
    ApiKeysSecret,
    HoldSpec,
    RouterSpec,
)
from tpuserve_operator.schema.server import (
    MonitoringSpec,
    PodTemplateOverrides,
    RolloutSpec,
    TPUModelServerSpec,
)
from tpuserve_operator.schema.sizing import (
    DemandSpec,
    SloSpec,
)
from tpuserve_operator.schema.status import (
    ColdStartStatus,
    CompileCacheStatus,
    Condition,
    ErrorBandStatus,
    FloorReason,
    GatewayParentStatus,
    GroupStatus,
    InferencePoolStatus,
    OperatingPointStatus,
    PlanStatus,
    PredictiveFloorStatus,
    RoleStatus,
    TPUModelServerStatus,
)
from tpuserve_operator.schema.tpu import (
    THREE_DIMENSIONAL,
    THREE_DIMENSIONAL_CEL,
    TOPOLOGY_2D,
    TOPOLOGY_3D,
    TOPOLOGY_PATTERN,
    TPUSpec,
)

__all__ = [
    "ARCHITECTURE_MAX",
    "AUTOSCALERS",
    "DNS_LABEL",
    "DNS_SUBDOMAIN",
    "ENGINE_ARGS_SCHEMA",
    "GATEWAY_FROM_RULE",
    "GATEWAY_NAMED_RULE",
    "GATEWAY_ONE_WAY_RULE",
    "GATEWAY_POD_LABEL",
    "GCS_BUCKET",
    "GCS_PREFIX_PATTERN",
    "KEDA_METRICS",
    "KEDA_ONLY_MESSAGE",
    "KEDA_SETTINGS_MESSAGE",
    "LABEL_VALUE",
    "MAX_GRACE_SECONDS",
    "MAX_NAME_LENGTH",
    "MAX_REQUEST_SECONDS",
    "NAME_RULE",
    "NO_COMMA",
    "PEER_FIELDS",
    "SCALE_DOWN_MESSAGE",
    "SCALE_UP_MESSAGE",
    "SECRET_KEY",
    "SERVER_NAME",
    "SOURCE_PATTERNS",
    "THREE_DIMENSIONAL",
    "THREE_DIMENSIONAL_CEL",
    "TOKEN_AUTH_RULE",
    "TOPOLOGY_2D",
    "TOPOLOGY_3D",
    "TOPOLOGY_PATTERN",
    "TPU_ENGINE_TYPES",
    "ApiKeysSecret",
    "AutoscalingSpec",
    "ColdStartStatus",
    "CompileCacheSpec",
    "CompileCacheStatus",
    "Condition",
    "DemandSpec",
    "DisaggregationSpec",
    "EngineSpec",
    "ErrorBandStatus",
    "FloorReason",
    "GatewayParentStatus",
    "GroupStatus",
    "HoldSpec",
    "HostKvCacheSpec",
    "InferencePoolSpec",
    "InferencePoolStatus",
    "KedaSpec",
    "KvCacheSpec",
    "LoraAdapterSpec",
    "ModelArchitecture",
    "ModelSpec",
    "MonitoringSpec",
    "OperatingPointStatus",
    "PdRoleSpec",
    "PlanStatus",
    "PodTemplateOverrides",
    "PredictiveFloorSpec",
    "PredictiveFloorStatus",
    "RoleStatus",
    "RolloutSpec",
    "RouterSpec",
    "ScaleToZeroSpec",
    "Schema",
    "SecretKeyRef",
    "SloSpec",
    "SpeculativeSpec",
    "TPUModelServerRoleSpec",
    "TPUModelServerRoleStatus",
    "TPUModelServerSpec",
    "TPUModelServerStatus",
    "TPUSpec",
    "free_form",
    "rules",
    "section",
    "source_rule",
]
