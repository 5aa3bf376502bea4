"""A peer's KV snapshot is checked before a router takes it: format, page size, each stream."""

from __future__ import annotations

from typing import Any

import pytest

from tpuserve_router.kv.block_index import BlockIndex
from tpuserve_router.peering.kv_snapshot import SNAPSHOT_FORMAT, Seeds

pytestmark = pytest.mark.unit


@pytest.fixture
def seeds() -> Seeds:
    return Seeds(BlockIndex(page_size=16))


def snapshot(**changes: Any) -> dict[str, Any]:
    stream = {"worker": "http://10.0.0.1:30000", "rank": 0, "events": "tcp://10.0.0.1:5557",
              "seq": 41, "blocks": [[11, 1234], [12, None]]}  # fmt: skip
    return {"format": SNAPSHOT_FORMAT, "page_size": 32, "streams": [stream], **changes}


def test_a_snapshot_is_kept_for_its_streams_and_teaches_the_page_size(seeds: Seeds) -> None:
    assert seeds.take(snapshot()) == 1
    assert seeds.index.page_size == 32  # no event has told it yet: the peer's is right


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ([], "'format' must be"),
        (snapshot(format="other-1"), "'format' must be 'tpuserve-kv-snapshot-1'"),
        (snapshot(page_size=0), "page_size 0; allowed: an integer from 1 to 1048576"),
        (snapshot(streams={}), "'streams' must be a list"),
        (snapshot(streams=[{"worker": "w", "rank": 0, "events": "e", "seq": 1}]),
         r"streams\[0\] is malformed: KeyError\('blocks'\)"),
        (snapshot(streams=[{"worker": "w", "rank": 0, "events": "e", "seq": "x", "blocks": []}]),
         r"streams\[0\] is malformed: ValueError"),
        (snapshot(streams=[{"worker": "w", "rank": 0, "events": "e", "seq": 1,
                            "blocks": [[1, 2**63]]}]),
         r"streams\[0\] is malformed: .*router key 9223372036854775808 is not a signed 64-bit"),
        (snapshot(streams=[{"worker": "w", "rank": 0, "events": "e", "seq": 1,
                            "blocks": [[2**64, 1]]}]),
         r"streams\[0\] is malformed: .*engine block hash 18446744073709551616 is not a 64-bit"),
    ],
)  # fmt: skip
def test_a_snapshot_the_router_cannot_use_is_refused_naming_why(
    seeds: Seeds, document: object, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        seeds.take(document)
    assert seeds.index.page_size == 16
