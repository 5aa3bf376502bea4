"""The routing-policy interface, the registry of policies by name, and `NoHealthyWorker`.

A policy is a plain object the router (and the routing benchmark, in-process on a virtual
clock) calls once per request: ``choose(request, workers) -> Decision``. Policies do no
I/O and never read the wall clock themselves: time comes from an injected ``clock``
and randomness from an injected seed, so a benchmark can replay them deterministically.

Hooks with no-op defaults (`PolicyDefaults`) tell a policy what happened afterwards:
``on_prefill_done`` when the first byte of the answer came back (prefill is over),
``on_request_done`` when the request finished (success or not),
``on_workers_changed`` when workers joined or left, and ``on_worker_reset`` when a
worker's cache was emptied through the router. A caller must call
``on_request_done`` exactly once for every decision it acted on.

Optional capabilities are part of the interface too, with defaults: ``block_index`` (the
index a policy routes on, which KV events feed; None for the others) and ``index_sizes()``
(what the ``tpuserve_router_prefix_index_size`` gauge shows).
"""

from __future__ import annotations

import dataclasses
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Generic,
    Protocol,
    TypeVar,
    runtime_checkable,
)

from tpuserve_router.labels import OUTCOMES as OUTCOMES
from tpuserve_router.labels import Outcome as Outcome

if TYPE_CHECKING:
    from tpuserve_router.kv.block_index import BlockIndex

Clock = Callable[[], float]
"""Seconds on a monotonic clock (``time.monotonic`` live, a virtual clock in benchmarks)."""

"""Why a worker was chosen: it holds the prefix (`prefix_hit`); no worker held enough of it
(`miss`); one did but load imbalance sent the request elsewhere (`balanced_away`); the policy
does not look at prefixes (`load_only`)."""


class WorkerView(Protocol):
    """What a policy may read about a worker (the router's `Worker` and test fakes conform)."""

    @property
    def name(self) -> str:
        """The worker's base URL; unique, stable, used as the metric label."""
        ...

    @property
    def healthy(self) -> bool:
        """Routable: passing health checks and not ejected as an outlier."""
        ...

    @property
    def in_flight(self) -> int:
        """Requests in flight at this worker as this router sees them: those it sent that
        have not finished, plus those other router replicas sent as of the last load poll
        (`tpuserve_router.engines.load_view`)."""
        ...

    @property
    def peer_prefill_tokens(self) -> int:
        """Prompt tokens waiting for prefill at this worker that other router replicas (or
        clients) sent, as of the last load poll; 0 without one."""
        ...


W = TypeVar("W", bound=WorkerView)


@dataclass(slots=True)
class RouteRequest:
    """What a policy sees of one request.

    ``text`` is the routing text (the prompt, or the chat messages flattened) for
    character-level policies; ``token_ids`` are the prompt's token ids as the engine will
    see them (chat template applied), filled by the router only for policies with
    ``needs_tokens``.
    """

    model: str = ""
    text: str = ""
    token_ids: Sequence[int] | None = None


@dataclass(slots=True)
class Decision(Generic[W]):
    """The chosen worker and why; handed back to the policy's hooks afterwards."""

    worker: W
    outcome: Outcome
    predicted_match_ratio: float | None = None
    """Share of the prompt the policy expects the worker to have cached (None: not predicted)."""
    prompt_units: int = 0
    """Prompt length in the policy's units (characters or tokens)."""
    pending_units: int = 0
    """Work the policy booked on the worker for this request (released by its hooks)."""
    block_keys: Sequence[int] = ()
    """The prompt's block keys the policy predicted on the worker (a `BlockIndex` policy's;
    what router replicas tell their peers, `peer_view`)."""
    predicted_host_ratio: float = 0.0
    """Of `predicted_match_ratio`, the share the worker holds only in host memory (its KV
    events' medium; loaded back before prefill)."""
    hbm_tokens: int = 0
    """KV tokens the policy counted as held in the worker's HBM while the request runs
    (`precise`'s `HbmRoom`; released by its hooks)."""


class NoHealthyWorker(Exception):
    """No routable worker can take the request (callers answer 503 with Retry-After)."""

    def __init__(self, model: str = "") -> None:
        self.model = model
        detail = f" for model {model!r}" if model else ""
        super().__init__(f"no healthy worker{detail}")


class PolicyConfigError(ValueError):
    """A policy name or parameter is invalid; the message names it and what is allowed."""


