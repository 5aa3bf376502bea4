"""What every part of the TPUModelServer schema is built from.

`Schema`, the base of every API model; the shared patterns and bounds (names, Secret keys,
weights locations, request time); the helpers that attach CEL rules and pass-through schemas
to a model (`rules`, `free_form`, `section`, `source_rule`); and `SecretKeyRef`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# Bounds that also keep the apiserver's CEL cost estimate small (every string a rule reads
# has a maxLength, every list a maxItems).
MAX_NAME_LENGTH = 40  # leaves room for `-r<k>-w-<i>` and the controller-revision-hash suffix
SERVER_NAME = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"  # children include Services: DNS-1035 labels
NAME_RULE = (
    f"size(self.metadata.name) <= {MAX_NAME_LENGTH} && self.metadata.name.matches('{SERVER_NAME}')"
)
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
LABEL_VALUE = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$"
SECRET_KEY = r"^[-._a-zA-Z0-9]+$"  # a key of a Secret's data
# GKE drains a node for at most an hour; a pod's grace (preStop pause <= 5 s + the longest
# request + a 5 s kill margin, render/pod.py `termination`) must fit in it.
MAX_GRACE_SECONDS = 3600
MAX_REQUEST_SECONDS = MAX_GRACE_SECONDS - 10
GCS_BUCKET = "gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]"
SOURCE_PATTERNS = (
    "^hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[A-Za-z0-9][A-Za-z0-9._/-]*)?$",
    f"^{GCS_BUCKET}(/.*)?$",
    "^pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/.*)?$",
)
# A gs:// prefix without ',': it goes into the FUSE mount's comma-separated options.
GCS_PREFIX_PATTERN = f"^{GCS_BUCKET}(/[^,]*)?$"
# No ',' in an adapter's source: the launcher takes the adapters as one comma-separated list.
NO_COMMA = "^[^,]*$"


def source_rule(field: str, api_path: str) -> tuple[str, str]:
    """The CEL rule (and its message) for a weights location: hf://, gs:// or pvc://."""
    rule = " || ".join(f"self.{field}.matches('{p}')" for p in SOURCE_PATTERNS)
    return (
        rule,
        f"{api_path} must be hf://ORG/NAME[@REVISION], gs://BUCKET/PATH or pvc://CLAIM/PATH",
    )


def rules(*pairs: tuple[str, str]) -> dict[str, Any]:
    """CEL rules for a model's schema node: (rule, message) pairs."""
    return {"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in pairs]}


def free_form(kind: Literal["object", "array"], **extra: Any) -> dict[str, Any]:
    """Schema extras for a field passed through to Kubernetes as written (pod overrides)."""
    return {"type": kind, "x-kubernetes-preserve-unknown-fields": True, **extra}


ENGINE_ARGS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": {"x-kubernetes-preserve-unknown-fields": True},
    "maxProperties": 64,
}
"""The schema of SGLang flags as a map (spec.engine.args and each PD role's args)."""


class Schema(BaseModel):
    """Base of every API model: camelCase JSON names, unknown fields rejected, and values of
    the declared JSON type only (strict: ``replicas: true`` or ``"3"`` is refused, as the
    apiserver refuses it, not read as 1 or 3)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True
    )


def section(model: type[Schema], description: str) -> Any:
    """A field holding a sub-object that defaults to its own defaults (`{}` in the CRD)."""
    return Field(default_factory=model, json_schema_extra={"default": {}}, description=description)


class SecretKeyRef(Schema):
    name: str = Field(
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="name is the Secret's name, in the TPUModelServer's namespace.",
    )
    key: str = Field(
        default="token",
        max_length=253,
        description="key is the key inside the Secret holding the value. Default: token.",
    )
