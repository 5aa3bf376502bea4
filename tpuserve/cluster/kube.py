"""Thin helpers over the official `kubernetes` client: create-or-replace and readiness checks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def client() -> Any:
    """The `kubernetes.client` module (imported on first use: it is slow to import)."""
    import kubernetes.client

    return kubernetes.client


def config() -> Any:
    import kubernetes.config

    return kubernetes.config


def watch() -> Any:
    """The `kubernetes.watch` module (its `Watch().stream(list_call, ...)` follows a list)."""
    import kubernetes.watch

    return kubernetes.watch


def api_exception() -> type[Exception]:
    from kubernetes.client.exceptions import ApiException

    exc: type[Exception] = ApiException
    return exc


def create_or_replace_crd(extensions: Any, body: dict[str, Any]) -> None:
    try:
        extensions.create_custom_resource_definition(body)
    except api_exception() as err:
        if getattr(err, "status", None) != 409:
            raise
        current = extensions.read_custom_resource_definition(body["metadata"]["name"])
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        extensions.replace_custom_resource_definition(body["metadata"]["name"], body)


def crd_established(extensions: Any, name: str) -> bool:
    crd = extensions.read_custom_resource_definition(name)
    return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])


def create_or_replace_webhook(admission: Any, body: dict[str, Any]) -> None:
    kind = body["kind"]
    create, read, replace = (
        (
            admission.create_mutating_webhook_configuration,
            admission.read_mutating_webhook_configuration,
            admission.replace_mutating_webhook_configuration,
        )
        if kind == "MutatingWebhookConfiguration"
        else (
            admission.create_validating_webhook_configuration,
            admission.read_validating_webhook_configuration,
            admission.replace_validating_webhook_configuration,
        )
    )
    try:
        create(body)
    except api_exception() as err:
        if getattr(err, "status", None) != 409:
            raise
        body["metadata"]["resourceVersion"] = read(
            body["metadata"]["name"]
        ).metadata.resource_version
        replace(body["metadata"]["name"], body)


def install_crds(api: Any, paths: list[Path], timeout_seconds: float) -> None:
    """Create (or replace) CRDs from YAML files and wait until the apiserver serves them."""
    import yaml

    # Large CRDs (LWS's is 1.3 MB): libyaml parses in ~0.3 s, pure-Python PyYAML in ~3 s.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    extensions = client().ApiextensionsV1Api(api)
    crds = [yaml.load(path.read_text(), Loader=loader) for path in paths]
    for crd in crds:
        create_or_replace_crd(extensions, crd)
    wait_established(extensions, [crd["metadata"]["name"] for crd in crds], timeout_seconds)


def wait_established(extensions: Any, names: Sequence[str], timeout_seconds: float) -> None:
    """Until the apiserver serves every CRD in `names` (their Established condition)."""
    from tpuserve.cluster.process import wait_for

    wait_for(
        f"CRDs {', '.join(names)} Established",
        lambda: all(crd_established(extensions, n) for n in names),
        timeout_seconds,
    )


def register_api_services(
    api: Any, service: dict[str, Any], api_services: list[dict[str, Any]]
) -> None:
    """Create (or replace) the Service an aggregated API server answers behind, then create
    (or patch) the APIServices that point at it: the metrics adapter's and KEDA's."""
    core = client().CoreV1Api(api)
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    try:
        core.create_namespaced_service(namespace, service)
    except api_exception() as err:
        if getattr(err, "status", None) != 409:
            raise
        core.replace_namespaced_service(name, namespace, service)
    registration = client().ApiregistrationV1Api(api)
    for manifest in api_services:
        try:
            registration.create_api_service(manifest)
        except api_exception() as err:
            if getattr(err, "status", None) != 409:
                raise
            registration.patch_api_service(manifest["metadata"]["name"], manifest)