@runtime_checkable
class Policy(Protocol):
    """One routing policy. ``name`` is the CLI value and the `policy` metric label."""

    name: ClassVar[str]
    needs_text: ClassVar[bool]
    needs_tokens: ClassVar[bool]
    uses_kv_events: ClassVar[bool]
    """The policy's index is fed by the workers' KV events, so the router subscribes to them
    unless told otherwise (``--kv-events`` unset)."""

    def choose(self, request: RouteRequest, workers: Sequence[W]) -> Decision[W]:
        """Pick a healthy worker; raise `NoHealthyWorker` when none is healthy."""
        ...

    def on_prefill_done(self, decision: Decision[Any]) -> None:
        """The first byte of the answer arrived (the worker finished the prefill)."""
        ...

    def on_request_done(self, decision: Decision[Any], succeeded: bool) -> None:
        """The request ended, whatever the reason; called exactly once per decision."""
        ...

    def on_set_aside(self, decision: Decision[Any]) -> None:
        """The decision was not acted on (conditional PD sent the request to a pair): undo
        what choosing recorded; called instead of `on_request_done`."""
        ...

    def on_workers_changed(self, names: Collection[str]) -> None:
        """The set of known workers is now ``names`` (forget state about the others)."""
        ...

    def on_worker_reset(self, name: str) -> None:
        """The worker's cache was emptied (``/flush_cache`` through the router): forget it."""
        ...

    @property
    def block_index(self) -> BlockIndex | None:
        """The index of the workers' cached blocks the policy routes on, fed by their KV
        events; None when the policy keeps none."""
        ...

    def index_sizes(self) -> dict[str, int]:
        """The size of the policy's prefix index by kind (`metrics.INDEX_KINDS`); empty
        when it keeps none."""
        ...

    def failover_routes(self) -> dict[str, int]:
        """Requests the policy routed by its failover rules since it started, by kind
        (`labels.FAILOVER_ROUTES`); empty when it has none."""
        ...

    def queued_prefill_tokens(self, name: str) -> int:
        """Prompt tokens this policy booked on worker ``name`` whose prefill is not over
        (the load poll subtracts them from the engine's count); 0 when it books none."""
        ...

    def apply_peer_route(
        self, decision: Decision[Any], last_key: int | None, keys: Sequence[int]
    ) -> None:
        """A peer router replica routed a request to ``decision.worker``: take its predicted
        ``keys`` and its booked prefill (``decision.pending_units``, its prompt's last block
        ``last_key``) as if this policy had routed it; ``on_prefill_done`` and
        ``on_request_done`` later get the same decision (`peer_view`). No-op by default: a
        policy may ignore its peers."""
        ...


class PolicyDefaults:
    """No-op hooks and no index, so a stateless policy only writes ``choose``."""

    name: ClassVar[str] = ""  # set by @register
    needs_text: ClassVar[bool] = False
    needs_tokens: ClassVar[bool] = False
    uses_kv_events: ClassVar[bool] = False
    block_index: BlockIndex | None = None

    def index_sizes(self) -> dict[str, int]:
        index = self.block_index
        if index is None:
            return {}
        return {
            "confirmed_blocks": index.confirmed_blocks,
            "predicted_blocks": index.predicted_blocks,
        }

    def failover_routes(self) -> dict[str, int]:
        return {}

    def queued_prefill_tokens(self, name: str) -> int:
        return 0

    def apply_peer_route(
        self, decision: Decision[Any], last_key: int | None, keys: Sequence[int]
    ) -> None:
        return None

    def on_prefill_done(self, decision: Decision[Any]) -> None:
        return None

    def on_request_done(self, decision: Decision[Any], succeeded: bool) -> None:
        return None

    def on_set_aside(self, decision: Decision[Any]) -> None:
        self.on_request_done(decision, True)

    def on_workers_changed(self, names: Collection[str]) -> None:
        return None

    def on_worker_reset(self, name: str) -> None:
        return None


class LoadOnlyPolicy(PolicyDefaults, ABC):
    """A policy that looks only at the routable workers, never at the prompt, and takes no
    parameters: it writes ``pick``; the healthy filter, `NoHealthyWorker` and the decision
    (outcome ``load_only``) are here. ``rng`` is seeded for the randomised ones."""

    def __init__(
        self, *, clock: Clock = time.monotonic, seed: int | None = None, **config: Any
    ) -> None:
        build_params(self.name, NoParams, config)
        self.rng = random.Random(seed)

    @abstractmethod
    def pick(self, healthy: Sequence[W]) -> W:
        """One of ``healthy`` (never empty, in the listed order)."""

    def choose(self, request: RouteRequest, workers: Sequence[W]) -> Decision[W]:
        return Decision(self.pick(healthy_workers(workers, request.model)), "load_only")


def healthy_workers(workers: Sequence[W], model: str = "") -> list[W]:
    """The routable workers, in their listed order; raises `NoHealthyWorker` if none."""
    healthy = [w for w in workers if w.healthy]
    if not healthy:
        raise NoHealthyWorker(model)
    return healthy


