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
  are the only signal), and each worker keeps at most ``max_predicted_blocks`` of them
  (least recently routed dropped first).

An engine with data-parallel attention has one KV cache, and one event stream, per DP rank.
Confirmed entries are kept per *stream* (worker, rank): each stream has its own bit, its own
engine hash -> key map, and is cleared on its own (its ``AllBlocksCleared``, restart or
resync). Routing goes to the worker: a worker holds a block when any of its ranks does, and
its match depth is that of its best rank. Predictions are per worker (which rank SGLang's DP
controller picks is not the router's choice).

Streams are bits in an integer mask and a worker is the mask of its streams, so a lookup
costs one dict probe per block no matter how many workers hold it. Time comes from the
injected clock.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

ROOT_KEY = 0x7470757365727665
"""Parent key of a sequence's first block ("tpuserve" in ASCII)."""


def block_keys(token_ids: Sequence[int], page_size: int) -> list[int]:
    """Router keys of the full pages of ``token_ids`` (a trailing partial page has none)."""
    keys: list[int] = []
    append = keys.append
    parent = ROOT_KEY
    for page in zip(*[iter(token_ids)] * page_size, strict=False):  # full pages, as tuples
        parent = hash((parent, page))
        append(parent)
    return keys


@dataclass(slots=True)
class _Stream:
    """One KV cache's event stream: a worker's DP rank (rank 0 for most engines)."""

    bit: int
    engine_keys: dict[int, int | None] = field(default_factory=dict)
    """Engine block hash -> router key (None: an orphan whose parent the index never saw)."""


@dataclass(slots=True)
class _Worker:
    bit: int
    """The bit of its predictions and of its rank-0 stream."""
    mask: int
    """The bits of all its streams."""
    streams: dict[int, _Stream]
    predicted: OrderedDict[int, float] = field(default_factory=OrderedDict)
    """Router key -> expiry time, oldest first."""
    has_events: bool = False


class BlockIndex:
    def __init__(
        self,
        *,
        page_size: int = 16,
        predicted_ttl_seconds: float = 2.0,
        approximate_ttl_seconds: float = 120.0,
        max_predicted_blocks: int = 2**18,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.page_size_learned = False
        self.predicted_ttl_seconds = predicted_ttl_seconds
        self.approximate_ttl_seconds = approximate_ttl_seconds
        self.max_predicted_blocks = max_predicted_blocks
        self._clock = clock
        self._workers: dict[str, _Worker] = {}
        self._free_bits: list[int] = []
        self._next_bit = 1
        self._confirmed: dict[int, int] = {}
        self._predicted: dict[int, int] = {}
        self._next_expiry = float("inf")
        self.orphan_blocks = 0

    # ------------------------------------------------------------------ queries

    def keys(self, token_ids: Sequence[int]) -> list[int]:
        return block_keys(token_ids, self.page_size)

    @property
    def confirmed_blocks(self) -> int:
        """Distinct blocks some worker reported holding."""
        return len(self._confirmed)

    @property
    def predicted_blocks(self) -> int:
        """Distinct blocks only predicted (routed, not yet confirmed by an event)."""
        return len(self._predicted)

    def worker_blocks(self, name: str, rank: int | None = None) -> int:
        """Blocks ``name`` reported holding (confirmed entries only), in all its DP ranks or
        in ``rank``."""
        worker = self._workers.get(name)
        if worker is None:
            return 0
        if rank is not None:
            stream = worker.streams.get(rank)
            return len(stream.engine_keys) if stream else 0
        return sum(len(stream.engine_keys) for stream in worker.streams.values())

    def engine_hashes(self, name: str, rank: int | None = None) -> set[int]:
        """The engine's own block hashes ``name`` reported holding and not yet removed, in
        all its DP ranks or in ``rank``: what its ``BlockStored`` events added and its
        ``BlockRemoved``/``AllBlocksCleared`` did not take away (orphans included)."""
        worker = self._workers.get(name)
        if worker is None:
            return set()
        streams = worker.streams.values() if rank is None else [worker.streams.get(rank)]
        return {h for stream in streams if stream is not None for h in stream.engine_keys}

    def workers(self) -> list[str]:
        return list(self._workers)

    def holds(self, name: str, key: int) -> bool:
        """Whether ``name`` reported holding block ``key`` (confirmed, in any of its ranks)."""
        worker = self._workers.get(name)
        return worker is not None and bool(self._confirmed.get(key, 0) & worker.mask)

    def match(self, keys: Sequence[int], names: Sequence[str]) -> list[int]:
        """For each of ``names``, how many leading blocks of ``keys`` it holds (the best of
        its DP ranks)."""
        self._expire()
        masks = [w.mask if (w := self._workers.get(n)) is not None else 0 for n in names]
        depths = [0] * len(names)
        alive = 0
        for mask in masks:
            alive |= mask
        confirmed = self._confirmed
        predicted = self._predicted
        depth = 0
        for key in keys:
            if not alive:
                break
            held = confirmed.get(key, 0) & alive
            if held != alive and predicted:
                held |= predicted.get(key, 0) & alive
            if held != alive:
                gone = alive & ~held
                for i, mask in enumerate(masks):
                    if mask & gone and not mask & held:  # its last rank dropped out here
                        depths[i] = depth
                alive = held
            depth += 1
        if alive:
            for i, mask in enumerate(masks):
                if mask & alive:
                    depths[i] = depth
        return depths

    # ------------------------------------------------------------------ peer snapshots

    def stream_blocks(self, name: str, rank: int = 0) -> list[tuple[int, int | None]]:
        """A stream's engine hash -> router key entries, as a peer router's snapshot carries
        them (`kv_events.KvEventHub.snapshot`)."""
        worker = self._workers.get(name)
        stream = worker.streams.get(rank) if worker is not None else None
        return list(stream.engine_keys.items()) if stream is not None else []

    def load_stream(self, name: str, rank: int, blocks: Iterable[tuple[int, int | None]]) -> None:
        """Take a peer router's entries for one stream, as if its events had been applied
        here (router keys are the same in every router of this version: `block_keys`)."""
        worker = self._worker(name)
        worker.has_events = True
        stream = worker.streams.get(rank) or self._stream(worker, rank)
        engine_keys = stream.engine_keys
        confirmed = self._confirmed
        for engine_hash, key in blocks:
            if engine_hash in engine_keys:
                continue
            engine_keys[engine_hash] = key
            if key is None:
                self.orphan_blocks += 1
                continue
            confirmed[key] = confirmed.get(key, 0) | stream.bit
            if worker.predicted.pop(key, None) is not None:
                self._drop_predicted(key, worker.bit)

    # ------------------------------------------------------------------ routing predictions

    def predict(self, name: str, keys: Sequence[int]) -> None:
        """Record that ``name`` is about to hold ``keys`` (it was just routed that prompt)."""
        worker = self._worker(name)
        ttl = self.predicted_ttl_seconds if worker.has_events else self.approximate_ttl_seconds
        if ttl <= 0:
            return
        expiry = self._clock() + ttl
        bit = worker.bit
        mask = worker.mask
        entries = worker.predicted
        confirmed = self._confirmed
        predicted = self._predicted
        for key in keys:
            if confirmed.get(key, 0) & mask:
                continue
            if key in entries:
                entries.move_to_end(key)
            else:
                predicted[key] = predicted.get(key, 0) | bit
            entries[key] = expiry
        while len(entries) > self.max_predicted_blocks:
            key, _ = entries.popitem(last=False)
            self._drop_predicted(key, bit)
        if expiry < self._next_expiry:
            self._next_expiry = expiry

    # ------------------------------------------------------------------ engine events

    def store(
        self,
        name: str,
        block_hashes: Sequence[int],
        parent_block_hash: int | None,
        token_ids: Sequence[int],
        block_size: int,
        rank: int = 0,
    ) -> None:
        """Apply a ``BlockStored`` event of ``name``'s DP rank ``rank``: it now holds these
        blocks."""
        worker = self._worker(name)
        worker.has_events = True
        stream = worker.streams.get(rank) or self._stream(worker, rank)
        if block_size >= 1 and not self.page_size_learned:
            self.page_size = block_size
            self.page_size_learned = True
        engine_keys = stream.engine_keys
        parent = ROOT_KEY if parent_block_hash is None else engine_keys.get(parent_block_hash)
        tokens = tuple(token_ids)
        bit = stream.bit
        confirmed = self._confirmed
        predicted = worker.predicted
        for i, engine_hash in enumerate(block_hashes):
            page = tokens[i * block_size : (i + 1) * block_size]
            key = None if parent is None else hash((parent, page))
            if engine_hash in engine_keys:  # stored again: replace the old entry
                old = engine_keys[engine_hash]
                if old is None:
                    self.orphan_blocks -= 1
                elif old != key:
                    self._drop_confirmed(old, bit)
            engine_keys[engine_hash] = key
            if key is None:
                self.orphan_blocks += 1
            else:
                confirmed[key] = confirmed.get(key, 0) | bit
                if predicted.pop(key, None) is not None:
                    self._drop_predicted(key, worker.bit)
            parent = key

    def remove(self, name: str, block_hashes: Iterable[int], rank: int = 0) -> None:
        """Apply a ``BlockRemoved`` event of ``name``'s DP rank ``rank``."""
        worker = self._workers.get(name)
        if worker is None:
            return
        worker.has_events = True
        stream = worker.streams.get(rank)
        if stream is None:
            return
        engine_keys = stream.engine_keys
        for engine_hash in block_hashes:
            if engine_hash not in engine_keys:
                continue
            key = engine_keys.pop(engine_hash)
            if key is None:
                self.orphan_blocks -= 1
            else:
                self._drop_confirmed(key, stream.bit)
                if worker.predicted.pop(key, None) is not None:
                    self._drop_predicted(key, worker.bit)

    def clear(self, name: str, rank: int | None = None) -> None:
        """Drop what ``name`` holds: everything, or only DP rank ``rank``'s confirmed blocks
        (that stream's ``AllBlocksCleared``, restart or resync)."""
        worker = self._workers.get(name)
        if worker is None:
            return
        if rank is not None:
            stream = worker.streams.get(rank)
            if stream is not None:
                self._clear_stream(stream)
            return
        for stream in worker.streams.values():
            self._clear_stream(stream)
        for key in worker.predicted:
            self._drop_predicted(key, worker.bit)
        worker.predicted = OrderedDict()

    def mark_event_feed(self, name: str) -> None:
        """``name`` publishes KV events: its predictions, new and old, get the short time to
        live (the events will soon say what it really holds)."""
        worker = self._worker(name)
        if worker.has_events:
            return
        worker.has_events = True
        latest = self._clock() + self.predicted_ttl_seconds
        for key, expiry in worker.predicted.items():
            if expiry > latest:
                worker.predicted[key] = latest
        self._next_expiry = min(self._next_expiry, latest)

    def forget(self, name: str) -> None:
        """The worker left: drop its entries and free its bits."""
        if name not in self._workers:
            return
        self.clear(name)
        worker = self._workers.pop(name)
        self._free_bits.extend(stream.bit for stream in worker.streams.values())

    # ------------------------------------------------------------------ internals

    def _new_bit(self) -> int:
        if self._free_bits:
            return self._free_bits.pop()
        bit = self._next_bit
        self._next_bit <<= 1
        return bit

    def _worker(self, name: str) -> _Worker:
        worker = self._workers.get(name)
        if worker is None:
            bit = self._new_bit()
            worker = self._workers[name] = _Worker(bit, bit, {0: _Stream(bit)})
        return worker

    def _stream(self, worker: _Worker, rank: int) -> _Stream:
        """A DP rank's stream, seen for the first time (rank 0 exists from the start)."""
        stream = worker.streams[rank] = _Stream(self._new_bit())
        worker.mask |= stream.bit
        return stream

    def _clear_stream(self, stream: _Stream) -> None:
        for key in stream.engine_keys.values():
            if key is None:
                self.orphan_blocks -= 1
            else:
                self._drop_confirmed(key, stream.bit)
        stream.engine_keys = {}

    def _drop_confirmed(self, key: int, bit: int) -> None:
        mask = self._confirmed.get(key, 0) & ~bit
        if mask:
            self._confirmed[key] = mask
        else:
            self._confirmed.pop(key, None)

    def _drop_predicted(self, key: int, bit: int) -> None:
        mask = self._predicted.get(key, 0) & ~bit
        if mask:
            self._predicted[key] = mask
        else:
            self._predicted.pop(key, None)

    def _expire(self) -> None:
        """Drop expired predictions. Sweeps run at most every tenth of the shortest time to
        live, so a prediction lives at most 10 % longer than asked and a lookup rarely pays
        for a sweep."""
        now = self._clock()
        if now < self._next_expiry:
            return
        next_expiry = float("inf")
        for worker in self._workers.values():
            entries = worker.predicted
            while entries:
                key = next(iter(entries))
                expiry = entries[key]
                if expiry > now:
                    next_expiry = min(next_expiry, expiry)
                    break
                del entries[key]
                self._drop_predicted(key, worker.bit)
        ttl = min(self.predicted_ttl_seconds, self.approximate_ttl_seconds)
        self._next_expiry = max(next_expiry, now + ttl / 10)
