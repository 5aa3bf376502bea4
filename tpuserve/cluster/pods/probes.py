"""Container probes and lifecycle hooks, executed as the kubelet executes them.

httpGet (HTTP or HTTPS without verification, any 2xx or 3xx passes), tcpSocket (a
connection opens) and exec (exit code 0, run with the container's environment) are
supported; grpc is not, and counts as failing with a message saying so. An exec command is
read as inside the container: its paths under a mountPath and wildcard addresses are
localized, and `$(VAR)` expanded, like the container's own command. A named port is
looked up in the container's ports. The host is the pod's address (`host` may override it,
and is then used as given, as the kubelet does). Timing fields and thresholds have the
Kubernetes defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from tpuserve.cluster.pods.container_spec import ProcessSpec


@dataclass(frozen=True, slots=True)
class ProbeTiming:
    initial_delay_seconds: float = 0.0
    period_seconds: float = 10.0
    timeout_seconds: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3

    @classmethod
    def of(cls, probe: Mapping[str, Any]) -> ProbeTiming:
        return cls(
            float(probe.get("initialDelaySeconds", 0)),
            float(probe.get("periodSeconds", 10)),
            float(probe.get("timeoutSeconds", 1)),
            int(probe.get("successThreshold", 1)),
            int(probe.get("failureThreshold", 3)),
        )


def resolve_port(port: int | str, container: Mapping[str, Any]) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in container.get("ports") or []:
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ValueError(f"port {port!r} is not a port of container {container.get('name')!r}")


async def _http_get(
    handler: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str, timeout_seconds: float
) -> str | None:
    scheme = str(handler.get("scheme", "HTTP")).lower()
    host = handler.get("host") or pod_ip
    port = resolve_port(handler["port"], container)
    path = handler.get("path") or "/"
    if not path.startswith("/"):
        path = "/" + path
    headers = {h["name"]: h["value"] for h in handler.get("httpHeaders") or []}
    context: ssl.SSLContext | bool = False
    if scheme == "https":
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    url = f"{scheme}://{host}:{port}{path}"
    client_timeout = aiohttp.ClientTimeout(total=timeout_seconds)
    async with (
        aiohttp.ClientSession(timeout=client_timeout) as session,
        session.get(url, headers=headers, ssl=context, allow_redirects=False) as response,
    ):
        if 200 <= response.status < 400:
            return None
        return f"HTTP probe failed with statuscode: {response.status}"


async def _tcp(
    handler: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str, timeout_seconds: float
) -> str | None:
    host = handler.get("host") or pod_ip
    port = resolve_port(handler["port"], container)
    _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_seconds)
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return None


async def _exec(
    handler: Mapping[str, Any], process: ProcessSpec, timeout_seconds: float
) -> str | None:
    command = [process.localize(str(c)) for c in handler.get("command") or []]
    if not command:
        return "exec probe has no command"
    child = await asyncio.create_subprocess_exec(
        *command,
        env=process.env,
        cwd=process.cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(child.communicate(), timeout_seconds)
    except TimeoutError:
        child.kill()
        await child.wait()
        return f"command timed out after {timeout_seconds:g}s"
    if child.returncode == 0:
        return None
    return f"command exited {child.returncode}: {output.decode(errors='replace')[-200:]}"


async def run_handler(
    handler: Mapping[str, Any],
    container: Mapping[str, Any],
    pod_ip: str,
    process: ProcessSpec,
    timeout_seconds: float,
) -> str | None:
    """Run one probe or hook handler; None when it passes, else why it failed."""
    try:
        if "httpGet" in handler:
            return await _http_get(handler["httpGet"], container, pod_ip, timeout_seconds)
        if "tcpSocket" in handler:
            return await _tcp(handler["tcpSocket"], container, pod_ip, timeout_seconds)
        if "exec" in handler:
            return await _exec(handler["exec"], process, timeout_seconds)
        if "sleep" in handler:
            await asyncio.sleep(float(handler["sleep"]["seconds"]))
            return None
        return f"probe handler {sorted(handler)} is not supported by the pod runner"
    except (OSError, TimeoutError, aiohttp.ClientError, ValueError) as err:
        return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
