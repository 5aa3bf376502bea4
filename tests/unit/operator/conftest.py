"""Shared builders for operator unit tests: specs, servers and rendered children."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tpuserve_operator.render import RenderConfig, Rendered, render, validate_server

BASE_SPEC: dict[str, Any] = {
    "model": {"source": "hf://Qwen/Qwen3-8B", "tokenSecretRef": {"name": "hf-token"}},
    "tpu": {"generation": "v6e", "topology": "4x4"},
    "replicas": 2,
}


def _spec_with(**changes: Any) -> dict[str, Any]:
    """BASE_SPEC with top-level sections replaced or merged (dicts merge one level deep)."""
    spec = copy.deepcopy(BASE_SPEC)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


def _rendered(
    spec: dict[str, Any] | None = None,
    *,
    name: str = "qwen",
    namespace: str = "ml",
    uid: str | None = "uid-1",
    annotations: dict[str, str] | None = None,
    **config: Any,
) -> Rendered:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
    if annotations:
        meta["annotations"] = annotations
    return render(validate_server(meta, spec or BASE_SPEC, RenderConfig(**config)))


SpecWith = Callable[..., dict[str, Any]]
RenderFn = Callable[..., Rendered]


@pytest.fixture
def spec_with() -> SpecWith:
    """`spec_with(tpu={...}, replicas=3)`: the base spec with sections merged or replaced."""
    return _spec_with


@pytest.fixture
def rendered() -> RenderFn:
    """`rendered(spec, leaderworkerset=True, ...)`: render a server (name qwen, namespace ml)."""
    return _rendered


def by_kind(children: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [c for c in children if c["kind"] == kind]


def one(children: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [c for c in by_kind(children, kind) if c["metadata"]["name"] == name]
    return found


def pod_templates(children: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for c in children:
        if c["kind"] in ("StatefulSet", "Deployment"):
            yield c["spec"]["template"]
        elif c["kind"] == "LeaderWorkerSet":
            yield c["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
            yield c["spec"]["leaderWorkerTemplate"]["workerTemplate"]
