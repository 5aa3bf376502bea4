"""Kubeconfig files for the local control plane: the admin's, and a ServiceAccount's for RBAC tests.

Every kubeconfig names one cluster and context, `tpuserve-local`, authenticates with a bearer
token and trusts the throwaway CA by file path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tpuserve.cluster import kube

CLUSTER_NAME = "tpuserve-local"


def kubeconfig(
    server: str, ca_cert: Path, token: str, user: str, namespace: str = "default"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {"server": server, "certificate-authority": str(ca_cert)},
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {
                "name": CLUSTER_NAME,
                "context": {"cluster": CLUSTER_NAME, "user": user, "namespace": namespace},
            }
        ],
        "current-context": CLUSTER_NAME,
    }


def write_kubeconfig(
    path: Path, server: str, ca_cert: Path, token: str, user: str, namespace: str = "default"
) -> Path:
    """Write a kubeconfig readable by its owner only (it holds a token)."""
    config = kubeconfig(server, ca_cert, token, user, namespace)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def api_client(path: Path) -> Any:
    """A new `kubernetes.client.ApiClient` for the kubeconfig at `path`; close it when done."""
    return kube.config().new_client_from_config(config_file=str(path))


def service_account_token(
    api: Any, namespace: str, name: str, expiration_seconds: int = 3600
) -> str:
    """A token for the ServiceAccount, from the TokenRequest API."""
    response = (
        kube.client()
        .CoreV1Api(api)
        .create_namespaced_service_account_token(
            name, namespace, {"spec": {"expirationSeconds": expiration_seconds}}
        )
    )
    token: str = response.status.token
    return token
