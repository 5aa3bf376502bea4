"""What an API key may spend: requests and tokens per minute, and its share under overload.

**Requests per minute.** A key with ``requests_per_minute`` has a token bucket of requests
(capacity: one minute's worth; refilled continuously). A request takes one as it arrives; it
is refused (429) when there is none left.

**Tokens per minute** hold in every minute: the tokens a key's requests take in any 60
seconds never sum to more than its ``tokens_per_minute``, however it sends them (at once, in
streams it hangs up on, with odd ``max_tokens``; with a character policy, up to what its
estimate of the prompts missed). A request *reserves* what it may cost before
it is forwarded: its prompt tokens (the router's count; with a character policy, its estimate
of 4 characters a token) and, for each of its generations, its max-tokens field
(`tpuserve_router.pipeline.generation_limits`) capped by the room its prompt leaves in the worker's
context (``max_model_len`` of its ``/v1/models``); a request that names no bound reserves the
context's remainder, or the key's whole minute where the worker states no context. It is
refused (429 with ``Retry-After``) unless the key's last minute has room for that reservation,
and refused at once (429 without ``Retry-After``, naming the field to lower) when the
reservation alone is more than a minute holds. Its reservation is then *settled*, once, when
it ends (`tpuserve_router.pipeline.ledger.Spend.charge`), at what it cost:

- its whole answer reached the client: the answer's usage (prompt and completion tokens); an
  answer without usage, what it reserved; an error answer without usage, nothing;
- the client hung up, or the stream broke after bytes reached the client: its prompt and the
  completion tokens its stream last reported (SGLang's native stream reports them in every
  event; a stream that reported none, or an answer not streamed, is charged what it
  reserved). The key's minute keeps the whole reservation all the same: the worker may have
  generated that much before the router's abort reached it;
- otherwise (refused, or no worker answered and the router did): nothing.

The unused part of a reservation is given back to the second it was taken in (if that second
is still in the minute); a charge over the reservation (a prompt longer than estimated) is
taken in the current second. The minute is kept as 61 one-second slots (`TokenWindow`), so a
minute is looked at from the start of its earliest second: a little stricter than 60 s.
Charges are never negative, and ``tpuserve_router_tenant_tokens_total`` counts each request's
charge once, when it is settled: it never goes down.

Every answer to a key with limits carries OpenAI's ``x-ratelimit-limit-*``,
``x-ratelimit-remaining-*`` and ``x-ratelimit-reset-*`` headers for its limits (after taking
this request); a 429 also carries ``Retry-After`` (whole seconds). A key's limits' state
survives a reload of the keys file while its limits stay the same.

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

from tpuserve_router.tenancy.auth import PRIORITIES, ApiKey

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


class TokenWindow:
    """The tokens a key took in the last minute, by the second it took them in.

    `SLOTS` one-second slots: slot ``s % SLOTS`` holds what was taken in second ``s`` while
    ``s`` is one of the last `SLOTS` seconds (the current one included), so every 60-second
    span lies within the slots looked at when its last request was admitted."""

    SLOTS: Final = 61
    __slots__ = ("now", "per_minute", "second", "slots", "used")

    def __init__(self, per_minute: int, now: float) -> None:
        self.per_minute = per_minute
        self.slots = [0] * self.SLOTS
        self.now = now
        self.second = math.floor(now)
        self.used = 0  # the sum of the slots

    def advance(self, now: float) -> int:
        """Move to ``now``'s second, emptying the slots of seconds that left the minute."""
        self.now = now
        second = math.floor(now)
        gone = second - self.second
        if gone > 0:
            slots = self.slots
            if gone >= self.SLOTS:
                slots[:] = [0] * self.SLOTS
                self.used = 0
            else:
                for s in range(self.second + 1, second + 1):
                    i = s % self.SLOTS
                    self.used -= slots[i]
                    slots[i] = 0
            self.second = second
        return self.second

    def room(self, now: float) -> int:
        self.advance(now)
        return self.per_minute - self.used

    def take(self, tokens: int, now: float) -> int:
        """Take ``tokens`` (>= 0) now; the second they were taken in."""
        second = self.advance(now)
        self.slots[second % self.SLOTS] += tokens
        self.used += tokens
        return second

    def settle(self, second: int, reserved: int, charged: int, now: float) -> None:
        """A reservation of ``reserved`` taken in ``second`` costs ``charged`` (>= 0): the
        rest goes back to that second (if it is still in the minute), more is taken now."""
        current = self.advance(now)
        if charged > reserved:
            self.take(charged - reserved, now)
        elif current - second < self.SLOTS:
            refund = reserved - charged
            self.slots[second % self.SLOTS] -= refund
            self.used -= refund

    def seconds_until(self, room: int, now: float) -> float:
        """How long until the minute has ``room`` tokens free (after `advance`; ``room`` at
        most `per_minute`), counting only on what was taken leaving the minute."""
        excess = self.used + room - self.per_minute
        if excess <= 0:
            return 0.0
        for s in range(self.second - self.SLOTS + 1, self.second + 1):
            excess -= self.slots[s % self.SLOTS]
            if excess <= 0:
                return max(0.0, s + self.SLOTS - now)
        return 60.0  # not reached: the slots hold ``used``

    def seconds_until_empty(self) -> float:
        """How long until all that was taken has left the minute (as of the last `advance`)."""
        for s in range(self.second, self.second - self.SLOTS, -1):
            if self.slots[s % self.SLOTS]:
                return max(0.0, s + self.SLOTS - self.now)
        return 0.0


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a key's request was refused, and the headers that say so."""

    limit: str  # "requests" or "tokens"
    per_minute: int
    retry_after_seconds: float | None  # None: retrying will not help (the request is too large)
    message: str = ""  # what to change, when retrying will not help
    param: str | None = None

    def headers(self, requests: Bucket | None, tokens: TokenWindow | None) -> dict[str, str]:
        headers = limit_headers(requests, tokens)
        if self.retry_after_seconds is not None:
            headers["retry-after"] = str(max(1, math.ceil(self.retry_after_seconds)))
        return headers


