"""Where a dead or draining engine's conversations go: one successor each, the same on every
router replica, by rendezvous hashing.

When an engine dies its KV-event stream drops (the publisher's socket disconnects, or the
engine comes back empty: `kv_events` resyncs it) and the block index forgets what it held;
when it drains (or its probes fail) it leaves the candidates while its blocks are still
indexed. Either way the next turn of a conversation it held finds no live holder of its
history, and the usual miss rule (least loaded, then fewest cached blocks, then in turns) is
this replica's own view: two replicas can send the same conversation to different engines,
and the turn after that may go to a third. So the policy remembers, for a while
(``failover_ttl_seconds``), the block keys a lost stream held (`Successors.remember`), and a
prompt whose longest prefix was held by a worker that is gone (remembered, or an unhealthy
candidate that still has it indexed), deeper than any live worker holds and deep enough to
have been a hit, goes to its *successor*: the live worker with the highest rendezvous
(highest-random-weight) hash of the deepest lost block's key and the worker's name
(`rendezvous`). Keys are the same in every replica of one version (chained hashes of token
ids) and so are the workers' names (their URLs), so every replica picks the same successor,
whatever its load view; each conversation gets its own (the key is its own history's), so a
dead engine's conversations spread evenly over the live ones, and removing another worker
moves only the conversations that were on it. The successor then stores the conversation,
its KV events reach every replica, and later turns follow the index as usual: the
conversation stays there, also after the dead engine is back: the worker that lost a
conversation is never its successor while the loss is remembered, so its return does not
take back conversations that moved on (nor, were the successor to evict them, pull them
back to it).

Bounded: at most `MAX_KEYS` keys are remembered in all (about 70 bytes each), the oldest
loss's first; each loss is forgotten after ``failover_ttl_seconds``. Nothing here runs
unless something was lost: `active` is false, and the policy looks at unhealthy candidates
only when there are some.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Final

from tpuserve_router.policies.base import Clock

MAX_KEYS: Final = 1 << 17
"""The most block keys remembered from lost workers, in all (about 9 MiB at most)."""

_MASK: Final = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finalizer: a well-spread 64-bit hash of a 64-bit value."""
    x &= _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


_name_hashes: dict[str, int] = {}


def name_hash(name: str) -> int:
    """A worker name's 64-bit hash, the same in every process (``hash(str)`` is salted)."""
    value = _name_hashes.get(name)
    if value is None:
        digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
        value = int.from_bytes(digest, "little")
        if len(_name_hashes) < 4096:
            _name_hashes[name] = value
    return value


def rendezvous(key: int, names: Sequence[str]) -> int:
    """The index in ``names`` of ``key``'s successor: the highest ``mix(key ^ hash(name))``
    (ties, which need a 64-bit collision, to the first listed)."""
    best = 0
    best_weight = -1
    for i, name in enumerate(names):
        weight = _mix(key ^ name_hash(name))
        if weight > best_weight:
            best, best_weight = i, weight
    return best


class Successors:
    """The block keys of lost workers, for ``ttl_seconds`` each, at most ``max_keys``."""

    def __init__(self, clock: Clock, ttl_seconds: float, max_keys: int = MAX_KEYS) -> None:
        self._clock = clock
        self.ttl_seconds = ttl_seconds
        self.max_keys = max_keys
        self._keys: dict[int, tuple[float, str]] = {}  # key -> (forgotten at, lost by)
        self.chosen = 0  # requests sent to a successor

    @property
    def active(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def remember(self, keys: Iterable[int | None], worker: str = "") -> int:
        """Remember ``keys`` (a lost stream's, of ``worker``; None entries skipped) until the
        TTL; the number remembered."""
        until = (self._clock() + self.ttl_seconds, worker)  # one tuple for the loss's keys
        held = self._keys
        count = 0
        for key in keys:
            if key is None:
                continue
            held.pop(key, None)  # re-remembered: now the newest
            held[key] = until
            count += 1
        while len(held) > self.max_keys:
            del held[next(iter(held))]
        return count

    def expire(self) -> None:
        held = self._keys
        if not held:
            return
        now = self._clock()
        while held:
            first = next(iter(held))
            if held[first][0] > now:
                break
            del held[first]

    def depth(self, keys: Sequence[int]) -> int:
        """How many leading ``keys`` a lost worker held."""
        held = self._keys
        depth = 0
        for key in keys:
            if key not in held:
                break
            depth += 1
        return depth

    def lost_by(self, key: int) -> str | None:
        """The worker that lost ``key`` (remembered), or None."""
        loss = self._keys.get(key)
        return None if loss is None else loss[1]
