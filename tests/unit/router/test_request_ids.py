"""Naming requests on the engine: the router's own ids (random, one width, so none is a prefix
of another), never the client's; the client's rid is written back into its answer only, in
whole answers and in streams cut anywhere; only single generations are aborted by id."""

from __future__ import annotations

import itertools
import os
from typing import Any

import orjson
import pytest

from tpuserve_router.pipeline.request_body import (
    ClientError,
    parse_chat,
    parse_completions,
    parse_generate,
)
from tpuserve_router.pipeline.request_ids import (
    NO_RID,
    Restorer,
    client_rid,
    name_request,
    new_rid,
    with_rid,
)

pytestmark = pytest.mark.unit


def test_ids_are_32_random_hex_digits_and_none_is_a_prefix_of_another() -> None:
    ids = [new_rid() for _ in range(2000)]
    assert len(set(ids)) == 2000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert len({i[:8] for i in ids}) > 1900  # no shared prefix, no counter
    ordered = sorted(ids)
    assert not any(b.startswith(a) for a, b in itertools.pairwise(ordered))


def test_a_forked_child_never_draws_its_parents_next_ids() -> None:
    new_rid()  # the pool holds bytes the parent has not used yet
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.write(write, new_rid().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read, "rb") as pipe:
        childs = pipe.read().decode()
    assert len(childs) == 32
    assert childs not in {new_rid() for _ in range(300)}  # the parent's next pool's worth


@pytest.mark.parametrize("body", [b'{"prompt":"hi"}', b'  {\n "prompt": "hi", "n": 1}'])
def test_the_id_goes_first_and_the_rest_is_untouched(body: bytes) -> None:
    named = with_rid(body, "abc")
    assert named.startswith(b'{"rid":"abc",')
    assert orjson.loads(named) == {"rid": "abc", **orjson.loads(body)}


def name(body: dict[str, Any], single: bool = True) -> tuple[dict[str, Any], Any]:
    raw = orjson.dumps(body)
    ids = name_request(raw, client_rid(body), single)
    return orjson.loads(ids.body), ids


@pytest.mark.parametrize("theirs", ["victim-rid", "", None, "0" * 16])
def test_a_clients_rid_never_reaches_the_engine(theirs: str | None) -> None:
    sent, ids = name({"prompt": "hi", "rid": theirs, "max_tokens": 3})
    assert sent["rid"] == ids.rid
    assert len(sent["rid"]) == 32
    assert sent["rid"] != theirs
    assert {k: v for k, v in sent.items() if k != "rid"} == {"prompt": "hi", "max_tokens": 3}


def test_without_a_rid_the_body_is_forwarded_byte_for_byte_after_the_id() -> None:
    raw = b'{"prompt": "h\\u00e9", "seed": 123456789012345678901234567890}'
    ids = name_request(raw, client_rid(orjson.loads(raw)), True)
    assert ids.body == b'{"rid":"' + (ids.rid or "").encode() + b'",' + raw[1:]
    assert ids.restorer is None  # nothing to write back


def test_a_batchs_list_of_rids_becomes_fresh_ids_as_many() -> None:
    sent, ids = name({"text": ["a", "b"], "rid": ["mine-0", "mine-1"]}, single=False)
    assert len(sent["rid"]) == 2
    assert not {"mine-0", "mine-1"} & set(sent["rid"])
    assert all(len(r) == 32 for r in sent["rid"])
    assert ids.rid is None  # a batch is not aborted by the router
    answer = orjson.dumps([{"meta_info": {"id": r}} for r in sent["rid"]])
    assert ids.restorer is not None
    assert orjson.loads(ids.restorer.whole(answer)) == [
        {"meta_info": {"id": "mine-0"}}, {"meta_info": {"id": "mine-1"}},
    ]  # fmt: skip


