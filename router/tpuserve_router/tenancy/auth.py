"""Who may use the router: API keys for the data plane, roles for the admin API.

With ``--api-keys-file FILE`` (a Kubernetes Secret mounted as a file, say), every generation
request and ``/v1/models`` needs ``Authorization: Bearer KEY`` (or ``x-api-key: KEY``) naming
a key of FILE, else 401. FILE is JSON::

    {"keys": [
      {"key": "sk-...", "tenant": "acme", "priority": "high",
       "requests_per_minute": 600, "tokens_per_minute": 200000},
      {"key_sha256": "<64 hex digits>", "tenant": "ops", "admin": true}
    ]}

A key is given in clear (``key``) or as the hex SHA-256 of it (``key_sha256``, so the
Secret need not hold the key itself). Only SHA-256 digests are kept in memory; a presented
key is hashed and its digest looked up, then compared with `hmac.compare_digest` (constant
time). ``tenant`` names who the key belongs to (logs, the hold queues' fairness); metrics
never name it: they name a key by `key_id`, the first 12 hex digits of its SHA-256 (at most
`MAX_KEY_LABELS` keys get a label of their own, the rest ``other``), which says nothing of
the tenant and gives nothing of the key away; ``priority`` is its class
(`PRIORITIES`, default ``normal``) for overload shedding; the per-minute limits (absent:
unlimited) are enforced by `quotas`; ``admin: true`` lets the key use the admin API.

FILE is read again when it changes (checked every ``--api-keys-reload-seconds``): a Secret
update takes effect without a restart. A FILE that cannot be read or is invalid at start is
a start-up error; later, the keys in force stay and the problem is logged and counted.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from tpuserve_router.config import RouterConfig

log = logging.getLogger(__name__)

PRIORITIES: Final = ("critical", "high", "normal", "low")
"""Priority classes, most important first; shed in the reverse order (`quotas`)."""
DEFAULT_PRIORITY: Final = "normal"
OTHER_KEY: Final = "other"
MAX_KEY_LABELS: Final = 100
KEY_ID_HEX: Final = 12
MAX_KEYS_FILE_BYTES: Final = 4 * 1024 * 1024
_TENANT: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_HEX_SHA256: Final = re.compile(r"[0-9a-f]{64}")


class KeysFileError(ValueError):
    """The keys file is unusable; the message names the file, the entry and the field."""


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A key as the router keeps it: its digest and what it may do."""

    digest: bytes
    tenant: str
    label: str  # the key as metrics name it (`key_id`, or `OTHER_KEY`): never the tenant
    priority: str
    requests_per_minute: int | None
    tokens_per_minute: int | None
    admin: bool


_sha256 = hashlib.sha256


def digest_of(key: bytes) -> bytes:
    return _sha256(key).digest()


def key_id(digest: bytes) -> str:
    """A key as metrics name it: how its hex SHA-256 (a keys file's ``key_sha256``) begins,
    `KEY_ID_HEX` digits."""
    return digest.hex()[:KEY_ID_HEX]


def parse_keys(data: bytes, source: str) -> dict[bytes, ApiKey]:
    """The keys of a keys file's bytes, by digest; `KeysFileError` names every problem."""
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as err:
        raise KeysFileError(f"{source}: not JSON: {err}") from None
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise KeysFileError(f'{source}: expected {{"keys": [...]}}, a list of keys')
    problems: list[str] = []
    parsed: list[tuple[bytes, dict[str, Any]]] = []
    for index, entry in enumerate(entries):
        where = f"{source}: keys[{index}]"
        if not isinstance(entry, dict):
            problems.append(f"{where}: must be an object")
            continue
        unknown = set(entry) - _FIELDS
        if unknown:
            problems.append(
                f"{where}: unknown field(s) {', '.join(sorted(unknown))}; allowed: "
                f"{', '.join(sorted(_FIELDS))}"
            )
        digest = _entry_digest(entry, where, problems)
        tenant = entry.get("tenant")
        if not isinstance(tenant, str) or not _TENANT.fullmatch(tenant):
            problems.append(
                f"{where}.tenant: {tenant!r} is not allowed; allowed: 1-63 letters, digits, "
                "'.', '_' or '-', starting with a letter or digit"
            )
        priority = entry.get("priority", DEFAULT_PRIORITY)
        if priority not in PRIORITIES:
            problems.append(
                f"{where}.priority: {priority!r} is not allowed; allowed: {', '.join(PRIORITIES)}"
            )
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = entry.get(name)
            if value is not None and (type(value) is not int or value < 1):
                problems.append(
                    f"{where}.{name}: {value!r} is not allowed; allowed: an integer >= 1"
                )
        if not isinstance(entry.get("admin", False), bool):
            problems.append(
                f"{where}.admin: {entry['admin']!r} is not allowed; allowed: true or false"
            )
        if digest is not None:
            parsed.append((digest, entry))
    if problems:
        raise KeysFileError("; ".join(problems))
    labelled = set(sorted(digest for digest, _ in parsed)[:MAX_KEY_LABELS])
    keys: dict[bytes, ApiKey] = {}
    for digest, entry in parsed:
        if digest in keys:
            raise KeysFileError(
                f"{source}: the same key is listed twice (tenant {entry['tenant']})"
            )
        tenant = entry["tenant"]
        keys[digest] = ApiKey(
            digest=digest,
            tenant=tenant,
            label=key_id(digest) if digest in labelled else OTHER_KEY,
            priority=entry.get("priority", DEFAULT_PRIORITY),
            requests_per_minute=entry.get("requests_per_minute"),
            tokens_per_minute=entry.get("tokens_per_minute"),
            admin=entry.get("admin", False),
        )
    return keys


