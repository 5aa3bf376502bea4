"""The differential tests' comparison accepts a missing key only in the condition listed for it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.component.differential.compare import json_differences, stream_differences

pytestmark = pytest.mark.unit

MISSING = "meta_info.decode_throughput: only on the twin (12.5)"


def answer(**meta: Any) -> dict[str, Any]:
    return {"text": "x", "meta_info": {"prompt_tokens": 4, **meta}}


TWIN = answer(first_token_latency=0.01, e2e_latency=0.05, decode_throughput=12.5)


def test_a_whole_answer_may_lack_decode_throughput_when_its_first_token_time_fell_back() -> None:
    real = answer(first_token_latency=0.02, e2e_latency=0.02)
    assert json_differences(real, TWIN) == []


@pytest.mark.parametrize(
    "meta",
    [
        {"first_token_latency": 0.01, "e2e_latency": 0.02},  # a decode interval: it must be sent
        {"e2e_latency": 0.02},
        {"first_token_latency": None, "e2e_latency": None},
        {},
    ],
)
def test_otherwise_the_missing_key_is_a_difference(meta: dict[str, Any]) -> None:
    twin = answer(**{**meta, "decode_throughput": 12.5})
    assert json_differences(answer(**meta), twin) == [MISSING]


def test_a_stream_must_always_have_it() -> None:
    real = [answer(first_token_latency=0.02, e2e_latency=0.02)]
    assert stream_differences(real, [TWIN]) == [f"last data chunk: {MISSING}"]
