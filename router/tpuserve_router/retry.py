"""When a failed try goes to another worker: the one retry rule, and how a try ended.

A try fails before anything reached the client when the worker refuses or drops the
connection, answers 429/502/503/504, or breaks while its whole (non-streamed) answer is
being read. Such a failure is retried on another worker (`should_retry`) while retries are
left and another candidate is healthy. Three failures are never retried: a first-byte
timeout (the worker is slow, not gone, so a retry would duplicate its work) and a request
timeout once the answer has started (the request's time is up), answered 504, and an
answer over ``--max-response-bytes``, answered 502.
Nothing is retried once the client has received bytes.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Final

from tpuserve_router.policies.base import WorkerView
from tpuserve_router.proxy import UpstreamError

RETRYABLE_STATUSES: Final = frozenset({429, 502, 503, 504})
NEVER_RETRIED: Final = frozenset({"first_byte_timeout", "response_too_large"})
"""Failures another worker would repeat: slow to start (its work would be duplicated), or an
answer too large for the router."""
"""Worker answers that let another worker take the request: overloaded or unavailable."""


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
) -> bool:
    """The retry rule: a ``retryable`` failure on ``worker`` goes to another worker when
    fewer than ``max_retries`` retries were made and another of ``candidates`` is healthy."""
    return (
        retryable
        and retries < max_retries
        and any(w.healthy and w is not worker for w in candidates)
    )