def least_loaded(workers: Sequence[W]) -> W:
    """The worker with the fewest in-flight requests; ties go to the first listed."""
    return min(workers, key=in_flight_of)


def in_flight_of(worker: WorkerView) -> int:
    """A worker's in-flight count, as a sort key."""
    return worker.in_flight


def is_imbalanced(workers: Sequence[WorkerView], abs_threshold: int, rel_threshold: float) -> bool:
    """sglang-router's imbalance test over routable workers' in-flight counts.

    Imbalanced when ``max - min > abs_threshold`` and ``max > rel_threshold * min``.
    (sglang-router takes min/max over all workers, unhealthy ones included, so one dead
    worker at load 0 makes every fleet look imbalanced; tpuserve uses routable ones only.)
    """
    return loads_imbalanced([w.in_flight for w in workers], abs_threshold, rel_threshold)


def loads_imbalanced(loads: Sequence[int], abs_threshold: int, rel_threshold: float) -> bool:
    """`is_imbalanced` over the in-flight counts themselves."""
    low, high = min(loads), max(loads)
    return high - low > abs_threshold and high > rel_threshold * low


# ----------------------------------------------------------------------------- registry

_REGISTRY: dict[str, type[Any]] = {}

P = TypeVar("P", bound=type[Any])


def register(name: str) -> Callable[[P], P]:
    """Class decorator: make the policy available as ``--policy name``."""

    def decorate(cls: P) -> P:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise PolicyConfigError(f"policy name {name!r} registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def registered_policy_names() -> list[str]:
    """Every policy name ``make_policy`` accepts, sorted."""
    _load_builtin_policies()
    return sorted(_REGISTRY)


def make_policy(
    name: str, *, clock: Clock = time.monotonic, seed: int | None = None, **config: Any
) -> Policy:
    """Build the policy called ``name``.

    ``clock`` and ``seed`` are given to every policy (those that need neither ignore them);
    ``config`` holds the policy's own parameters and is validated: an unknown parameter or
    a bad value raises `PolicyConfigError` naming it and what is allowed.
    """
    _load_builtin_policies()
    cls = _REGISTRY.get(name)
    if cls is None:
        raise PolicyConfigError(
            f"policy: unknown value {name!r}; allowed: {', '.join(sorted(_REGISTRY))}"
        )
    policy: Policy = cls(clock=clock, seed=seed, **config)
    return policy


T = TypeVar("T")


def build_params(policy: str, params_type: type[T], config: dict[str, Any]) -> T:
    """Build a policy's parameter dataclass from keyword config, with clear errors.

    Unknown names are rejected with the list of allowed ones; each value is checked
    against the field's type (int, float or bool) and the dataclass's own
    ``validate()`` (ranges), so the message always names the parameter and its value.
    """
    fields = {f.name: f for f in dataclasses.fields(params_type)}  # type: ignore[arg-type]
    unknown = sorted(set(config) - set(fields))
    if unknown:
        names = ", ".join(sorted(fields)) or "none"
        raise PolicyConfigError(
            f"policy {policy}: unknown parameter(s) {', '.join(unknown)}; allowed: {names}"
        )
    values: dict[str, Any] = {}
    for key, value in config.items():
        kind = fields[key].type
        values[key] = _coerce(policy, key, value, kind if isinstance(kind, str) else kind.__name__)
    params = params_type(**values)
    validate = getattr(params, "validate", None)
    if validate is not None:
        problem = validate()
        if problem:
            raise PolicyConfigError(f"policy {policy}: {problem}")
    return params


def _coerce(policy: str, key: str, value: Any, kind: str) -> Any:
    converters: dict[str, Callable[[Any], Any]] = {"int": int, "float": float, "bool": _to_bool}
    convert = converters.get(kind)
    if convert is None:
        return value
    try:
        if kind == "int" and isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        return convert(value)
    except (TypeError, ValueError):
        raise PolicyConfigError(
            f"policy {policy}: parameter {key}={value!r} is not a valid {kind}"
        ) from None


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


def _load_builtin_policies() -> None:
    # Importing the package registers every built-in policy module exactly once.
    import tpuserve_router.policies  # noqa: F401


@dataclass(frozen=True)
class NoParams:
    """Parameters of a policy that has none (any given is rejected by `build_params`)."""


def policy_problems(policy: str, params: Mapping[str, str]) -> list[str]:
    """What is wrong with ``--policy`` and its ``--policy-param`` values: an unknown name, or
    a parameter the policy refuses."""
    if policy not in registered_policy_names():
        return [f"policy={policy!r}: allowed {', '.join(registered_policy_names())}"]
    try:
        values: dict[str, Any] = dict(params)  # strings, converted by the policy
        make_policy(policy, **values)
    except PolicyConfigError as err:
        return [str(err)]
    return []
