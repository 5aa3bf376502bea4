"""A generation request as the twin's engine core sees it, and its record once finished."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sglang_tpu.sim.radix_cache import TreeNode


class Request:
    """One generation request as the core sees it; the driver reads the public fields."""

    __slots__ = (
        "arrival_time",
        "bootstrap",
        "cached_host_tokens",
        "cached_tokens",
        "finish_reason",
        "finish_time",
        "first_token_time",
        "input_ids",
        "last_node",
        "last_token_time",
        "matched_prefix_tokens",
        "max_new_tokens",
        "on_update",
        "output_ids",
        "prefill_len",
        "prefilled",
        "private_tokens",
        "retractions",
        "rid",
        "rng_state",
        "sampling_seed",
        "schedule_time",
        "stop_strings",
        "stop_text_index",
        "stop_token_ids",
        "stream",
        "text",
        "tree_len",
        "user",
    )

    def __init__(
        self,
        rid: str,
        input_ids: Sequence[int],
        max_new_tokens: int,
        *,
        stop_strings: Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        sampling_seed: int | None = None,
        on_update: Callable[[Request], None] | None = None,
        user: Any = None,
        stream: bool = False,
    ) -> None:
        self.rid = rid
        self.input_ids = list(input_ids)
        self.max_new_tokens = max_new_tokens
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.stop_token_ids = frozenset(stop_token_ids)
        self.sampling_seed = sampling_seed
        self.on_update = on_update
        self.user = user
        self.stream = stream  # the client streams the output (SGLang's `is_streaming` label)
        self.output_ids: list[int] = []
        self.text: list[str] = []  # output text pieces, kept only when stop strings are set
        self.stop_text_index: int | None = None  # where a matched stop string starts
        self.arrival_time = 0.0
        self.schedule_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time = 0.0
        self.finish_time: float | None = None
        self.finish_reason: dict[str, Any] | None = None
        self.cached_tokens = 0
        self.cached_host_tokens = 0  # of cached_tokens, loaded back from the host tier
        self.prefilled = 0
        self.prefill_len = 0  # tokens to prefill: len(fill_ids()) when admitted
        self.tree_len = 0
        self.matched_prefix_tokens: int | None = None  # while waiting (engine.py)
        self.private_tokens = 0
        self.retractions = 0
        self.last_node: TreeNode | None = None
        self.rng_state = 0  # the output generator's state (sglang_tpu.sim.output_text)
        self.bootstrap: Any = None  # PD: its `sglang_tpu.sim.pd.Bootstrap`, if it has one

    @property
    def prompt_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def fill_ids(self) -> list[int]:
        """Tokens whose KV the request needs (prompt, plus output after a retraction)."""
        return self.input_ids + self.output_ids if self.output_ids else self.input_ids

    def completion(self) -> Completion:
        """The finished request's record."""
        assert self.finish_reason is not None
        assert self.finish_time is not None
        return Completion(
            rid=self.rid,
            arrival_time=self.arrival_time,
            schedule_time=self.schedule_time
            if self.schedule_time is not None
            else self.arrival_time,
            first_token_time=self.first_token_time
            if self.first_token_time is not None
            else self.finish_time,
            finish_time=self.finish_time,
            prompt_tokens=len(self.input_ids),
            cached_tokens=self.cached_tokens,
            completion_tokens=len(self.output_ids),
            finish_reason=self.finish_reason,
            retractions=self.retractions,
            cached_host_tokens=self.cached_host_tokens,
        )


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished request's timings and token counts (times on the driver's clock)."""

    rid: str
    arrival_time: float
    schedule_time: float
    first_token_time: float
    finish_time: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: dict[str, Any]
    retractions: int
    cached_host_tokens: int = 0
    """Of ``cached_tokens``, those loaded back from the host tier."""

    @property
    def ttft(self) -> float:
        return self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float:
        return self.finish_time - self.arrival_time

    @property
    def queue_time(self) -> float:
        return self.schedule_time - self.arrival_time
