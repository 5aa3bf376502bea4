"""The KV-snapshot exchange's wire over peering: a request names the asker's size bound, an
answer is a snapshot, none, too large, or refused naming what was wrong with it."""

from __future__ import annotations

import pytest

from tpuserve_router.peering.peer_snapshot import (
    NONE,
    REQUEST,
    SNAPSHOT,
    TOO_LARGE,
    UNKNOWN,
    SnapshotError,
    answer_body,
    asked_bound,
    request_frames,
    snapshot_endpoint,
)

pytestmark = pytest.mark.unit


def test_a_request_carries_the_askers_size_bound() -> None:
    assert asked_bound(request_frames(1024)) == 1024


@pytest.mark.parametrize(
    "frames",
    [[], [REQUEST], [b"kv-snapshot/0", b"1024"], [REQUEST, b"-1"], [REQUEST, b"1", b"x"]],
)
def test_a_request_that_cannot_be_read_has_no_bound(frames: list[bytes]) -> None:
    assert asked_bound(frames) is None


def test_an_answer_gives_the_packed_snapshot_or_none() -> None:
    assert answer_body([SNAPSHOT, b"\x80"]) == b"\x80"
    assert answer_body([NONE]) is None


@pytest.mark.parametrize(
    ("frames", "problem"),
    [
        ([TOO_LARGE, b"300000000"], "its snapshot is 300000000 bytes, above --kv-snapshot-max"),
        ([UNKNOWN], "an answer this router cannot read (1 frames"),
        ([SNAPSHOT], "cannot read (1 frames"),
        ([NONE, b"extra"], "cannot read (2 frames"),
        ([], "cannot read (0 frames"),
        ([b"\xff" * 100, b"x", b"y", b"z"], "cannot read (4 frames"),
    ],
)
def test_an_answer_that_gives_no_snapshot_says_why(frames: list[bytes], problem: str) -> None:
    with pytest.raises(SnapshotError) as err:
        answer_body(frames)
    assert problem in str(err.value)


@pytest.mark.parametrize(
    ("peer", "endpoint"),
    [
        ("tcp://10.0.0.7:5570", "tcp://10.0.0.7:5571"),
        ("tcp://[fd00::7]:5570", "tcp://[fd00::7]:5571"),
        ("tcp://router-0.peers.serving.svc:8100", "tcp://router-0.peers.serving.svc:8101"),
    ],
)
def test_a_peers_snapshot_endpoint_is_its_peering_port_plus_one(peer: str, endpoint: str) -> None:
    assert snapshot_endpoint(peer) == endpoint
