"""What a KV-event replay must be to be applied (`KvEventHub._whole`): in order, without a
hole, and for a bounded range every batch of it (or, not ``whole``, for a stream that knows
nothing: its last run without a hole, reaching the range's end)."""

from __future__ import annotations

import pytest

from tpuserve_router.kv_events import KvEventHub

pytestmark = pytest.mark.unit

ENDPOINT = "tcp://127.0.0.1:5558"


def found(*seqs: int) -> dict[int, bytes]:
    return {seq: b"batch %d" % seq for seq in seqs}


def seqs(replayed: list[tuple[int, bytes]] | None) -> list[int] | None:
    return None if replayed is None else [seq for seq, _ in replayed]


def test_an_unbounded_replay_in_order_is_taken_also_when_the_buffer_wrapped() -> None:
    assert seqs(KvEventHub._whole(ENDPOINT, found(7, 5, 6), 0, None)) == [5, 6, 7]
    assert seqs(KvEventHub._whole(ENDPOINT, {}, 0, None)) == []


def test_a_replay_with_a_hole_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    # The engine's ROUTER socket dropped batches 3 and 4 on the way: applying 5 after 2 would
    # leave the index without what 3 and 4 stored or removed.
    assert KvEventHub._whole(ENDPOINT, found(0, 1, 2, 5, 6), 0, None) is None
    assert "lost batches" in caplog.text
    assert KvEventHub._whole(ENDPOINT, found(10, 11, 13), 10, 14) is None


def test_a_bounded_range_must_come_whole() -> None:
    assert seqs(KvEventHub._whole(ENDPOINT, found(3, 4, 5), 3, 6)) == [3, 4, 5]
    assert KvEventHub._whole(ENDPOINT, found(4, 5), 3, 6) is None  # 3 is gone


def test_a_run_up_to_the_end_may_start_late_when_not_whole() -> None:
    assert seqs(KvEventHub._whole(ENDPOINT, found(4, 5), 0, 6, whole=False)) == [4, 5]
    assert KvEventHub._whole(ENDPOINT, found(3, 4), 0, 6, whole=False) is None  # not up to 5
    assert seqs(KvEventHub._whole(ENDPOINT, found(2, 3, 5), 0, 6, whole=False)) == [5]
    assert KvEventHub._whole(ENDPOINT, {}, 0, 6, whole=False) is None


def test_a_stream_that_knows_nothing_takes_the_last_run_after_a_hole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The engine's ROUTER socket dropped batches 3 and 4 of a replay from 0: starting from
    # nothing, 5 and 6 alone leave blocks out but keep none the engine removed.
    replayed = KvEventHub._whole(ENDPOINT, found(0, 1, 2, 5, 6), 0, None, whole=False)
    assert seqs(replayed) == [5, 6]
    assert "applying the run 5..6" in caplog.text
    assert seqs(KvEventHub._whole(ENDPOINT, found(9, 1, 2, 4, 5, 7), 0, None, whole=False)) == [9]
