"""When a failed try goes to another worker: the one retry rule, its budget, and how a try
ended.

A try fails before anything reached the client when the worker refuses or drops the
connection, answers 429/500/502/503/504, gives no answer within the time derived for the
request (`deadlines`), or breaks while its whole (non-streamed) answer is being read. Such a
failure is retried on another worker (`should_retry`) while retries are left, another
candidate is healthy and, for a failure that may have cost the worker work (a 5xx or 429
answer, a timeout), the retry budget allows: as Envoy's, requests being retried may be at
most ``--retry-budget-percent`` of the requests in flight, and ``--retry-budget-min``
always (`RetryBudget`), so a failing fleet is not hit with a multiple of its load. A
connection that failed (refused, reset, broken: the worker is gone) spends no budget: a
killed worker's requests all move to the others; so does a try whose worker answered neither
it by its floor nor a health probe since (`free_retry`), a hung worker's. Two
failures are never retried: a request timeout once the answer has started (the request's
time is up), answered 504, and an answer over ``--max-response-bytes``, answered 502.
Nothing is retried once the client has received bytes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Final

from tpuserve_router.engines.proxy import UpstreamError
from tpuserve_router.policies.base import WorkerView

RETRYABLE_STATUSES: Final = frozenset({429, 500, 502, 503, 504})
"""Worker answers that let another worker take the request: overloaded, failing or unavailable
(501, 505 and the like say the request itself cannot be served)."""
NEVER_RETRIED: Final = frozenset({"response_too_large"})
"""Failures another worker would repeat: an answer too large for the router."""
FREE_RETRIES: Final = frozenset(
    {"connect_error", "reset_before_response", "stream_broken", "worker_down"}
)
"""Failures of the connection itself: the worker is gone, nothing is done twice, so their
retries spend no budget."""


class RetryBudget:
    """Envoy's retry budget: requests being retried (``active``) may be at most ``percent``
    of the requests in flight, and ``minimum`` always; `allows` counts what it refuses."""

    def __init__(
        self, percent: float, minimum: int, on_denied: Callable[[], None] = lambda: None
    ) -> None:
        self.fraction = percent / 100
        self.minimum = minimum
        self.on_denied = on_denied
        self.active = 0  # requests holding a retry (from their first retry to their end)

    def allows(self, in_flight: int, holding: bool) -> bool:
        """Whether a request (``holding`` a retry already, or not) may retry now."""
        if holding or self.active < max(self.minimum, self.fraction * in_flight):
            return True
        self.on_denied()
        return False


class Attempt(enum.Enum):
    """How one try on a worker ended."""

    ANSWERED = "answered"
    """The client has its answer: a response, an error, or a stream that ended or broke."""
    RETRY = "retry"
    """Nothing reached the client, and the request goes to another worker."""


# The members as module names: on Python 3.11 reading an enum class's attribute goes through
# EnumType's __getattr__ hook (about 0.1 µs), which the request hot path avoids.
ANSWERED: Final = Attempt.ANSWERED
RETRY: Final = Attempt.RETRY


def free_retry(err: UpstreamError) -> bool:
    """Whether the retry of a try that failed with ``err`` spends no budget: the worker is
    gone (`FREE_RETRIES`), or it answered neither the request by its floor nor a health
    probe since (``silent``: a hung engine's requests all fail at once, and a budget meant
    to keep retries off an overloaded fleet would answer most of them 504, issue 56)."""
    return err.reason in FREE_RETRIES or err.silent


def retryable_error(err: UpstreamError) -> bool:
    """Whether another worker may take a request whose try failed with ``err``."""
    if err.reason in NEVER_RETRIED:
        return False
    return not (err.reason == "request_timeout" and err.response_started)


def should_retry(
    retryable: bool,
    retries: int,
    max_retries: int,
    worker: WorkerView,
    candidates: Sequence[WorkerView],
    budget: RetryBudget | None,
    in_flight: int,
) -> bool:
    """The retry rule: a ``retryable`` failure on ``worker`` goes to another worker when
    fewer than ``max_retries`` retries were made, another of ``candidates`` is healthy and
    the ``budget`` allows with ``in_flight`` requests in flight (None: a failure that spends
    no budget, `FREE_RETRIES`)."""
    return (
        retryable
        and retries < max_retries
        and any(w.healthy and w is not worker for w in candidates)
        and (budget is None or budget.allows(in_flight, holding=retries > 0))
    )
