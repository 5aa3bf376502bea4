"""A KV-event replay read in rounds (`tpuserve_router.kv.kv_replay`): each round's run up to its
first hole, and what one round over a real ZMQ ROUTER socket brings."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from sglang_tpu.kv_events import END_SEQ_BYTES
from tpuserve_router.kv import kv_replay
from tpuserve_router.kv.kv_replay import leading_run, read_round

pytestmark = pytest.mark.unit


def batches(*seqs: int) -> list[tuple[int, bytes]]:
    return [(seq, b"batch %d" % seq) for seq in seqs]


def test_the_run_ends_at_the_first_hole() -> None:
    assert leading_run(batches(0, 1, 2, 5, 6)) == batches(0, 1, 2)
    assert leading_run(batches(7, 8, 9)) == batches(7, 8, 9)
    assert leading_run(batches(4)) == batches(4)
    assert leading_run([]) == []


async def serve_one(router: zmq.asyncio.Socket, held: range, *, end_marker: bool) -> int:
    """Answer one replay request from ``held`` as an engine does; the start it asked for."""
    identity, _, start = await router.recv_multipart()
    first = int.from_bytes(start, "big")
    for seq in held:
        if seq >= first:
            await router.send_multipart([identity, b"", seq.to_bytes(8, "big"), b"p%d" % seq])
    if end_marker:
        await router.send_multipart([identity, b"", END_SEQ_BYTES, b""])
    return first


async def test_a_round_brings_the_batches_from_its_start_and_whether_it_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kv_replay, "REPLAY_TIMEOUT_SECONDS", 0.2)
    context = zmq.asyncio.Context()
    router = context.socket(zmq.ROUTER)
    router.bind("tcp://127.0.0.1:*")
    endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
    try:
        served = asyncio.ensure_future(serve_one(router, range(10), end_marker=True))
        answer = await read_round(context, endpoint, 4, 8)
        assert await served == 4
        assert answer is not None
        assert answer.ended
        assert [seq for seq, _ in answer.batches] == [4, 5, 6, 7]  # not past its end

        served = asyncio.ensure_future(serve_one(router, range(10), end_marker=False))
        answer = await read_round(context, endpoint, 6)  # went silent: not ended
        assert await served == 6
        assert answer is not None
        assert not answer.ended
        assert [seq for seq, _ in answer.batches] == [6, 7, 8, 9]

        served = asyncio.ensure_future(serve_one(router, range(0), end_marker=False))
        assert await read_round(context, endpoint, 0) is None  # no answer at all
        await served
    finally:
        context.destroy(linger=0)
