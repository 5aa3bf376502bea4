"""A container as a local process: its argv, environment and working directory.

Pure functions of the pod, the container, the pod's address and volume directories, and a
lookup for ConfigMaps and Secrets, following the kubelet's rules:

- argv: the image's entrypoint and arguments, replaced by `command` and `args`, with
  `$(VAR)` references expanded from the container's environment (`$$(VAR)` stays literal);
- environment: the image's, then `envFrom` (ConfigMaps and Secrets, with `prefix`), then `env`
  in order (`value` with `$(VAR)` expansion; `valueFrom` field, resource, ConfigMap and
  Secret references), then the local image's `overrides` (what stands in for a device this
  machine lacks, images.py; a `pvc://` model source of the image's launcher becomes the
  claim's directory); a missing reference that is not `optional` is the kubelet's
  CreateContainerConfigError;
- the ServiceAccount token is not at /var/run/secrets/... for a process on the host, so the
  container gets `KUBECONFIG`, a kubeconfig with the pod's token (the clients in tpuserve read
  it when there is no in-cluster account).

What stands in for the container's own namespaces (processes share the host's network and
file system): a wildcard address (`0.0.0.0`, `::`) in an argument or variable becomes the
pod's address, as binding the wildcard in a pod binds the pod's address; a path under a
volume's mountPath becomes the path under the volume's directory (the termination message's
`terminationMessagePath` becomes the container's file of it), and the working directory is the
pod's own directory. Processes run as the runner's user (securityContext is not
applied) and without resource limits.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_tpu.model_source import parse_model_source
from tpuserve.cluster.pods.images import LocalImage

KUBECONFIG_ENV = "KUBECONFIG"
# (kind, namespace, name) -> the object's data (Secrets decoded), or None when it is missing.
Lookup = Callable[[str, str, str], Mapping[str, str] | None]

_WILDCARD_IPV4 = re.compile(r"(?<![\d.])0\.0\.0\.0(?![\d.])")
_WILDCARD_IPV6 = ("::", "[::]")
# A unix socket's path has at most 107 bytes: a TMPDIR this long leaves room for the name of a
# socket in it (SGLang-JAX's ZMQ sockets are tempfile names there).
MAX_SOCKET_DIR_CHARS = 64
SHORT_LINK_DIR = "/tmp"
_VAR_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_PATH_START = re.compile(r"(^|[=:,])(/[^\s:,=]*)")


class ContainerConfigError(ValueError):
    """The container cannot start as configured (kubelet: CreateContainerConfigError)."""


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    pod_ip: str = ""
    mount_points: tuple[tuple[str, Path], ...] = ()
    hosts_file: Path | None = None  # seen as /etc/hosts by the process (dns.py)

    def localize(self, text: str) -> str:
        """`text` as the container would mean it (an exec probe's or hook's command)."""
        return expand(localize(text, self.pod_ip, self.mount_points), self.env)


@dataclass(frozen=True, slots=True)
class PodContext:
    """What a container's process is built from, besides the container itself."""

    pod: Mapping[str, Any]
    pod_ip: str
    host_ip: str
    pod_dir: Path
    volumes: Mapping[str, Path]  # volume name -> its directory on the host
    kubeconfig: Path | None  # the pod's ServiceAccount kubeconfig, when a token is mounted
    base_env: Mapping[str, str]  # what every process gets from the runner (PYTHONPATH, ...)
    hosts_file: Path | None = None  # the runner's stand-in for cluster DNS (dns.py)

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"].get("namespace", "default"))


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined names are replaced, `$$` is a literal `$`."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VAR_REFERENCE.sub(replace, text)


def mounts(container: Mapping[str, Any], volumes: Mapping[str, Path]) -> list[tuple[str, Path]]:
    """(mountPath, host directory) of the container's volume mounts, longest path first."""
    found = []
    for mount in container.get("volumeMounts") or []:
        directory = volumes.get(mount["name"])
        if directory is None:
            raise ContainerConfigError(f"volume {mount['name']!r} is not defined in the pod")
        sub_path = mount.get("subPath")
        found.append((mount["mountPath"].rstrip("/") or "/", directory / (sub_path or "")))
    return sorted(found, key=lambda m: len(m[0]), reverse=True)


def localize(text: str, pod_ip: str, mount_points: Sequence[tuple[str, Path]]) -> str:
    """The wildcard address as the pod's, paths under a mountPath under its directory."""
    if text in _WILDCARD_IPV6:
        return pod_ip
    text = _WILDCARD_IPV4.sub(pod_ip, text)

    def path(match: re.Match[str]) -> str:
        value = match.group(2)
        for mount_path, directory in mount_points:
            if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                rest = value[len(mount_path) :].lstrip("/")
                return match.group(1) + str(directory / rest if rest else directory)
        return match.group(0)

    return _PATH_START.sub(path, text)


