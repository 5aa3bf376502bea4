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

Access order uses a counter instead of wall time, so runs on the virtual clock are exactly
reproducible. Page hashes are computed lazily (only when events are on or the debug view is
read), since SHA-256 per page is the most expensive thing the cache would otherwise do.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sglang_tpu.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    digest_to_int64,
    page_digest,
)

ChildKey = int | tuple[int, ...]


class TreeNode:
    __slots__ = ("children", "digests", "id", "key", "last_access", "lock_ref", "parent")

    def __init__(self, node_id: int, key: list[int], parent: TreeNode | None) -> None:
        self.id = node_id
        self.key = key
        self.parent = parent
        self.children: dict[ChildKey, TreeNode] = {}
        self.lock_ref = 0
        self.last_access = 0
        self.digests: list[bytes] | None = None

    def __lt__(self, other: TreeNode) -> bool:
        return self.last_access < other.last_access


@dataclass(frozen=True, slots=True)
class CachedBlock:
    """One page as the debug view and a KV-event subscriber both see it."""

    block_hash: int
    parent_block_hash: int | None
    token_ids: tuple[int, ...]


class RadixCache:
    def __init__(self, page_size: int = 1, emit_events: bool = False) -> None:
        if page_size < 1:
            raise ValueError(f"--page-size: {page_size!r} is not allowed; allowed: >= 1")
        self.page_size = page_size
        self.emit_events = emit_events
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

    def peek_prefix_length(self, key: Sequence[int]) -> int:
        """Cached prefix length without touching the tree (for oracle routers and tests)."""
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
                    self._record_store(new)
                return pos
            self._touch(child, tick)
            matched = self._match_len(child.key, key, pos, n)
            pos += matched
            node = self._split(child, matched) if matched < len(child.key) else child
        return pos

    def inc_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            self._update_leaf(node)
            assert node.parent is not None
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 1:
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
            parent = leaf.parent
            assert parent is not None
            if self.emit_events:
                self._record_remove(leaf)
            del parent.children[self._child_key(leaf.key)]
            leaves.discard(leaf)
            leaf.parent = None
            self.evictable_size -= len(leaf.key)
            freed += len(leaf.key)
            self._update_leaf(parent)
        self.evicted_tokens_total += freed
        if len(heap) > 4 * len(leaves) + 1024:  # drop stale entries now and then
            self._heap = [(n.last_access, n.id, n) for n in leaves]
            heapq.heapify(self._heap)
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
        if node is self.root or node.lock_ref > 0 or node.children:
            self._evictable_leaves.discard(node)
        elif node not in self._evictable_leaves:
            self._evictable_leaves.add(node)
            heapq.heappush(self._heap, (node.last_access, node.id, node))

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

    def _record_store(self, node: TreeNode) -> None:
        parent_hash = self._parent_hash(node)
        p = self.page_size
        for i, digest in enumerate(self._ensure_digests(node)):
            h = digest_to_int64(digest)
            page = node.key[i * p : i * p + p]
            self._events.append(BlockStored([h], parent_hash, page, len(page), None, MEDIUM_GPU))
            parent_hash = h

    def _record_remove(self, node: TreeNode) -> None:
        for digest in self._ensure_digests(node):
            self._events.append(BlockRemoved([digest_to_int64(digest)], MEDIUM_GPU))
