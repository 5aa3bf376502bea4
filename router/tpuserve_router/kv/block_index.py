"""Which worker holds which KV-cache block: the index behind the `precise` and `cost` policies.

Keys are the router's own, computed from token ids (the llm-d pattern), never the engine's
block hashes, so a change in SGLang's hash function cannot break routing: block ``i`` of a
sequence is the chained hash of its page of ``page_size`` tokens and the previous block's
key. ``block_keys(token_ids)`` gives a prompt's keys; the engine's ``BlockStored`` events
are mapped onto the same keys by recomputing them from the event's ``token_ids`` and its
parent block (the index remembers engine hash -> router key per worker, so ``BlockRemoved``
can be applied).

Two kinds of entries:

- *confirmed*: from the engine's KV events; removed by ``BlockRemoved``, ``clear`` (on
  ``AllBlocksCleared``, an engine restart, or a resync after lost events) and ``forget``.
- *predicted*: written by a policy when it routes a request (``predict``), so requests that
  arrive before the engine reports the blocks (sibling bursts) still find them. They expire
  after ``predicted_ttl_seconds`` when the worker publishes KV events (the events soon
  confirm or deny them) and after ``approximate_ttl_seconds`` when it does not (then they
  are the only signal). ``max_predicted_blocks`` bounds them over all workers, so the
  router's memory does not grow with the fleet: each worker keeps at most an equal share
  (least recently routed dropped first; the others' shares are trimmed when a worker joins).

A stream is believed only so far: it holds at most its worker's pool in confirmed blocks
(``set_worker_limit``, from ``/server_info`` at admission; else ``max_stream_blocks``; a
stream that publishes a host tier holds its HBM pool and its host pool, and only
``max_stream_blocks`` bounds it), keeps
the page size of its first ``BlockStored`` (a block of another size is dropped), and the
index keys prompts by the page size most streams have; what is dropped is counted in
``dropped_blocks``.

An engine with data-parallel attention has one KV cache, and one event stream, per DP rank.
Confirmed entries are kept per *stream* (worker, rank): each stream has its own bit, its own
engine hash -> key map, and is cleared on its own (its ``AllBlocksCleared``, restart or
resync). Routing goes to the worker: a worker holds a block when any of its ranks does, and
its match depth is that of its best rank. Predictions are per worker (which rank SGLang's DP
controller picks is not the router's choice).

Streams are bits in a mask and a worker is the mask of its streams, so a lookup costs one
hash-table probe per block no matter how many workers hold it. Time comes from the injected
clock.

The index is compiled (``router/native``, Rust; `tpuserve_router._native`): per request the
policy hashes some 40 pages, matches them against every worker and predicts them, and in
Python those loops were most of its CPU. ``BlockIndex.keys`` gives a prompt's keys as
`BlockKeys`, one native array that ``match`` and ``predict`` read as it is (no Python int
per key on the way). Keys are still CPython's ``hash((parent, page))``,
computed without the tuples, so routers of this release and of the ones before agree on them
(a peer's snapshot carries them).
"""

from __future__ import annotations

from collections.abc import Sequence

from tpuserve_router._native import ROOT_KEY, BlockIndex, BlockKeys, block_keys

__all__ = ["ROOT_KEY", "BlockIndex", "BlockKeys", "block_keys"]

Sequence.register(BlockKeys)  # it is one (len, indexing, slices, iteration, count, index)
