"""Credentials on the peering ports: ZMQ CURVE with a key the router replicas share.

With ``--peer-key-file FILE`` every peering socket speaks CurveZMQ (RFC 26): the PUB socket
that publishes this router's routing decisions and the ROUTER socket that answers KV
snapshots are CURVE servers, and the SUB and REQ sockets that dial peers are CURVE clients.
Every replica derives one key pair from FILE's secret (`PeerKey.from_secret`: the CURVE
secret key is SHA-256 of a fixed label and the secret, the public key follows from it), and a
ZAP handler on each server context (`PeerGate`) admits a client only if it proved it holds
that same key pair. So a client without the secret completes no handshake: it reads no
routing decision, asks no snapshot, and a proxy in the pod that forwards the port gains
nothing. The traffic is encrypted as well. The operator creates the secret once per server
(a Secret ``<server>-router-peering``, `tpuserve_operator.render.router`) and mounts it.

Without FILE, peering has no credentials and is allowed only when ``--host`` is a loopback
address (every peer on this host: a local fleet, the tests); `peer_settings.peering_problems`
refuses it otherwise at start-up.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator
from zmq.utils import z85

log = logging.getLogger(__name__)

LABEL: Final = b"tpuserve-router-peering/1\0"
MIN_SECRET_BYTES: Final = 16
MAX_SECRET_BYTES: Final = 4096
ZAP_DOMAIN: Final = b"tpuserve-peering"


class PeerKeyError(ValueError):
    """The peer key file is unusable; the message names the file and what is allowed."""


@dataclass(frozen=True, slots=True)
class PeerKey:
    """The CURVE key pair every replica derives from the shared secret (Z85, 40 bytes)."""

    public: bytes
    secret: bytes

    @classmethod
    def from_secret(cls, secret: bytes) -> PeerKey:
        secret_key = z85.encode(hashlib.sha256(LABEL + secret).digest())
        return cls(zmq.curve_public(secret_key), secret_key)

    @classmethod
    def from_file(cls, path: str) -> PeerKey:
        """The key of ``path`` (its content, surrounding white space dropped)."""
        try:
            with open(path, "rb") as handle:
                data = handle.read(MAX_SECRET_BYTES + 1)
        except OSError as err:
            raise PeerKeyError(f"{path}: cannot be read: {err.strerror or err}") from None
        secret = data.strip()
        if not MIN_SECRET_BYTES <= len(secret) <= MAX_SECRET_BYTES:
            raise PeerKeyError(
                f"{path}: holds {len(secret)} bytes of secret; allowed: {MIN_SECRET_BYTES} to "
                f"{MAX_SECRET_BYTES} (e.g. head -c 32 /dev/urandom | base64)"
            )
        return cls.from_secret(secret)

    def serve(self, socket: zmq.Socket[Any]) -> None:
        """Make ``socket`` (before it binds) a CURVE server whose clients ZAP checks."""
        socket.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        socket.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
        socket.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        socket.setsockopt(zmq.CURVE_SERVER, 1)

    def dial(self, socket: zmq.Socket[Any]) -> None:
        """Make ``socket`` (before it connects) a CURVE client of a peer holding this key."""
        socket.setsockopt(zmq.CURVE_SERVERKEY, self.public)
        socket.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        socket.setsockopt(zmq.CURVE_SECRETKEY, self.secret)

    def callback(self, domain: str, client_key: bytes) -> bool:
        """ZAP's question (`zmq.auth` credentials provider): is this client one of ours?"""
        return hmac.compare_digest(client_key, self.public)


class PeerGate:
    """The ZAP handler of one ZMQ context: admits CURVE clients holding ``key``. Started
    before the context's server sockets bind, stopped after they close."""

    def __init__(self, context: zmq.asyncio.Context, key: PeerKey) -> None:
        self.key = key
        self._auth = AsyncioAuthenticator(context, log=log)

    def start(self) -> None:
        self._auth.start()
        self._auth.configure_curve_callback(
            domain=ZAP_DOMAIN.decode(), credentials_provider=self.key
        )

    def stop(self) -> None:
        self._auth.stop()


def load_key(path: str | None) -> PeerKey | None:
    return None if path is None else PeerKey.from_file(path)


def key_file_problem(path: str) -> str | None:
    """What is wrong with ``--peer-key-file``, or None."""
    if not Path(path).exists():
        return f"peer_key_file={path!r}: no such file"
    try:
        PeerKey.from_file(path)
    except PeerKeyError as err:
        return f"peer_key_file: {err}"
    return None