def limit_headers(requests: Bucket | None, tokens: TokenWindow | None) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` for the limits a key
    has: its limit per minute, what is left now, and the time until all of it is left."""
    headers = {}
    if requests is not None:
        headers["x-ratelimit-limit-requests"] = str(requests.per_minute)
        headers["x-ratelimit-remaining-requests"] = str(max(0, math.floor(requests.level)))
        full = requests.seconds_until(requests.per_minute)
        headers["x-ratelimit-reset-requests"] = f"{full:.3g}s"
    if tokens is not None:
        headers["x-ratelimit-limit-tokens"] = str(tokens.per_minute)
        headers["x-ratelimit-remaining-tokens"] = str(max(0, tokens.per_minute - tokens.used))
        headers["x-ratelimit-reset-tokens"] = f"{tokens.seconds_until_empty():.3g}s"
    return headers


@dataclass(slots=True)
class Reservation:
    """The tokens a request holds of its key's minute until it is settled."""

    tokens: int
    second: int
    settled: bool = False


class KeyQuota:
    """One key's limits (None: no such limit)."""

    __slots__ = ("requests", "tokens")

    def __init__(self, key: ApiKey, now: float) -> None:
        rpm, tpm = key.requests_per_minute, key.tokens_per_minute
        self.requests = Bucket(rpm, now) if rpm is not None else None
        self.tokens = TokenWindow(tpm, now) if tpm is not None else None

    def _refused(self, refusal: Refusal) -> tuple[Refusal, dict[str, str]]:
        return refusal, refusal.headers(self.requests, self.tokens)

    def admit(self, now: float) -> tuple[Refusal, dict[str, str]] | None:
        """Take one request as it arrives (before its body is read: tokens are reserved
        later, `reserve`); the refusal and its headers if the key may not have it, when it
        has no request left or its minute no token."""
        requests, tokens = self.requests, self.tokens
        if requests is not None and requests.refill(now) < 1.0:
            return self._refused(
                Refusal("requests", requests.per_minute, requests.seconds_until(1.0))
            )
        if tokens is not None and tokens.room(now) < 1:
            return self._refused(Refusal("tokens", tokens.per_minute, tokens.seconds_until(1, now)))
        if requests is not None:
            requests.level -= 1.0
        return None

    def reserve(
        self, tokens: int, now: float, param: str
    ) -> Reservation | tuple[Refusal, dict[str, str]]:
        """Reserve ``tokens`` (>= 0) of the key's minute for a request `admit` took; the
        refusal and its headers (the request is given back) if they do not fit. ``param``
        is the field that bounds the request."""
        window = self.tokens
        if window is None:
            return Reservation(tokens, 0)
        refusal = None
        if tokens > window.per_minute:
            refusal = Refusal(
                "tokens", window.per_minute, None,
                f"this request may take {tokens} tokens, more than the {window.per_minute} "
                f"its key may take in a minute; lower {param}",
                param,
            )  # fmt: skip
        elif window.room(now) < tokens:
            refusal = Refusal("tokens", window.per_minute, window.seconds_until(tokens, now))
        if refusal is not None:
            requests = self.requests
            if requests is not None:  # the request `admit` took goes back
                requests.level = min(float(requests.per_minute), requests.level + 1.0)
            return self._refused(refusal)
        return Reservation(tokens, window.take(tokens, now))

    def settle(self, reservation: Reservation, charged: int, now: float) -> None:
        """The request that reserved ``reservation`` ended costing ``charged`` tokens."""
        if reservation.settled:
            return
        reservation.settled = True
        if self.tokens is not None:
            self.tokens.settle(reservation.second, reservation.tokens, max(0, charged), now)

    def headers(self) -> bytes:
        """The rate-limit headers every answer to the key carries (none without limits),
        encoded as ``name: value`` lines."""
        return b"".join(
            f"{name}: {value}\r\n".encode() for name, value in
            limit_headers(self.requests, self.tokens).items()
        )  # fmt: skip


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

    def keep_only(self, keys: Mapping[bytes, ApiKey]) -> None:
        """After a reload: drop the limits' state of keys gone or whose limits changed."""
        for digest, quota in list(self._quotas.items()):
            key = keys.get(digest)
            limits = (
                None if quota.requests is None else quota.requests.per_minute,
                None if quota.tokens is None else quota.tokens.per_minute,
            )
            if key is None or limits != (key.requests_per_minute, key.tokens_per_minute):
                del self._quotas[digest]
