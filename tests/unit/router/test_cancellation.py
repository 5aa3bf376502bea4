"""Naming requests so a worker can abort them: ids unique and shaped as SGLang's, inserted
at the front of a body without disturbing it; only single generations are named."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tpuserve_router.cancellation import new_rid, with_rid
from tpuserve_router.request_body import parse_chat, parse_completions, parse_generate

pytestmark = pytest.mark.unit


def test_ids_are_32_hex_digits_and_never_repeat() -> None:
    ids = {new_rid() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


@pytest.mark.parametrize("body", [b'{"prompt":"hi"}', b'  {\n "prompt": "hi", "n": 1}'])
def test_the_id_goes_first_and_the_rest_is_untouched(body: bytes) -> None:
    named = with_rid(body, "abc")
    assert named.startswith(b'{"rid":"abc",')
    assert orjson.loads(named) == {"rid": "abc", **orjson.loads(body)}


@pytest.mark.parametrize(
    ("parse", "data", "rid", "single"),
    [
        (parse_completions, {"prompt": "hi"}, None, True),
        (parse_completions, {"prompt": [1, 2, 3]}, None, True),
        (parse_completions, {"prompt": "hi", "rid": "mine"}, "mine", True),
        (parse_completions, {"prompt": ["a", "b"]}, None, False),  # a batch
        (parse_completions, {"prompt": "hi", "n": 2}, None, False),  # two samples
        (parse_completions, {"prompt": "hi", "rid": ["x"]}, None, False),
        (parse_chat, {"messages": [{"role": "user", "content": "hi"}]}, None, True),
        (parse_chat, {"messages": [{"role": "user", "content": "hi"}], "n": 3}, None, False),
        (parse_generate, {"text": "hi", "rid": "g"}, "g", True),
        (parse_generate, {"input_ids": [[1], [2]]}, None, False),
        (parse_generate, {"text": "hi", "sampling_params": {"n": 2}}, None, False),
    ],
)
def test_only_one_generation_is_named_by_its_rid(
    parse: Any, data: dict[str, Any], rid: str | None, single: bool
) -> None:
    parsed = parse(data, False, None, None)
    assert (parsed.rid, parsed.single) == (rid, single)
