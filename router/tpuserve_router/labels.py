"""The label vocabularies of the router's series: every value a bounded label may take, in one
module at the bottom of the router's layers (it imports nothing of the router), so `metrics`
makes each series' children from them without reaching up into the parts that use them."""

from __future__ import annotations

from typing import Final, Literal

Outcome = Literal["prefix_hit", "miss", "balanced_away", "load_only"]
OUTCOMES: Final[tuple[Outcome, ...]] = ("prefix_hit", "miss", "balanced_away", "load_only")
"""Why a worker was chosen (``tpuserve_router_routing_decisions_total{outcome}``): it holds the
prefix (`prefix_hit`); no worker held enough of it (`miss`); one did but load imbalance sent
the request elsewhere (`balanced_away`); the policy does not look at prefixes (`load_only`)."""

KV_TIERS: Final = ("hbm", "host")
"""Where a worker holds predicted cached tokens (``..._predicted_cached_tokens_by_tier``)."""

EJECTION_REASONS: Final = ("consecutive_failures", "failure_rate")
"""Why outlier detection ejected a worker (``tpuserve_router_worker_ejections_total``)."""

ABORT_REASONS: Final = ("client_gone", "gave_up")
"""Why the router aborted a request: its client left, or the router stopped waiting."""

PeerKind = Literal["route", "first_byte", "end", "hello"]
PEER_KINDS: Final[tuple[PeerKind, ...]] = ("route", "first_byte", "end", "hello")
PEER_MESSAGE_KINDS: Final = (*PEER_KINDS, "malformed")
"""The ``kind`` label of ``tpuserve_router_peer_messages_total``."""

PD_ROUTES: Final = ("disaggregated", "colocated", "no_prefill")
"""How a PD-mode request was served (``tpuserve_router_pd_requests_total{how}``): as a pair; on
a colocated worker by choice; on a colocated worker because no pair was healthy."""
PD_LEGS: Final = ("prefill", "decode")
PD_FAILURE_KINDS: Final = ("bootstrap", "transfer", "transport", "status", "timeout")
"""A pair's failed leg and how it failed (``tpuserve_router_pd_failures_total``)."""

FAILOVER_ROUTES: Final = ("successor", "shared_prefix_spread")
"""``tpuserve_router_failover_routes_total{kind}``: a prompt a lost worker held sent to its
successor (`policies.failover`); a hit on a shared prefix sent away from its busy holder
(`policies.shared_prefixes`)."""

MIGRATION_RESULTS: Final = ("migrated", "not_migrated")
"""``tpuserve_router_stream_migrations_total{result}``."""
