"""One adapter per engine type: where the router reads an engine's load, and whether it
publishes KV events. The rest of the router never asks which engine a worker runs.

Two engines speak SGLang's HTTP API:

- **SGLang** (0.5.22 and later): ``GET /v1/loads`` per DP rank (running, waiting, uncached
  waiting prompt tokens, token usage) and ZMQ KV events that `precise` and `cost` index;
- **SGLang-JAX** (``sgl_jax``, SGLang's TPU engine in JAX): no ``/v1/loads`` (404), a
  ``/get_load`` that answers 500 (its tokenizer manager reads a ``load`` key its scheduler's
  internal state never has), no ``sglang:*`` metrics and no KV events. Its load comes from
  ``GET /get_server_info``'s ``internal_states`` (one per DP rank: ``waiting_queue_size``,
  ``running_batch_size``, ``memory_usage.kvcache``, ``available_kv_tokens`` of
  ``memory_usage.token_capacity``); the prompt tokens it has waiting are not there, so the
  router's own booked prefill stands for them. Its prefix routing is approximate: the policy's
  own record of what it sent where (its predicted blocks), never confirmed by events.

How a worker is known to be SGLang-JAX (``--engine-type``): ``sglang-jax`` says so for every
worker; ``auto`` (the default) asks ``/v1/loads`` and, after an engine answered it 404
(`engine_loads.UNSUPPORTED_AFTER_404S` times in a row), asks ``/get_server_info`` once: internal
states in SGLang-JAX's shape make the worker SGLang-JAX (`detect`), anything else leaves it an
engine whose load is only what this router sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from tpuserve_router.config import ENGINE_TYPES

AUTO, SGLANG, SGLANG_JAX = ENGINE_TYPES

SGLANG_JAX_STATE_KEYS: Final = ("waiting_queue_size", "running_batch_size")
"""Keys of SGLang-JAX's per-rank internal state the load is read from (always present)."""


class LoadAnswerError(ValueError):
    """An engine's load answer the router cannot use; the message names the field."""


@dataclass(frozen=True)
class EngineLoad:
    """One engine's load over all its data-parallel ranks."""

    requests: int
    """Running plus waiting requests."""
    waiting_uncached_tokens: int | None
    """Prompt tokens waiting for prefill compute (past each request's cached prefix); None
    where the engine does not say (SGLang-JAX): the router's booked prefill stands for it."""
    running: int = 0
    waiting: int = 0
    kv_usage: float | None = None
    """Share of the KV pool in use (the most loaded rank), None where not said."""
    host_tier_tokens: int | None = None
    """The engine's host-memory KV tier in tokens, None without one or where not said: for
    SGLang-JAX its ``hicache_ratio`` x ``max_total_num_tokens`` when ``hicache_storage`` is not
    ``disable`` (all ``/get_server_info`` shows of its tier: no use, no load backs, no events)."""


@dataclass(frozen=True)
class EngineAdapter:
    """What differs between engine types, as the router's parts read it."""

    name: str
    load_path: str
    max_load_body_bytes: int
    publishes_kv_events: bool
    prefix_routing: str
    """How the router knows what the engine caches (``GET /workers`` shows it)."""

    def parse_load(self, document: object) -> EngineLoad:
        if self.name == SGLANG_JAX:
            return parse_server_info_load(document)
        return parse_loads(document)


LOAD_KEYS: Final = ("num_running_reqs", "num_waiting_reqs", "num_waiting_uncached_tokens")
"""The fields of each DP rank's load snapshot the view uses (SGLang 0.5.23 `LoadSnapshot`)."""


def _count(snapshot: Mapping[str, object], key: str, where: str) -> int:
    value = snapshot.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LoadAnswerError(f"{where}.{key} is {value!r}; allowed: an integer >= 0")
    return value


def _ranks(document: object, key: str, path: str) -> list[Mapping[str, object]]:
    ranks = document.get(key) if isinstance(document, dict) else None
    if not isinstance(ranks, list) or not ranks:
        raise LoadAnswerError(f"{path}: {key!r} must be a non-empty list of DP-rank snapshots")
    for rank, snapshot in enumerate(ranks):
        if not isinstance(snapshot, dict):
            raise LoadAnswerError(f"{path}: {key}[{rank}] must be an object")
    return ranks


