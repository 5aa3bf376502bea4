"""The worker registry: each engine leader the router forwards to, its load and its health.

A `Worker` is routable (``healthy``) when its active health checks pass and it is not
ejected as an outlier. Both feed one attribute, recomputed only on transitions, so policies
read a plain field on the hot path.

- Active health: ``health_failure_threshold`` consecutive failed checks eject a worker;
  ``health_success_threshold`` consecutive passing checks re-admit it.
- Outlier ejection (passive, from real requests): `tpuserve_router.engines.outliers` keeps its
  counters on the worker and ejects it for a while. A passing check ends an ejection only
  if a check failed since it began: the worker was down and is back (restarted); a worker
  whose checks pass while its requests fail stays out.

``in_flight`` counts requests the router sent to a worker that have not ended; the proxy
increments it right after a decision and decrements it in a ``finally``, so its own part
returns to zero on every exit path (success, upstream error, client cancel, timeout). With
the engine load poll and peering it also holds ``peer_in_flight``, what other router replicas
sent there (their announcements, ``announced_in_flight``, plus the polled rest:
`tpuserve_router.engines.load_view`); ``own_in_flight`` is the rest.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

from sglang_tpu.lora import split_model
from tpuserve_router.config import MAX_UNIX_PATH_BYTES
from tpuserve_router.engines.engine_types import ADAPTERS


class InvalidWorkerURL(ValueError):
    """A worker URL the router cannot dial; the message names the value and the format."""


@dataclass(frozen=True)
class WorkerSpec:
    """A worker as discovery or the admin API describes it.

    ``model`` is the served model it belongs to when the one who registered it says so
    (``--worker MODEL=URL``, the admin API, a pod's ``model`` label); otherwise the router
    learns it from the worker's ``/v1/models``.
    """

    url: str
    kv_events_endpoint: str | None = None
    kv_replay_endpoint: str | None = None
    model: str | None = None
    role: str | None = None
    """PD role: ``prefill`` or ``decode`` (`tpuserve_router.pipeline.selection`); None: a
    colocated engine."""
    bootstrap_port: int | None = None
    """A prefill engine's bootstrap port (SGLang's ``--disaggregation-bootstrap-port``)."""
    pd_contract: str | None = None
    """What a PD worker must share with the other leg to pair (the operator's
    ``serving.tpuserve.dev/pd-contract`` label); None: pairs with any."""


def parse_worker_flag(text: str) -> WorkerSpec:
    """A ``--worker`` value: ``URL`` or ``MODEL=URL`` (a URL holds no ``=``: no query is
    allowed). Raises `InvalidWorkerURL` naming the value and the forms allowed."""
    model, sep, url = text.rpartition("=")
    normalize_worker_url(url, allow_unix=True)
    if not sep:
        return WorkerSpec(url)
    problem = model_name_problem(model)
    if problem:
        raise InvalidWorkerURL(f"worker {text!r}: {problem}; expected URL or MODEL=URL")
    return WorkerSpec(url, model=model)


MAX_MODEL_CHARS = 256


def model_name_problem(name: object) -> str | None:
    """What is wrong with a served model name given to the router, or None."""
    if not isinstance(name, str):
        return f"model must be a string, got {type(name).__name__}"
    if not name or name != name.strip() or len(name) > MAX_MODEL_CHARS:
        return (
            f"model {name[:60]!r}: must be 1 to {MAX_MODEL_CHARS} characters "
            "without leading or trailing spaces"
        )
    if not name.isprintable():
        return f"model {name[:60]!r}: must be printable characters"
    return None


def normalize_worker_url(url: str, *, allow_unix: bool = False) -> tuple[str, str, int]:
    """``(name, host, port)`` of a worker URL; the name is ``http://host:port``.

    Plain ``http://host[:port]`` is accepted (the router speaks HTTP/1.1 to its workers
    over pooled raw connections); the port defaults to 80. The host is made canonical
    (`canonical_host`), so the aliases of one address name one worker. A ``unix:PATH``
    address (`unix_socket_path`), where ``allow_unix`` says so, is a worker on a unix socket
    of this host: its name is ``unix:PATH``, its host the socket's path (a host name never
    begins with ``/``), its port 0. Elsewhere (PD legs, a snapshot peer) it is refused.
    """
    text = url.strip()
    if text.startswith(UNIX_PREFIX):
        if not allow_unix:
            raise InvalidWorkerURL(
                f"worker url {url[:80]!r}: a unix socket is not allowed here (only as the "
                "router's --worker); expected http://HOST:PORT"
            )
        path = unix_socket_path(text, "worker url")
        return UNIX_PREFIX + path, path, 0
    expected = "expected http://HOST:PORT" + (" or unix:/PATH" if allow_unix else "")
    if len(text) > MAX_URL_CHARS:
        raise InvalidWorkerURL(
            f"worker url {url[:60]!r}...: longer than {MAX_URL_CHARS} characters; {expected}"
        )
    try:
        parts = urlsplit(text if "://" in text else f"http://{text}")
        port = parts.port
    except ValueError as err:
        raise InvalidWorkerURL(f"worker url {url!r}: {err}; {expected}") from None
    if parts.scheme != "http":
        raise InvalidWorkerURL(
            f"worker url {url!r}: scheme {parts.scheme!r} is not supported; {expected}"
        )
    if parts.username is not None or parts.password is not None:
        raise InvalidWorkerURL(f"worker url {url!r}: credentials are not allowed; {expected}")
    if not parts.hostname:
        raise InvalidWorkerURL(f"worker url {url!r}: no host; {expected}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InvalidWorkerURL(f"worker url {url!r}: a path or query is not allowed; {expected}")
    if port == 0:
        raise InvalidWorkerURL(f"worker url {url!r}: port 0 is not allowed; {expected}")
    host = canonical_host(parts.hostname, url)
    port = port or 80
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}", host, port


MAX_URL_CHARS = 2048
UNIX_PREFIX: Final = "unix:"


def unix_socket_path(text: str, what: str) -> str:
    """The socket path of a ``unix:PATH`` address (``unix:///PATH`` too), made canonical
    (`os.path.normpath`): absolute, at most `MAX_UNIX_PATH_BYTES` bytes, no NUL, no query.
    Raises `InvalidWorkerURL` naming ``what``, the value and the form allowed."""
    expected = "expected unix:/ABSOLUTE/PATH (a unix socket on this host)"
    path = text.strip().removeprefix(UNIX_PREFIX)
    if not path.startswith("/"):
        raise InvalidWorkerURL(f"{what} {text[:80]!r}: the path is not absolute; {expected}")
    if "\x00" in path or "?" in path or "#" in path or not path.isprintable():
        raise InvalidWorkerURL(
            f"{what} {text[:80]!r}: NUL, '?', '#' and unprintable characters are not allowed; "
            f"{expected}"
        )
    path = os.path.normpath(path)
    if path.startswith("//"):  # POSIX keeps two leading slashes; one is the same file
        path = path[1:]
    if path == "/" or len(path.encode()) > MAX_UNIX_PATH_BYTES:
        raise InvalidWorkerURL(
            f"{what} {text[:80]!r}: a socket path of 1 to {MAX_UNIX_PATH_BYTES} bytes is "
            f"needed (the kernel's limit); {expected}"
        )
    return path


def is_unix_host(host: str) -> bool:
    """Whether a worker's ``host`` is a unix socket's path (`normalize_worker_url`)."""
    return host.startswith("/")


def network_host(host: str) -> str:
    """The address of a worker's host on the network: a ``unix:`` worker is on this host, so
    what it binds on every interface (a KV-event endpoint ``tcp://*:5557``) is at loopback."""
    return "127.0.0.1" if is_unix_host(host) else host


_NUMERIC = re.compile(r"[0-9][0-9a-fx.]*")  # what inet_aton may read as an IPv4 address
_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")


def canonical_host(host: str, url: str = "") -> str:
    """One spelling per address: lower case, no trailing dot; IPv4 in dotted quads whatever
    form inet_aton reads (``0x7f000001``, ``127.1``, ``2130706433``); IPv6 compressed, and an
    IPv4-mapped one as its IPv4; ``localhost`` (RFC 6761: always loopback) as ``127.0.0.1``.
    Anything else must be a DNS name. Raises `InvalidWorkerURL` naming ``url``."""
    name = host.lower().rstrip(".")
    if ":" in name:
        try:
            address = ipaddress.IPv6Address(name)
        except ValueError:
            raise InvalidWorkerURL(f"worker url {url!r}: {host!r} is not an IPv6 address") from None
        mapped = address.ipv4_mapped
        return str(mapped) if mapped is not None else str(address)
    if name == "localhost" or name.endswith(".localhost"):
        return "127.0.0.1"
    if _NUMERIC.fullmatch(name):
        try:
            return socket.inet_ntoa(socket.inet_aton(name))
        except OSError:
            pass  # perhaps a name such as 1a.example (all hex): checked below
    labels = name.split(".")
    if (
        not name
        or len(name) > 253
        or not all(_LABEL.fullmatch(label) for label in labels)
        or labels[-1].isdigit()
    ):
        raise InvalidWorkerURL(
            f"worker url {url!r}: {host!r} is not an IP address or a host name "
            "(letters, digits, '-' and '_' in dot-separated labels of at most 63)"
        )
    return name


class Worker:
    """One engine leader. ``name`` (its URL) is also its metric label."""

    __slots__ = (
        "adapters",
        "announced_in_flight",
        "answered_at",
        "bootstrap_port",
        "consecutive_failures",
        "context_tokens",
        "ejected",
        "ejected_until",
        "ejections",
        "engine_load",
        "engine_type",
        "health_failures",
        "health_ok",
        "health_successes",
        "healthy",
        "host",
        "in_flight",
        "kv_events_endpoint",
        "kv_replay_endpoint",
        "manual",
        "model",
        "models",
        "name",
        "pd_contract",
        "peer_in_flight",
        "peer_prefill_tokens",
        "pool",
        "port",
        "probe_failed_at",
        "probe_failed_while_ejected",
        "probe_passed_at",
        "returned_at",
        "role",
        "stats",
        "window_failures",
        "window_requests",
    )

    def __init__(self, spec: WorkerSpec, *, manual: bool = False) -> None:
        self.name, self.host, self.port = normalize_worker_url(spec.url, allow_unix=True)
        self.kv_events_endpoint = spec.kv_events_endpoint
        self.kv_replay_endpoint = spec.kv_replay_endpoint
        self.manual = manual
        self.in_flight = 0
        self.peer_in_flight = 0  # part of in_flight other router replicas sent (load_view)
        self.announced_in_flight = 0  # part of peer_in_flight the peers announced (peering)
        self.peer_prefill_tokens = 0
        self.health_ok = False  # routable once the first health check passes
        self.health_failures = 0
        self.health_successes = 0
        self.probe_passed_at = 0.0  # time.monotonic() of its last passing health check
        self.probe_failed_at = 0.0  # and of its last failing one
        self.answered_at = 0.0  # time.monotonic() of the last answer's head it sent (relay)
        self.ejected = False  # as an outlier (see tpuserve_router.engines.outliers)
        self.probe_failed_while_ejected = False
        self.ejected_until = 0.0
        self.ejections = 0
        self.returned_at = 0.0
        self.consecutive_failures = 0
        self.window_requests = 0
        self.window_failures = 0
        self.healthy = False
        self.model = spec.model  # as registered; None: learned from the worker
        self.models: tuple[str, ...] = (spec.model,) if spec.model else ()
        self.adapters: tuple[str, ...] = ()  # LoRA adapters loaded (its /v1/models)
        self.context_tokens: int | None = None  # its model's max_model_len (its /v1/models)
        self.pool: Any = None  # the proxy's connection pool, attached by the app
        self.stats: Any = None  # the app's cached metric children
        self.role = spec.role
        self.bootstrap_port = spec.bootstrap_port
        self.pd_contract = spec.pd_contract
        self.engine_type = "auto"  # its engine adapter's name once the load poll knows it
        self.engine_load: Any = None  # its engine's last polled load (`engine_types.EngineLoad`)

    @property
    def own_in_flight(self) -> int:
        """Requests this router sent to the worker that have not ended."""
        return self.in_flight - self.peer_in_flight

    def __repr__(self) -> str:
        return f"Worker({self.name}, healthy={self.healthy}, in_flight={self.in_flight})"

    # ------------------------------------------------------------------ active health

    def health_check_passed(self, success_threshold: int) -> bool:
        """Record a passing check; True if this re-admitted the worker."""
        self.probe_passed_at = time.monotonic()
        self.health_failures = 0
        self.health_successes += 1
        was = self.healthy
        if not self.health_ok and self.health_successes >= success_threshold:
            self.health_ok = True
        if self.ejected and self.probe_failed_while_ejected:  # down, and back
            self.ejected = self.probe_failed_while_ejected = False
            self.consecutive_failures = 0
        self._update()
        return self.healthy and not was

    def health_check_failed(self, failure_threshold: int) -> bool:
        """Record a failed check; True if this ejected the worker."""
        self.probe_failed_at = time.monotonic()
        self.health_successes = 0
        self.health_failures += 1
        if self.ejected:
            self.probe_failed_while_ejected = True
        was = self.healthy
        if self.health_ok and self.health_failures >= failure_threshold:
            self.health_ok = False
        self._update()
        return was and not self.healthy

    # ------------------------------------------------------------------ outlier ejection

    def set_ejected(self, ejected: bool) -> None:
        self.ejected = ejected
        self.probe_failed_while_ejected = False
        self._update()

    def _update(self) -> None:
        self.healthy = self.health_ok and not self.ejected

    def describe(self) -> dict[str, Any]:
        """The worker as ``GET /workers`` shows it."""
        return {
            "url": self.name,
            "healthy": self.healthy,
            "health_check_ok": self.health_ok,
            "ejected": self.ejected,
            "ejections": self.ejections,
            "consecutive_failures": self.consecutive_failures,
            "in_flight": self.own_in_flight,
            "peer_in_flight": self.peer_in_flight,
            "announced_in_flight": self.announced_in_flight,
            "peer_prefill_tokens": self.peer_prefill_tokens,
            "models": list(self.models),
            "adapters": list(self.adapters),
            "kv_events_endpoint": self.kv_events_endpoint,
            "kv_replay_endpoint": self.kv_replay_endpoint,
            "source": "admin" if self.manual else "discovery",
            **self._engine(),
        }

    def _engine(self) -> dict[str, Any]:
        """Which engine the router takes it for and what it knows of its load and cache."""
        load = self.engine_load
        engine = ADAPTERS.get(self.engine_type)
        return {
            "engine_type": self.engine_type,
            "prefix_routing": engine.prefix_routing if engine is not None else None,
            "engine_load": None if load is None else {
                "running": load.running, "waiting": load.waiting, "kv_usage": load.kv_usage,
                "waiting_uncached_tokens": load.waiting_uncached_tokens,
                "host_tier_tokens": load.host_tier_tokens,
            },
        }  # fmt: skip


Listener = Callable[["WorkerRegistry"], None]


@dataclass(frozen=True, slots=True)
class ModelRoute:
    """Where a request goes: its served model (the metric label; ``""`` when it names none
    or the workers' models are not known yet), the LoRA adapter it names, and the workers
    that may take it."""

    model: str
    adapter: str | None
    workers: list[Worker]


@dataclass
class WorkerRegistry:
    """The known workers, in a stable order, with per-model views rebuilt on changes."""

    workers: list[Worker] = field(default_factory=list)
    by_model: dict[str, list[Worker]] = field(default_factory=dict)
    on_added: list[Callable[[Worker], None]] = field(default_factory=list)
    on_removed: list[Callable[[Worker], None]] = field(default_factory=list)
    on_changed: list[Listener] = field(default_factory=list)
    _unknown_models: list[Worker] = field(default_factory=list)

    def get(self, name: str) -> Worker | None:
        for worker in self.workers:
            if worker.name == name:
                return worker
        return None

    def names(self) -> list[str]:
        return [w.name for w in self.workers]

    def add(self, spec: WorkerSpec, *, manual: bool = False) -> Worker:
        """Add a worker, or update the endpoints of the one with the same URL."""
        worker = Worker(spec, manual=manual)
        existing = self.get(worker.name)
        if existing is not None:
            if (
                existing.kv_events_endpoint, existing.kv_replay_endpoint, existing.model,
                existing.role, existing.bootstrap_port, existing.pd_contract,
            ) != (
                spec.kv_events_endpoint, spec.kv_replay_endpoint, spec.model, spec.role,
                spec.bootstrap_port, spec.pd_contract,
            ):  # fmt: skip
                self._remove(existing)
            else:
                existing.manual = existing.manual and manual
                return existing
        self.workers.append(worker)
        for added in self.on_added:
            added(worker)
        self._changed()
        return worker

    def remove(self, name: str) -> Worker | None:
        worker = self.get(name)
        if worker is not None:
            self._remove(worker)
            self._changed()
        return worker

    def sync(self, specs: Iterable[WorkerSpec]) -> tuple[list[str], list[str]]:
        """Make the discovered workers exactly ``specs`` (admin-added ones stay).

        Returns the names added and removed.
        """
        wanted = {normalize_worker_url(s.url, allow_unix=True)[0]: s for s in specs}
        removed = [w.name for w in list(self.workers) if not w.manual and w.name not in wanted]
        for name in removed:
            self.remove(name)
        added = []
        for name, spec in wanted.items():
            before = self.get(name)
            worker = self.add(spec)
            if worker is not before:
                added.append(name)
        return added, removed

    def set_models(
        self, worker: Worker, models: Iterable[str], adapters: Iterable[str] = ()
    ) -> None:
        """What ``worker`` reported serving: its models (a registered model overrides them)
        and its loaded LoRA adapters."""
        served = (worker.model,) if worker.model else tuple(sorted(set(models)))
        loaded = tuple(sorted(set(adapters)))
        if (served, loaded) != (worker.models, worker.adapters):
            worker.models, worker.adapters = served, loaded
            self._changed()

    def route(self, requested: str, lora_path: str | None = None) -> ModelRoute | None:
        """Where a request naming model ``requested`` (``""``: none) and ``lora_path`` goes;
        None if no worker serves it.

        ``base:adapter`` names a LoRA adapter of ``base``, read as SGLang reads it
        (`split_model`); an adapter in the model name wins over ``lora_path``, as in SGLang.
        An adapter's workers are those of its model that list it loaded. A worker whose
        models are not known yet may serve any model and adapter.
        """
        workers: list[Worker] | None
        if not requested:
            base, adapter, workers = "", lora_path, self.workers
        else:
            base, adapter = self.split_model(requested)
            adapter = adapter or lora_path
            workers = self.by_model.get(base)
            if workers is None:
                if not self._unknown_models:
                    return None
                base, workers = "", self._unknown_models
        if adapter:
            workers = [w for w in workers if adapter in w.adapters or not w.models]
            if not workers:
                return None
        return ModelRoute(base, adapter or None, workers)

    def split_model(self, requested: str) -> tuple[str, str | None]:
        """``(model, adapter)`` of a requested name, as SGLang splits it (`split_model`)."""
        if ":" not in requested:  # no adapter named: the common case, without the call
            return requested, None
        return split_model(requested, self.by_model)

    def known_models(self) -> list[str]:
        """Model names the workers serve (registered or reported)."""
        return sorted(self.by_model)

    def adapters_of(self, model: str) -> list[str]:
        """The LoRA adapters some worker of ``model`` has loaded."""
        return sorted({a for w in self.by_model.get(model, ()) for a in w.adapters})

    def served(self) -> list[tuple[str, str]]:
        """Every name a request may give, with its model: each model, then ``model:adapter``
        for each of its loaded adapters."""
        return [
            (name, model)
            for model in self.known_models()
            for name in (model, *(f"{model}:{a}" for a in self.adapters_of(model)))
        ]

    def healthy_count(self) -> int:
        return sum(1 for w in self.workers if w.healthy)

    def _remove(self, worker: Worker) -> None:
        self.workers.remove(worker)
        for removed in self.on_removed:
            removed(worker)

    def _changed(self) -> None:
        models = {m for w in self.workers for m in w.models}
        self.by_model = {
            m: [w for w in self.workers if m in w.models or not w.models] for m in sorted(models)
        }
        self._unknown_models = [w for w in self.workers if not w.models]
        for listener in self.on_changed:
            listener(self)
