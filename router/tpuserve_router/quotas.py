"""What an API key may spend: requests and tokens per minute, and its share under overload.

**Rate limits.** Each key with ``requests_per_minute`` or ``tokens_per_minute`` has a token
bucket for each (capacity: one minute's worth; refilled continuously). A request takes one
request; it is refused (429) when there is none left, or when the key's token bucket is
empty. Tokens are spent after the answer, from its usage (prompt and completion tokens; the
router's estimate when the answer carries none), so a bucket may go below zero: the key then
waits until it refills. Every answer to a key with limits carries OpenAI's
``x-ratelimit-limit-*``, ``x-ratelimit-remaining-*`` and ``x-ratelimit-reset-*`` headers for
its limits (after taking this request); a 429 also carries ``Retry-After`` (whole
seconds). A key's buckets survive a reload of the keys file while its
limits stay the same.

**Priority classes.** Under overload, lower classes are shed first: a request of class c is
refused (503 with ``Retry-After``) once the router has ``PRIORITY_SHARES[c] × --max-in-flight``
generation requests in flight, so ``low`` stops being admitted at 70 % of the limit,
``normal`` at 85 %, ``high`` at 95 % and ``critical`` only at the limit. Without API keys there
are no classes, and every request may use the whole limit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from tpuserve_router.auth import PRIORITIES, ApiKey

PRIORITY_SHARES: Final[Mapping[str, float]] = {
    "critical": 1.0,
    "high": 0.95,
    "normal": 0.85,
    "low": 0.7,
}
assert tuple(PRIORITY_SHARES) == PRIORITIES


def in_flight_limits(max_in_flight: int) -> dict[str, int]:
    """The in-flight count at which each priority class stops being admitted."""
    return {p: max(1, math.floor(max_in_flight * share)) for p, share in PRIORITY_SHARES.items()}


class Bucket:
    """A token bucket holding up to ``per_minute``, refilled at ``per_minute`` / 60 per second."""

    __slots__ = ("level", "per_minute", "rate", "updated")

    def __init__(self, per_minute: int, now: float) -> None:
        self.per_minute = per_minute
        self.rate = per_minute / 60.0
        self.level = float(per_minute)
        self.updated = now

    def refill(self, now: float) -> float:
        level = self.level + (now - self.updated) * self.rate
        self.level = level if level < self.per_minute else float(self.per_minute)
        self.updated = now
        return self.level

    def seconds_until(self, level: float) -> float:
        """How long until the bucket holds ``level`` (after `refill`)."""
        return max(0.0, (level - self.level) / self.rate)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a key's request was refused, and the headers that say so."""

    limit: str  # "requests" or "tokens"
    per_minute: int
    retry_after_seconds: float

    def headers(self, requests: Bucket | None, tokens: Bucket | None) -> dict[str, str]:
        retry_after = str(max(1, math.ceil(self.retry_after_seconds)))
        return {"retry-after": retry_after, **limit_headers(requests, tokens)}


def limit_headers(requests: Bucket | None, tokens: Bucket | None) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` for the buckets a
    key has: its limit per minute, what is left now, and the time until the bucket is full."""
    headers = {}
    for name, bucket in (("requests", requests), ("tokens", tokens)):
        if bucket is not None:
            headers[f"x-ratelimit-limit-{name}"] = str(bucket.per_minute)
            headers[f"x-ratelimit-remaining-{name}"] = str(max(0, math.floor(bucket.level)))
            full = bucket.seconds_until(bucket.per_minute)
            headers[f"x-ratelimit-reset-{name}"] = f"{full:.3g}s"
    return headers


class KeyQuota:
    """One key's buckets (None: no such limit)."""

    __slots__ = ("requests", "tokens")

    def __init__(self, key: ApiKey, now: float) -> None:
        rpm, tpm = key.requests_per_minute, key.tokens_per_minute
        self.requests = Bucket(rpm, now) if rpm is not None else None
        self.tokens = Bucket(tpm, now) if tpm is not None else None

    def admit(self, now: float) -> tuple[Refusal, dict[str, str]] | None:
        """Take one request; the refusal and its headers if the key may not have it."""
        requests, tokens = self.requests, self.tokens
        refusal = None
        if requests is not None and requests.refill(now) < 1.0:
            refusal = Refusal("requests", requests.per_minute, requests.seconds_until(1.0))
        elif tokens is not None and tokens.refill(now) <= 0.0:
            refusal = Refusal("tokens", tokens.per_minute, tokens.seconds_until(1.0))
        if refusal is not None:
            return refusal, refusal.headers(requests, tokens)
        if requests is not None:
            requests.level -= 1.0
        return None

    def headers(self) -> bytes:
        """The rate-limit headers every answer to the key carries (none without limits),
        encoded as ``name: value`` lines."""
        return b"".join(
            f"{name}: {value}\r\n".encode() for name, value in
            limit_headers(self.requests, self.tokens).items()
        )  # fmt: skip

    def spend_tokens(self, tokens: int, now: float) -> None:
        bucket = self.tokens
        if bucket is not None:
            bucket.refill(now)
            bucket.level -= tokens


class Quotas:
    """Every key's `KeyQuota` (made on first use)."""

    def __init__(self) -> None:
        self._quotas: dict[bytes, KeyQuota] = {}

    def of(self, key: ApiKey, now: float) -> KeyQuota:
        quota = self._quotas.get(key.digest)
        if quota is None:
            quota = self._quotas[key.digest] = KeyQuota(key, now)
        return quota

    def admit(self, key: ApiKey, now: float) -> tuple[Refusal, dict[str, str]] | None:
        return self.of(key, now).admit(now)

    def spend_tokens(self, key: ApiKey, tokens: int, now: float) -> None:
        self.of(key, now).spend_tokens(tokens, now)

    def keep_only(self, keys: Mapping[bytes, ApiKey]) -> None:
        """After a reload: drop the buckets of keys gone or whose limits changed."""
        for digest, quota in list(self._quotas.items()):
            key = keys.get(digest)
            limits = (
                None if quota.requests is None else quota.requests.per_minute,
                None if quota.tokens is None else quota.tokens.per_minute,
            )
            if key is None or limits != (key.requests_per_minute, key.tokens_per_minute):
                del self._quotas[digest]
