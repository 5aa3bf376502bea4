"""The readiness probes of the local control plane's processes: plain HTTP, HTTPS (with the
cluster's CA, or unverified for a component's self-signed health port) and an open port, each
on loopback and bounded by a timeout."""

from __future__ import annotations

import socket
import ssl
import urllib.request
from pathlib import Path

from tpuserve.cluster.ports import LOOPBACK


def http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bool(response.status == 200)


def https_ok(url: str, *, ca_cert: Path | None, token: str | None = None) -> bool:
    """GET url over TLS; `ca_cert` None skips verification (self-signed health ports)."""
    if ca_cert is not None:
        context = ssl.create_default_context(cafile=str(ca_cert))
    else:  # component health ports use self-signed certs; loopback only
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, context=context, timeout=5) as response:
        return bool(response.status == 200)


def port_open(port: int) -> bool:
    with socket.create_connection((LOOPBACK, port), timeout=2):
        return True
