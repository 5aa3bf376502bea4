"""The max-tokens fields as SGLang reads them, checked (400 naming the field), and the
completion tokens a request may take, capped by the context."""

from __future__ import annotations

from typing import Any

import pytest

from tpuserve_router.pipeline.generation_limits import (
    MAX_TOKENS_ALLOWED,
    GenerationLimit,
    chat_limit,
    completions_limit,
    generate_limit,
)
from tpuserve_router.pipeline.request_body import ClientError

pytestmark = pytest.mark.unit

CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("read", "data", "expected"),
    [
        (completions_limit, {"prompt": "hi"}, GenerationLimit(16, 1, "max_tokens")),
        (completions_limit, {"prompt": "hi", "max_tokens": 5, "n": 3},
         GenerationLimit(5, 3, "max_tokens")),
        (completions_limit, {"prompt": ["a", "b"], "max_tokens": None},
         GenerationLimit(None, 2, "max_tokens")),
        (completions_limit, {"prompt": [1, 2, 3], "max_tokens": 0},
         GenerationLimit(0, 1, "max_tokens")),
        (chat_limit, {"messages": CHAT}, GenerationLimit(None, 1, "max_completion_tokens")),
        (chat_limit, {"messages": CHAT, "max_tokens": 7}, GenerationLimit(7, 1, "max_tokens")),
        (chat_limit, {"messages": CHAT, "max_tokens": 7, "max_completion_tokens": 9},
         GenerationLimit(9, 1, "max_completion_tokens")),
        (chat_limit, {"messages": CHAT, "max_tokens": 7, "max_completion_tokens": 0},
         GenerationLimit(7, 1, "max_tokens")),  # SGLang's `or`
        (generate_limit, {"text": "hi"},
         GenerationLimit(128, 1, "sampling_params.max_new_tokens")),
        (generate_limit, {"text": ["a", "b", "c"],
                          "sampling_params": {"max_new_tokens": 4, "n": 2}},
         GenerationLimit(4, 6, "sampling_params.max_new_tokens")),
        (generate_limit, {"input_ids": [[1], [2]],
                          "sampling_params": [{"max_new_tokens": 4}, {"max_new_tokens": 9}]},
         GenerationLimit(9, 2, "sampling_params.max_new_tokens")),
        (generate_limit, {"text": "hi", "sampling_params": {"max_new_tokens": None}},
         GenerationLimit(None, 1, "sampling_params.max_new_tokens")),
    ],
)  # fmt: skip
def test_each_route_reads_its_bound_as_sglang_does(
    read: Any, data: dict[str, Any], expected: GenerationLimit
) -> None:
    assert read(data) == expected


@pytest.mark.parametrize("value", [-1, -(10**15), 10**15, MAX_TOKENS_ALLOWED + 1, 2.5, 10.0,
                                   "10", True, [1]])  # fmt: skip
@pytest.mark.parametrize(
    ("read", "make", "param"),
    [
        (completions_limit, lambda v: {"prompt": "hi", "max_tokens": v}, "max_tokens"),
        (chat_limit, lambda v: {"messages": CHAT, "max_tokens": v}, "max_tokens"),
        (chat_limit, lambda v: {"messages": CHAT, "max_completion_tokens": v},
         "max_completion_tokens"),
        (generate_limit, lambda v: {"text": "hi", "sampling_params": {"max_new_tokens": v}},
         "sampling_params.max_new_tokens"),
        (generate_limit, lambda v: {"text": ["a"], "sampling_params": [{"max_new_tokens": v}]},
         "sampling_params[0].max_new_tokens"),
    ],
)  # fmt: skip
def test_a_bad_bound_is_refused_naming_the_field_and_what_is_allowed(
    read: Any, make: Any, param: str, value: Any
) -> None:
    with pytest.raises(ClientError) as refused:
        read(make(value))
    err = refused.value
    assert (err.status, err.param) == (400, param)
    assert err.message.startswith(f"{param}: ")
    assert f"allowed: an integer from 0 to {MAX_TOKENS_ALLOWED}" in err.message


def test_the_allowance_is_capped_by_the_context() -> None:
    limit = GenerationLimit(100, 1, "max_tokens")
    assert limit.allowance(10, None, 999) == 100
    assert limit.allowance(10, 50, 999) == 40  # the prompt leaves 40 in the context
    assert limit.allowance(60, 50, 999) == 0
    unbounded = GenerationLimit(None, 1, "max_completion_tokens")
    assert unbounded.allowance(10, 50, 999) == 40  # the context's remainder
    assert unbounded.allowance(10, None, 999) == 999  # nothing bounds it: as stated
    assert GenerationLimit(100, 3, "max_tokens").allowance(10, 50, 0) == 150  # a batch
