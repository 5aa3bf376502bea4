"""A pod's volumes as directories under the pod's own directory, filled as the kubelet fills them.

- emptyDir: an empty directory (medium Memory too);
- configMap, secret, downwardAPI, projected (with serviceAccountToken): files, one per key or
  item, written once when the pod starts (the kubelet refreshes them later; this does not);
- persistentVolumeClaim: one directory per claim under the runner's directory, shared by every
  pod that mounts the claim and kept after the pods go;
- hostPath and anything else: a directory of its own, empty (the host is never touched).

The ServiceAccount token, unless `automountServiceAccountToken` is false, is written where a
pod finds it (token, ca.crt, namespace) and as a kubeconfig for the container's processes.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tpuserve.cluster import kubeconfig
from tpuserve.cluster.pods.container_spec import ContainerConfigError, field_value

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
SERVICE_ACCOUNT_VOLUME = "kube-api-access"
TOKEN_EXPIRATION_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True, slots=True)
class TokenRequest:
    """A ServiceAccount token bound to a pod, as Kubernetes' TokenRequest asks for one."""

    namespace: str
    service_account: str
    pod_name: str
    pod_uid: str
    expiration_seconds: int
    audiences: tuple[str, ...] = ()


class ClusterReader(Protocol):
    """What filling volumes reads from the API server."""

    @property
    def server(self) -> str: ...

    @property
    def ca_cert(self) -> Path: ...

    def data(self, kind: str, namespace: str, name: str) -> Mapping[str, str] | None:
        """A ConfigMap's or Secret's data (Secrets decoded); None when it does not exist."""

    def token(self, request: TokenRequest) -> str:
        """The token the API server issues for `request`."""


@dataclass(frozen=True, slots=True)
class PodVolumes:
    directories: dict[str, Path]
    kubeconfig: Path | None


def _write(directory: Path, files: Mapping[str, str], items: list[Any] | None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    selected = (
        {item["path"]: files[item["key"]] for item in items if item["key"] in files}
        if items
        else dict(files)
    )
    for relative, content in selected.items():
        target = directory / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)


def _object_files(
    reader: ClusterReader, kind: str, namespace: str, source: Mapping[str, Any], directory: Path
) -> None:
    name = source.get("name") or source.get("secretName")
    data = reader.data(kind, namespace, str(name))
    if data is None:
        if source.get("optional"):
            directory.mkdir(parents=True, exist_ok=True)
            return
        what = "configmap" if kind == "ConfigMap" else "secret"
        raise ContainerConfigError(f'{what} "{name}" not found')
    _write(directory, data, source.get("items"))


def _downward_files(
    pod: Mapping[str, Any], items: list[Any], pod_ip: str, host_ip: str, directory: Path
) -> None:
    files = {
        item["path"]: field_value(pod, item["fieldRef"]["fieldPath"], pod_ip, host_ip)
        for item in items
        if "fieldRef" in item
    }
    _write(directory, files, None)


def _source_files(
    reader: ClusterReader,
    pod: Mapping[str, Any],
    source: Mapping[str, Any],
    directory: Path,
    pod_ip: str,
    host_ip: str,
) -> bool:
    """Fill `directory` from a configMap, secret or downwardAPI `source` (a volume or one source
    of a projected volume); False when it is none of those."""
    namespace = pod["metadata"].get("namespace", "default")
    if "configMap" in source:
        _object_files(reader, "ConfigMap", namespace, source["configMap"], directory)
    elif "secret" in source:
        _object_files(reader, "Secret", namespace, source["secret"], directory)
    elif "downwardAPI" in source:
        items = source["downwardAPI"].get("items") or []
        _downward_files(pod, items, pod_ip, host_ip, directory)
    else:
        return False
    return True


def _token_files(
    reader: ClusterReader,
    pod: Mapping[str, Any],
    directory: Path,
    path: str = "token",
    expiration_seconds: int = TOKEN_EXPIRATION_SECONDS,
    audience: str | None = None,
) -> str:
    metadata = pod["metadata"]
    token = reader.token(
        TokenRequest(
            metadata.get("namespace", "default"),
            pod["spec"].get("serviceAccountName") or "default",
            metadata["name"],
            metadata["uid"],
            expiration_seconds,
            (audience,) if audience else (),
        )
    )
    _write(directory, {path: token}, None)
    return token


def prepare(
    reader: ClusterReader,
    pod: Mapping[str, Any],
    pod_dir: Path,
    claims_dir: Path,
    pod_ip: str,
    host_ip: str,
) -> PodVolumes:
    """Create and fill every volume of the pod; ContainerConfigError when one cannot be."""
    namespace = pod["metadata"].get("namespace", "default")
    directories: dict[str, Path] = {}
    root = pod_dir / "volumes"
    for volume in pod["spec"].get("volumes") or []:
        name = volume["name"]
        directory = root / name
        if "persistentVolumeClaim" in volume:
            directory = claims_dir / namespace / volume["persistentVolumeClaim"]["claimName"]
            directory.mkdir(parents=True, exist_ok=True)
        elif "projected" in volume:
            directory.mkdir(parents=True, exist_ok=True)
            for source in volume["projected"].get("sources") or []:
                if "serviceAccountToken" in source:
                    token = source["serviceAccountToken"]
                    _token_files(
                        reader,
                        pod,
                        directory,
                        token["path"],
                        int(token.get("expirationSeconds", TOKEN_EXPIRATION_SECONDS)),
                        token.get("audience"),
                    )
                else:
                    _source_files(reader, pod, source, directory, pod_ip, host_ip)
        elif not _source_files(reader, pod, volume, directory, pod_ip, host_ip):
            if "emptyDir" not in volume:
                log.info("pod volume %s: %s runs as an empty directory", name, sorted(volume))
            directory.mkdir(parents=True, exist_ok=True)
        directories[name] = directory
    token_config: Path | None = None
    account = pod["spec"].get("serviceAccountName") or "default"
    if pod["spec"].get("automountServiceAccountToken", True) is not False:
        account_dir = root / SERVICE_ACCOUNT_VOLUME
        token = _token_files(reader, pod, account_dir)
        shutil.copyfile(reader.ca_cert, account_dir / "ca.crt")
        (account_dir / "namespace").write_text(namespace)
        directories.setdefault(SERVICE_ACCOUNT_VOLUME, account_dir)
        token_config = kubeconfig.write_kubeconfig(
            pod_dir / "kubeconfig",
            reader.server,
            account_dir / "ca.crt",
            token,
            f"system:serviceaccount:{namespace}:{account}",
            namespace,
        )
    return PodVolumes(directories, token_config)


def service_account_mount(container: Mapping[str, Any], volumes: PodVolumes) -> dict[str, Any]:
    """The container with the ServiceAccount volume mounted where pods find it (as the
    ServiceAccount admission plugin would add it), unless a mount is already there."""
    if SERVICE_ACCOUNT_VOLUME not in volumes.directories or volumes.kubeconfig is None:
        return dict(container)
    existing = container.get("volumeMounts") or []
    if any(m.get("mountPath") == SERVICE_ACCOUNT_MOUNT for m in existing):
        return dict(container)
    mount = {"name": SERVICE_ACCOUNT_VOLUME, "mountPath": SERVICE_ACCOUNT_MOUNT}
    return {**container, "volumeMounts": [*existing, mount]}