def _usage(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        return None
    return float(value)


def parse_loads(document: object) -> EngineLoad:
    """Sum SGLang's ``/v1/loads`` per-rank snapshots; `LoadAnswerError` names what is wrong."""
    sums = dict.fromkeys(LOAD_KEYS, 0)
    usage: float | None = None
    for rank, snapshot in enumerate(_ranks(document, "loads", "/v1/loads")):
        for key in LOAD_KEYS:
            sums[key] += _count(snapshot, key, f"/v1/loads: loads[{rank}]")
        rank_usage = _usage(snapshot.get("token_usage"))
        if rank_usage is not None:
            usage = rank_usage if usage is None else max(usage, rank_usage)
    running, waiting = sums["num_running_reqs"], sums["num_waiting_reqs"]
    return EngineLoad(
        running + waiting, sums["num_waiting_uncached_tokens"], running, waiting, usage
    )


def parse_server_info_load(document: object) -> EngineLoad:
    """Sum SGLang-JAX's ``/get_server_info`` internal states (one per DP rank)."""
    path = "/get_server_info"
    running = waiting = 0
    usage: float | None = None
    for rank, state in enumerate(_ranks(document, "internal_states", path)):
        where = f"{path}: internal_states[{rank}]"
        waiting += _count(state, "waiting_queue_size", where)
        running += _count(state, "running_batch_size", where)
        rank_usage = _kv_usage(state)
        if rank_usage is not None:
            usage = rank_usage if usage is None else max(usage, rank_usage)
    return EngineLoad(running + waiting, None, running, waiting, usage, _host_tier(document))


def _host_tier(document: object) -> int | None:
    """SGLang-JAX's host pool in tokens from its server arguments in ``/get_server_info``:
    ratio x device pool with ``--hicache-storage`` other than ``disable``, else None."""
    if not isinstance(document, dict) or document.get("hicache_storage") in (None, "disable"):
        return None
    ratio, pool = document.get("hicache_ratio"), document.get("max_total_num_tokens")
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or ratio <= 0:
        return None
    if type(pool) is not int or pool <= 0:
        return None
    return int(ratio * pool)


def _kv_usage(state: Mapping[str, object]) -> float | None:
    """A rank's KV-pool share in use: ``1 - available_kv_tokens / token_capacity`` (exact),
    else its ``memory_usage.kvcache`` (rounded to two places by the engine)."""
    memory = state.get("memory_usage")
    capacity = memory.get("token_capacity") if isinstance(memory, dict) else None
    available = state.get("available_kv_tokens")
    if (
        type(capacity) is int
        and capacity > 0
        and type(available) is int
        and 0 <= available <= capacity
    ):
        return 1.0 - available / capacity
    return _usage(memory.get("kvcache")) if isinstance(memory, dict) else None


def detect(document: object) -> str | None:
    """The engine type a ``/get_server_info`` answer shows: `SGLANG_JAX` when its internal
    states have SGLang-JAX's scheduler keys, else None (not known from it)."""
    states = document.get("internal_states") if isinstance(document, dict) else None
    if not isinstance(states, list) or not states:
        return None
    first = states[0]
    if isinstance(first, dict) and all(k in first for k in SGLANG_JAX_STATE_KEYS):
        return SGLANG_JAX
    return None


ADAPTERS: Final = {
    SGLANG: EngineAdapter(
        SGLANG,
        "/v1/loads",
        1 << 20,  # a snapshot per DP rank is some 500 bytes
        publishes_kv_events=True,
        prefix_routing="KV events (the engine's cache as it reports it), where subscribed",
    ),
    SGLANG_JAX: EngineAdapter(
        SGLANG_JAX,
        "/get_server_info",
        4 << 20,  # its server args plus every waiting and running request id
        publishes_kv_events=False,
        prefix_routing="approximate: the router's record of what it sent where (no KV events)",
    ),
}


def adapter(engine_type: str) -> EngineAdapter:
    """The adapter of an engine type (``auto`` starts as SGLang's)."""
    return ADAPTERS[SGLANG if engine_type == AUTO else engine_type]