def test_a_batch_named_by_one_rid_gets_its_items_ids_back() -> None:
    sent, ids = name({"text": ["a", "b"], "rid": "job"}, single=False)
    ours = sent["rid"]
    assert isinstance(ours, str)
    assert ids.rid is None
    answer = orjson.dumps([{"meta_info": {"id": f"{ours}_{i}"}} for i in range(2)])
    assert ids.restorer is not None
    assert [a["meta_info"]["id"] for a in orjson.loads(ids.restorer.whole(answer))] == [
        "job_0", "job_1",
    ]  # fmt: skip


@pytest.mark.parametrize("rid", [5, {"a": 1}, ["a", 3], True])
def test_a_rid_sglang_refuses_is_refused_naming_the_field(rid: Any) -> None:
    with pytest.raises(ClientError) as refused:
        client_rid({"prompt": "hi", "rid": rid})
    assert (refused.value.status, refused.value.param) == (400, "rid")
    assert "allowed: a string, a list of strings" in refused.value.message


def test_no_rid_member() -> None:
    assert client_rid({"prompt": "hi"}) is NO_RID


@pytest.mark.parametrize("theirs", ["mine", "", 'quo"te\\ and ünï'])
def test_the_clients_rid_is_written_back_into_every_echo(theirs: str) -> None:
    ours = new_rid()
    restorer = Restorer([(ours, theirs)])
    answer = orjson.dumps({"id": ours, "choices": [{"text": "x"}], "meta_info": {"id": ours}})
    assert orjson.loads(restorer.whole(answer)) == {
        "id": theirs, "choices": [{"text": "x"}], "meta_info": {"id": theirs},
    }  # fmt: skip


def test_a_stream_cut_anywhere_gets_the_clients_rid_back() -> None:
    ours = new_rid()
    events = (
        b"".join(
            b"data: " + orjson.dumps({"id": ours, "choices": [{"text": f't{i}"'}]}) + b"\n\n"
            for i in range(3)
        )
        + b"data: [DONE]\n\n"
    )
    expected = events.replace(ours.encode(), b"mine")
    for size in (1, 2, 5, 7, 16, 33, 34, 100):
        restorer = Restorer([(ours, "mine")])
        pieces = [events[i : i + size] for i in range(0, len(events), size)]
        out = b"".join(restorer.chunk(p) for p in pieces) + restorer.rest()
        assert out == expected, size


def test_a_piece_that_only_looks_like_the_start_of_an_id_is_passed_on_later() -> None:
    restorer = Restorer([(new_rid(), "mine")])
    assert restorer.chunk(b'data: {"text": "') == b'data: {"text": '
    assert restorer.chunk(b'hello"}\n\n') == b'"hello"}\n\n'
    assert restorer.chunk(b'ends with a quote "') == b"ends with a quote "
    assert restorer.rest() == b'"'


@pytest.mark.parametrize(
    ("parse", "data", "single"),
    [
        (parse_completions, {"prompt": "hi"}, True),
        (parse_completions, {"prompt": [1, 2, 3]}, True),
        (parse_completions, {"prompt": "hi", "rid": "mine"}, True),
        (parse_completions, {"prompt": ["a", "b"]}, False),  # a batch
        (parse_completions, {"prompt": "hi", "n": 2}, False),  # two samples
        (parse_completions, {"prompt": "hi", "rid": ["x"]}, False),
        (parse_chat, {"messages": [{"role": "user", "content": "hi"}]}, True),
        (parse_chat, {"messages": [{"role": "user", "content": "hi"}], "n": 3}, False),
        (parse_generate, {"text": "hi", "rid": "g"}, True),
        (parse_generate, {"input_ids": [[1], [2]]}, False),
        (parse_generate, {"text": "hi", "sampling_params": {"n": 2}}, False),
    ],
)
def test_only_one_generation_is_aborted_by_its_id(
    parse: Any, data: dict[str, Any], single: bool
) -> None:
    parsed = parse(data, False, None, None)
    assert parsed.single == single
    ids = name_request(orjson.dumps(data), client_rid(data), parsed.single)
    assert (ids.rid is not None) == single
    assert ids.rid is None or orjson.loads(ids.body)["rid"] == ids.rid