def field_value(pod: Mapping[str, Any], field_path: str, pod_ip: str, host_ip: str) -> str:
    """A downward-API `fieldRef` value."""
    metadata = pod["metadata"]
    simple = {
        "metadata.name": metadata.get("name", ""),
        "metadata.namespace": metadata.get("namespace", "default"),
        "metadata.uid": metadata.get("uid", ""),
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if field_path in simple:
        return str(simple[field_path])
    keyed = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", field_path)
    if keyed:
        return str((metadata.get(keyed.group(1)) or {}).get(keyed.group(2), ""))
    raise ContainerConfigError(f"fieldRef {field_path!r} is not supported")


def resource_value(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    """A `resourceFieldRef` value: the container's limit (or request), as written."""
    section, _, name = str(ref["resource"]).partition(".")
    resources = container.get("resources") or {}
    value = (resources.get(section) or {}).get(name) or (resources.get("requests") or {}).get(name)
    return str(value) if value is not None else "0"


def _referenced(
    lookup: Lookup, kind: str, namespace: str, ref: Mapping[str, Any], key: str | None
) -> str | None:
    data = lookup(kind, namespace, ref["name"])
    optional = bool(ref.get("optional"))
    what = "configmap" if kind == "ConfigMap" else "secret"
    if data is None:
        if optional:
            return None
        raise ContainerConfigError(f'{what} "{ref["name"]}" not found')
    if key is None:
        return ""
    if key not in data:
        if optional:
            return None
        raise ContainerConfigError(f"couldn't find key {key} in {kind} {namespace}/{ref['name']}")
    return data[key]


def environment(
    ctx: PodContext,
    container: Mapping[str, Any],
    image: LocalImage,
    lookup: Lookup,
    mount_points: Sequence[tuple[str, Path]] = (),
) -> dict[str, str]:
    """The container's environment. Values from the image and the pod are localized as they
    are defined (before `$(VAR)` expansion); the runner's own (PATH, KUBECONFIG, ...) are not."""

    def local(value: str) -> str:
        return localize(value, ctx.pod_ip, mount_points)

    env: dict[str, str] = {"PATH": ":".join(image.path)}
    env.update({k: local(v) for k, v in image.env.items()})
    env.update(ctx.base_env)
    if ctx.kubeconfig is not None:
        env[KUBECONFIG_ENV] = str(ctx.kubeconfig)
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            ref = source.get(key)
            if ref is None:
                continue
            if _referenced(lookup, kind, ctx.namespace, ref, None) is None:
                continue
            data = lookup(kind, ctx.namespace, ref["name"]) or {}
            env.update({prefix + k: local(v) for k, v in data.items()})
    for entry in container.get("env") or []:
        name = entry["name"]
        if "valueFrom" not in entry:
            env[name] = expand(local(str(entry.get("value", ""))), env)
            continue
        source = entry["valueFrom"]
        value: str | None
        if "fieldRef" in source:
            value = field_value(ctx.pod, source["fieldRef"]["fieldPath"], ctx.pod_ip, ctx.host_ip)
        elif "resourceFieldRef" in source:
            value = resource_value(container, source["resourceFieldRef"])
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            value = _referenced(lookup, "ConfigMap", ctx.namespace, ref, ref["key"])
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = _referenced(lookup, "Secret", ctx.namespace, ref, ref["key"])
        else:
            raise ContainerConfigError(f"env {name}: valueFrom {sorted(source)} is not supported")
        if value is not None:
            env[name] = local(value)
    env.update({k: local(v) for k, v in image.overrides.items()})
    for name in image.model_sources:
        value = env.get(name, "")
        if value.startswith("pvc://"):
            env[name] = local(parse_model_source(value).local_path(None, None))
    return env


def pod_link(pod_dir: Path) -> Path:
    """A short name for a pod's directory (a symbolic link in /tmp, made by `short_path`)."""
    digest = hashlib.sha256(str(pod_dir).encode()).hexdigest()[:16]
    return Path(SHORT_LINK_DIR) / f"tpuserve-pod-{digest}"


def short_path(directory: Path, pod_dir: Path) -> Path:
    """`directory`, or when its name is too long for unix sockets in it (108 bytes with the
    socket's name; a pod's /tmp under a deep run directory is), the same directory through
    `pod_link(pod_dir)`, as a container's short /tmp is. The pod runner removes the link."""
    if len(str(directory)) <= MAX_SOCKET_DIR_CHARS or not directory.is_relative_to(pod_dir):
        return directory
    link = pod_link(pod_dir)
    if not link.is_symlink():
        pod_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # another container of the pod made it
            link.symlink_to(pod_dir, target_is_directory=True)
    return link / directory.relative_to(pod_dir)


def process_spec(
    ctx: PodContext,
    container: Mapping[str, Any],
    image: LocalImage,
    lookup: Lookup,
    files: Sequence[tuple[str, Path]] = (),
) -> ProcessSpec:
    """The process that runs `container`: argv, environment and working directory. `files`
    are single files the kubelet mounts (the termination message's), as (path, host file)."""
    mount_points = sorted(
        [*mounts(container, ctx.volumes), *files], key=lambda m: len(m[0]), reverse=True
    )
    env = environment(ctx, container, image, lookup, mount_points)
    tmp = next((d for p, d in mount_points if p == "/tmp"), None)
    env.setdefault("TMPDIR", str(ctx.pod_dir if tmp is None else short_path(tmp, ctx.pod_dir)))
    argv = [
        expand(localize(a, ctx.pod_ip, mount_points), env)
        for a in image.argv(container.get("command"), container.get("args"))
    ]
    if not argv:
        raise ContainerConfigError("no command: the image has no entrypoint and none is given")
    program = image.resolve(argv[0])
    if program is None:
        raise ContainerConfigError(
            f'exec: "{argv[0]}": executable file not found in $PATH ({env["PATH"]})'
        )
    working_dir = container.get("workingDir")
    cwd = Path(localize(working_dir, ctx.pod_ip, mount_points)) if working_dir else ctx.pod_dir
    cwd.mkdir(parents=True, exist_ok=True)
    return ProcessSpec(
        [program, *argv[1:]], env, cwd, ctx.pod_ip, tuple(mount_points), ctx.hosts_file
    )