_FIELDS: Final = frozenset(
    {"key", "key_sha256", "tenant", "priority", "requests_per_minute", "tokens_per_minute",
     "admin"}
)  # fmt: skip


def _entry_digest(entry: Mapping[str, Any], where: str, problems: list[str]) -> bytes | None:
    key, hashed = entry.get("key"), entry.get("key_sha256")
    if (key is None) == (hashed is None):
        problems.append(f"{where}: exactly one of key and key_sha256 is required")
        return None
    if key is not None:
        if not isinstance(key, str) or len(key) < 16:
            problems.append(f"{where}.key: allowed: a string of at least 16 characters")
            return None
        return digest_of(key.encode())
    if not isinstance(hashed, str) or not _HEX_SHA256.fullmatch(hashed):
        problems.append(f"{where}.key_sha256: allowed: 64 lower-case hex digits")
        return None
    return bytes.fromhex(hashed)


class KeyStore:
    """The keys in force, read from ``path`` and read again when it changes."""

    def __init__(
        self,
        path: str,
        reload_seconds: float,
        on_reload: Callable[[str, Mapping[bytes, ApiKey]], None] = lambda result, keys: None,
    ) -> None:
        self.path = path
        self.reload_seconds = reload_seconds
        self.on_reload = on_reload  # ("ok" or "failed", the keys in force)
        self.keys: dict[bytes, ApiKey] = {}
        self._signature: tuple[int, int, int] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.load()

    def load(self) -> None:
        """Read the file (raises `KeysFileError` or OSError; the keys in force stay)."""
        target = Path(self.path)
        stat = target.stat()
        if stat.st_size > MAX_KEYS_FILE_BYTES:
            raise KeysFileError(f"{self.path}: larger than {MAX_KEYS_FILE_BYTES} bytes")
        self.keys = parse_keys(target.read_bytes(), self.path)
        self._signature = (stat.st_ino, stat.st_mtime_ns, stat.st_size)

    def authenticate(self, presented: bytes | None) -> ApiKey | None:
        """The key ``presented`` names, or None."""
        if not presented:
            return None
        digest = _sha256(presented).digest()
        found = self.keys.get(digest)
        if found is None or not hmac.compare_digest(found.digest, digest):
            return None
        return found

    # ------------------------------------------------------------------ reload

    def start(self) -> None:
        loop = asyncio.get_running_loop()

        def check() -> None:
            self.reload_if_changed()
            self._timer = loop.call_later(self.reload_seconds, check)

        self._timer = loop.call_later(self.reload_seconds, check)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def reload_if_changed(self) -> None:
        try:
            stat = os.stat(self.path)  # a Secret update swaps a symlink: follow it
            if (stat.st_ino, stat.st_mtime_ns, stat.st_size) == self._signature:
                return
            self.load()
        except (OSError, KeysFileError) as err:
            log.error("API keys not reloaded, the %d in force stay: %s", len(self.keys), err)
            self.on_reload("failed", self.keys)
            return
        log.info("API keys reloaded from %s: %d keys", self.path, len(self.keys))
        self.on_reload("ok", self.keys)


def presented_key(authorization: bytes | None, api_key: bytes | None) -> bytes | None:
    """The key of ``Authorization: Bearer KEY`` (OpenAI's clients), else of ``x-api-key``."""
    if authorization is not None:
        if authorization[:7] in (b"Bearer ", b"bearer "):  # the usual spelling, cheaply
            return authorization[7:].strip()
        scheme, _, value = authorization.strip().partition(b" ")
        if scheme.lower() == b"bearer":
            return value.strip()
    return api_key.strip() if api_key is not None else None


def api_keys_problems(config: RouterConfig) -> list[str]:
    """What is wrong with ``api_keys_file``: unreadable, not a keys file, or (with
    ``admin='keys'``) without a key that may use the admin API."""
    if config.api_keys_file is None:
        return []
    try:
        keys = KeyStore(config.api_keys_file, config.api_keys_reload_seconds).keys
    except (OSError, KeysFileError) as err:
        return [f"api_keys_file={config.api_keys_file!r}: {err}"]
    if config.admin == "keys" and not any(k.admin for k in keys.values()):
        return [
            f"admin='keys': api_keys_file {config.api_keys_file!r} has no key with "
            '"admin": true, so nobody could use the admin API'
        ]
    return []
