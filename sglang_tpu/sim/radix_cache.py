"""A token-level radix cache with SGLang's semantics, emitting SGLang's KV events.

It mirrors ``sglang/srt/mem_cache/radix_cache.py`` where behaviour is visible from outside:

- keys are token ids; with ``page_size > 1`` inserted and matched keys are truncated to whole
  pages and nodes split only at page boundaries (children are keyed by their first page);
- ``match_prefix`` splits a node when a match ends inside it and refreshes access order;
- a node with ``lock_ref > 0`` is in use by a request and never evicted; ``evict`` removes
  least-recently-used *unlocked leaves* until enough tokens are freed, re-considering a parent
  that becomes a leaf;
- events: one ``BlockStored`` per page of every newly created node (parent hash = the
  previous page's hash, None for a page hanging off the root), one ``BlockRemoved`` per page
  of every evicted node, ``AllBlocksCleared`` on reset; splits emit nothing, because page
  hashes are position-chained and do not change when a node is split.

With a host tier (``host_tokens > 0``, SGLang's HiCache; docs/host-kv-tier.md) a node may hold
its KV on the device, in host memory, or both, and publishes what SGLang's unified tree does
(``medium`` ``GPU`` or ``CPU_PINNED``):

- a page gets its host copy when it is cached (``write_through``), on its second hit
  (``write_through_selective``) or when the device evicts it (``write_back``): ``BlockStored``
  ``CPU_PINNED``; a copy that finds the host pool full first evicts host LRU leaves, and is
  skipped when that does not make room;
- a device eviction of a node with a host copy *demotes* it (``BlockRemoved`` ``GPU``; the node
  stays, host-only); one without a copy deletes it with its host-only descendants;
- device-resident nodes stay a prefix-closed subtree: a device leaf may have host-only
  children; ``match_prefix_tiers`` returns the device prefix and the host-only part after it,
  ``load_back`` copies that part to the device (``BlockStored`` ``GPU``; the host copy stays);
- host eviction is LRU over host-only leaves (and, under ``write_back``, host copies of
  device-resident nodes, as SGLang reclaims duplicates): ``BlockRemoved`` ``CPU_PINNED``;
- inserting over a host-only node puts it back on the device (``BlockStored`` ``GPU``).

Access order uses a counter instead of wall time, so runs on the virtual clock are exactly
reproducible. Page hashes are computed lazily (only when events are on or the debug view is
read), since SHA-256 per page is the most expensive thing the cache would otherwise do.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sglang_tpu.hicache import WRITE_THROUGH_HITS
from sglang_tpu.kv_events import (
    MEDIUM_GPU,
    MEDIUM_HOST,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    digest_to_int64,
    page_digest,
)

ChildKey = int | tuple[int, ...]


class TreeNode:
    __slots__ = (
        "children",
        "digests",
        "hits",
        "id",
        "key",
        "last_access",
        "lock_ref",
        "on_device",
        "on_host",
        "parent",
    )

    def __init__(self, node_id: int, key: list[int], parent: TreeNode | None) -> None:
        self.id = node_id
        self.key = key
        self.parent = parent
        self.children: dict[ChildKey, TreeNode] = {}
        self.lock_ref = 0
        self.last_access = 0
        self.digests: list[bytes] | None = None
        self.on_device = True  # its KV is in the device pool
        self.on_host = False  # it has a copy in the host tier
        self.hits = 1  # requests that matched it, its creation counted (write-through hits)

    def __lt__(self, other: TreeNode) -> bool:
        return self.last_access < other.last_access


@dataclass(frozen=True, slots=True)
class CachedBlock:
    """One page as the debug view and a KV-event subscriber both see it."""

    block_hash: int
    parent_block_hash: int | None
    token_ids: tuple[int, ...]


class RadixCache:
    def __init__(
        self,
        page_size: int = 1,
        emit_events: bool = False,
        host_tokens: int = 0,
        write_policy: str = "write_through",
    ) -> None:
        if page_size < 1:
            raise ValueError(f"--page-size: {page_size!r} is not allowed; allowed: >= 1")
        if write_policy not in WRITE_THROUGH_HITS:
            allowed = ", ".join(WRITE_THROUGH_HITS)
            raise ValueError(f"write policy {write_policy!r} is not allowed; allowed: {allowed}")
        self.page_size = page_size
        self.emit_events = emit_events
        self.host_capacity = host_tokens
        self.write_policy = write_policy
        self._backup_hits = WRITE_THROUGH_HITS[write_policy]
        self.host_size = 0  # tokens with a host copy
        self._host_leaves: set[TreeNode] = set()
        self._host_heap: list[tuple[int, int, TreeNode]] = []
        self.evicted_host_tokens_total = 0
        self.backed_up_tokens_total = 0
        self.loaded_back_tokens_total = 0
        self._events: list[KVEvent] = []
        self._next_id = 0
        self._tick = 0
        self.root = TreeNode(-1, [], None)
        self.root.lock_ref = 1
        self.root.digests = []
        self._evictable_leaves: set[TreeNode] = set()
        # Lazy LRU heap of (last_access, node id, node): an entry is live only while the node
        # is an evictable leaf with that access stamp; stale entries are skipped on pop.
        self._heap: list[tuple[int, int, TreeNode]] = []
        self.evictable_size = 0
        self.protected_size = 0
        self.evicted_tokens_total = 0

    # --- public API -------------------------------------------------------------------

    def reset(self) -> None:
        """Drop every node (SGLang's flush); emits AllBlocksCleared."""
        self.root = TreeNode(-1, [], None)
        self.root.lock_ref = 1
        self.root.digests = []
        self._evictable_leaves.clear()
        self._heap = []
        self.evictable_size = 0
        self.protected_size = 0
        self._host_leaves.clear()
        self._host_heap = []
        self.host_size = 0
        if self.emit_events:
            self._events.append(AllBlocksCleared())

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    def _aligned(self, n: int) -> int:
        return n - n % self.page_size if self.page_size > 1 else n

    def _as_list(self, key: Sequence[int]) -> tuple[list[int], int]:
        """`key` as a list (copied only when it is not one) and its page-aligned length."""
        key = key if isinstance(key, list) else list(key)
        return key, self._aligned(len(key))

    def _next_tick(self) -> int:
        """A new LRU time: every node a lookup or insert touches gets the same one."""
        self._tick += 1
        return self._tick

    def _child_key(self, key: Sequence[int], start: int = 0) -> ChildKey:
        if self.page_size == 1:
            return key[start]
        return tuple(key[start : start + self.page_size])

    def _match_len(self, node_key: list[int], key: Sequence[int], start: int, end: int) -> int:
        """Tokens (whole pages when paged) that `node_key` shares with key[start:end]."""
        n = len(node_key)
        if n <= end - start and node_key == key[start : start + n]:
            return n  # the common case: the whole node matches (one C-level comparison)
        limit = min(n, end - start)
        i = 0
        if self.page_size == 1:
            while i < limit and node_key[i] == key[start + i]:
                i += 1
            return i
        p = self.page_size
        while i + p <= limit and node_key[i : i + p] == key[start + i : start + i + p]:
            i += p
        return i

    def match_prefix(self, key: Sequence[int]) -> tuple[int, TreeNode]:
        """Length of the longest cached prefix and its last node; splits and refreshes LRU."""
        key, n = self._as_list(key)
        tick = self._next_tick()
        node, pos = self.root, 0
        while pos < n:
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            self._touch(child, tick)
            matched = self._match_len(child.key, key, pos, n)
            if matched < len(child.key):
                node = self._split(child, matched)
                pos += matched
                break
            node = child
            pos += matched
        return pos, node

    @property
    def tiered(self) -> bool:
        """Whether there is a host tier."""
        return self.host_capacity > 0

    def peek_prefix_length(self, key: Sequence[int]) -> int:
        """Cached prefix length in any tier, without touching the tree (for oracle routers,
        the waiting queue's uncached tokens and tests)."""
        key, n = self._as_list(key)
        node, pos = self.root, 0
        while pos < n:
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            matched = self._match_len(child.key, key, pos, n)
            pos += matched
            if matched < len(child.key):
                break
            node = child
        return pos

    def match_prefix_tiers(self, key: Sequence[int]) -> tuple[int, int, TreeNode]:
        """(device prefix, host-only tokens after it, last matched node) of `key`; splits,
        refreshes LRU and counts a hit on every matched node (write-through-selective)."""
        key, n = self._as_list(key)
        tick = self._next_tick()
        node, pos, device = self.root, 0, 0
        while pos < n:
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            self._touch(child, tick)
            matched = self._match_len(child.key, key, pos, n)
            whole = matched == len(child.key)
            node = child if whole else self._split(child, matched)
            pos += matched
            if node.on_device:
                device = pos
                node.hits += 1
                if self._backup_hits is not None and node.hits >= self._backup_hits:
                    self._backup(node)
            if not whole:
                break
        return device, pos - device, node

    def load_back(self, node: TreeNode) -> int:
        """Put the host-only nodes on `node`'s path back on the device (the caller made room
        and holds a lock on `node`); returns the tokens loaded."""
        path: list[TreeNode] = []
        while node is not self.root and not node.on_device:
            path.append(node)
            assert node.parent is not None
            node = node.parent
        loaded = 0
        for item in reversed(path):
            self._to_device(item)
            loaded += len(item.key)
        self.loaded_back_tokens_total += loaded
        return loaded

    def insert(self, key: Sequence[int]) -> int:
        """Insert the page-aligned part of `key`; returns the length that was already cached."""
        key, n = self._as_list(key)
        tick = self._next_tick()
        node, pos = self.root, 0
        while pos < n:
            ck = self._child_key(key, pos)
            child = node.children.get(ck)
            if child is None:
                new = TreeNode(self._new_id(), list(key[pos:n]), node)
                new.last_access = tick
                node.children[ck] = new
                self.evictable_size += len(new.key)
                self._update_leaf(node)
                self._update_leaf(new)
                if self.emit_events:
                    self._record_store(new, MEDIUM_GPU)
                if self._backup_hits == 1:
                    self._backup(new)
                return pos
            self._touch(child, tick)
            matched = self._match_len(child.key, key, pos, n)
            pos += matched
            node = self._split(child, matched) if matched < len(child.key) else child
            if not node.on_device:  # recomputed: SGLang's _unevict_node_on_insert
                self._to_device(node)
        return pos

    def inc_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0 and node.on_device:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            self._update_leaf(node)
            assert node.parent is not None
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 1 and node.on_device:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
            node.lock_ref -= 1
            self._update_leaf(node)
            assert node.parent is not None
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Evict LRU unlocked leaves until `num_tokens` are freed; returns tokens freed."""
        heap = self._heap
        leaves = self._evictable_leaves
        freed = 0
        while freed < num_tokens and heap:
            access, _, leaf = heapq.heappop(heap)
            if leaf not in leaves or access != leaf.last_access:
                continue  # stale entry
            freed += len(leaf.key)
            if self.tiered:
                self._evict_tiered(leaf)
                continue
            parent = leaf.parent
            assert parent is not None
            if self.emit_events:
                self._record_remove(leaf, MEDIUM_GPU)
            del parent.children[self._child_key(leaf.key)]
            leaves.discard(leaf)
            leaf.parent = None
            self.evictable_size -= len(leaf.key)
            self._update_leaf(parent)
        self.evicted_tokens_total += freed
        if len(heap) > 4 * len(leaves) + 1024:  # drop stale entries now and then
            self._heap = [(n.last_access, n.id, n) for n in leaves]
            heapq.heapify(self._heap)
        return freed

    def evict_host(self, num_tokens: int) -> int:
        """Free host-tier room: LRU host-only leaves (and, under write_back, host copies of
        device-resident nodes) until `num_tokens` are freed; returns tokens freed."""
        heap = self._host_heap
        leaves = self._host_leaves
        freed = 0
        while freed < num_tokens and heap:
            access, _, node = heapq.heappop(heap)
            if node not in leaves or access != node.last_access:
                continue
            leaves.discard(node)
            freed += len(node.key)
            if self.emit_events:
                self._record_remove(node, MEDIUM_HOST)
            node.on_host = False
            self.host_size -= len(node.key)
            if not node.on_device:
                self._detach(node)
        self.evicted_host_tokens_total += freed
        if len(heap) > 4 * len(leaves) + 1024:
            self._host_heap = [(n.last_access, n.id, n) for n in leaves]
            heapq.heapify(self._host_heap)
        return freed

    def take_events(self) -> list[KVEvent]:
        events, self._events = self._events, []
        return events

    def blocks(self) -> list[CachedBlock]:
        """Every cached page with its event hash and parent hash (the debug view)."""
        out: list[CachedBlock] = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            digests = self._ensure_digests(node)
            parent = self._parent_hash(node)
            for i, digest in enumerate(digests):
                h = digest_to_int64(digest)
                start = i * self.page_size
                page = tuple(node.key[start : start + self.page_size])
                out.append(CachedBlock(h, parent, page))
                parent = h
            stack.extend(node.children.values())
        return out

    def debug_tree(self) -> list[dict[str, Any]]:
        """Nodes as nested dicts (tokens, lock_ref, children) for `/debug/radix_cache`."""

        def walk(node: TreeNode) -> dict[str, Any]:
            return {
                "id": node.id,
                "tokens": len(node.key),
                "token_ids": node.key,
                "lock_ref": node.lock_ref,
                "children": [walk(c) for c in node.children.values()],
            }

        return [walk(c) for c in self.root.children.values()]

    # --- internals --------------------------------------------------------------------

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _split(self, child: TreeNode, split_len: int) -> TreeNode:
        parent = child.parent
        assert parent is not None
        new = TreeNode(self._new_id(), child.key[:split_len], parent)
        new.lock_ref = child.lock_ref
        new.last_access = child.last_access
        new.on_device, new.on_host, new.hits = child.on_device, child.on_host, child.hits
        parent.children[self._child_key(child.key)] = new
        child.key = child.key[split_len:]
        child.parent = new
        new.children[self._child_key(child.key)] = child
        if child.digests is not None:
            pages = split_len if self.page_size == 1 else split_len // self.page_size
            new.digests, child.digests = child.digests[:pages], child.digests[pages:]
        # Sizes are unchanged: the tokens only moved between two nodes of one lock state.
        return new

    def _update_leaf(self, node: TreeNode) -> None:
        if not self.tiered:
            if node is self.root or node.lock_ref > 0 or node.children:
                self._evictable_leaves.discard(node)
            elif node not in self._evictable_leaves:
                self._evictable_leaves.add(node)
                heapq.heappush(self._heap, (node.last_access, node.id, node))
            return
        device_leaf = (
            node is not self.root
            and node.on_device
            and node.lock_ref == 0
            and not any(c.on_device for c in node.children.values())
        )
        if not device_leaf:
            self._evictable_leaves.discard(node)
        elif node not in self._evictable_leaves:
            self._evictable_leaves.add(node)
            heapq.heappush(self._heap, (node.last_access, node.id, node))
        host_leaf = (
            node is not self.root
            and node.on_host
            and node.lock_ref == 0
            and (
                (not node.on_device and not node.children)
                or (node.on_device and self.write_policy == "write_back")
            )
        )
        if not host_leaf:
            self._host_leaves.discard(node)
        elif node not in self._host_leaves:
            self._host_leaves.add(node)
            heapq.heappush(self._host_heap, (node.last_access, node.id, node))

    def _backup(self, node: TreeNode) -> bool:
        """Give a device node its host copy (BlockStored CPU_PINNED); False when the host
        pool has no room even after evicting host LRU leaves."""
        if node.on_host:
            return True
        size = len(node.key)
        short = self.host_size + size - self.host_capacity
        if short > 0:
            locked = node.lock_ref
            node.lock_ref += 1  # not its own victim (a write-back duplicate)
            self._update_leaf(node)
            self.evict_host(short)
            node.lock_ref = locked
            self._update_leaf(node)
            if self.host_size + size > self.host_capacity:
                return False
        node.on_host = True
        self.host_size += size
        self.backed_up_tokens_total += size
        if self.emit_events:
            self._record_store(node, MEDIUM_HOST)
        self._update_leaf(node)
        return True

    def _to_device(self, node: TreeNode) -> None:
        """A host-only node's KV is on the device again (loaded back or recomputed)."""
        node.on_device = True
        if node.lock_ref > 0:
            self.protected_size += len(node.key)
        else:
            self.evictable_size += len(node.key)
        if self.emit_events:
            self._record_store(node, MEDIUM_GPU)
        self._update_leaf(node)
        if node.parent is not None:
            self._update_leaf(node.parent)

    def _evict_tiered(self, leaf: TreeNode) -> None:
        """Free a device leaf's device KV: demote it when it has (or, under write_back, gets)
        a host copy, else delete it with its host-only descendants."""
        if not leaf.on_host and self.write_policy == "write_back":
            self._backup(leaf)
        self._evictable_leaves.discard(leaf)
        self.evictable_size -= len(leaf.key)
        leaf.on_device = False
        if self.emit_events:
            self._record_remove(leaf, MEDIUM_GPU)
        if leaf.on_host:
            self._update_leaf(leaf)
            assert leaf.parent is not None
            self._update_leaf(leaf.parent)
            return
        stack = list(leaf.children.values())
        while stack:  # host-only by construction: a device child would make leaf no leaf
            below = stack.pop()
            stack.extend(below.children.values())
            if self.emit_events:
                self._record_remove(below, MEDIUM_HOST)
            self.host_size -= len(below.key)
            self._host_leaves.discard(below)
        leaf.children = {}
        self._detach(leaf)

    def _detach(self, node: TreeNode) -> None:
        """Take a node with nothing left in any tier out of the tree."""
        parent = node.parent
        assert parent is not None
        del parent.children[self._child_key(node.key)]
        node.parent = None
        self._update_leaf(parent)

    def _touch(self, node: TreeNode, tick: int) -> None:
        node.last_access = tick
        if node in self._evictable_leaves:
            heapq.heappush(self._heap, (tick, node.id, node))

    def _ensure_digests(self, node: TreeNode) -> list[bytes]:
        if node.digests is not None:
            return node.digests
        parent = node.parent
        assert parent is not None
        prior = self._ensure_digests(parent)[-1] if parent is not self.root else None
        digests: list[bytes] = []
        for start in range(0, len(node.key), self.page_size):
            prior = page_digest(node.key[start : start + self.page_size], prior)
            digests.append(prior)
        node.digests = digests
        return digests

    def _parent_hash(self, node: TreeNode) -> int | None:
        parent = node.parent
        if parent is None or parent is self.root:
            return None
        return digest_to_int64(self._ensure_digests(parent)[-1])

    def _record_store(self, node: TreeNode, medium: str) -> None:
        parent_hash = self._parent_hash(node)
        p = self.page_size
        for i, digest in enumerate(self._ensure_digests(node)):
            h = digest_to_int64(digest)
            page = node.key[i * p : i * p + p]
            self._events.append(BlockStored([h], parent_hash, page, len(page), None, medium))
            parent_hash = h

    def _record_remove(self, node: TreeNode, medium: str) -> None:
        for digest in self._ensure_digests(node):
            self._events.append(BlockRemoved([digest_to_int64(digest)], medium))
