"""sglang-router's multi-tenant character radix tree, re-implemented as the anchor needs it.

Behaviour follows ``sgl-router/src/policies/tree.rs`` (reference router.md §3.2):

- ``insert(text, tenant)`` walks or splits edges; every node on the path gets
  ``tenant_last_access_time[tenant] = now``; the first time a tenant is attached to a node its
  ``tenant_char_count`` grows by the node's length. The root is stamped too, so
  ``insert("", url)`` registers a worker with 0 characters.
- ``prefix_match(text) -> (matched_chars, tenant)`` walks while edges match fully; a partial
  edge match adds the shared characters and stops *on that child*. The tenant returned is the
  first key of that deepest node's tenant map (DashMap order in Rust, insertion order here),
  and its timestamp is refreshed from that node to the root. A cold tree returns ``"empty"``.
- ``get_smallest_tenant()`` is the tenant with the fewest characters (first of equals).
- ``evict_tenant_by_size(max_size)``: collect every (tenant, node) where the node is a leaf
  for that tenant, pop the oldest first; skip tenants already at or under ``max_size``;
  otherwise detach the tenant, unlink the node if nobody holds it and it has no children, and
  queue the parent when it became a leaf for that tenant.
- ``remove_tenant(tenant)``: the same leaf-up sweep for one tenant.

Time is milliseconds from the injected clock, so the anchor replays on the virtual clock.
"""

from __future__ import annotations

import heapq
import itertools

EMPTY = "empty"


class Node:
    __slots__ = ("children", "parent", "tenants", "text")

    def __init__(self, text: str, parent: Node | None) -> None:
        self.text = text
        self.parent = parent
        self.children: dict[str, Node] = {}
        self.tenants: dict[str, int] = {}


def _shared(a: str, b: str, start: int) -> int:
    """Characters `a` shares with ``b[start:]`` from the front."""
    limit = min(len(a), len(b) - start)
    if b.startswith(a[:limit], start):
        return limit
    low, high = 0, limit
    while low < high:
        mid = (low + high + 1) // 2
        if b.startswith(a[:mid], start):
            low = mid
        else:
            high = mid - 1
    return low


class SglangTree:
    def __init__(self) -> None:
        self.root = Node("", None)
        self.tenant_char_count: dict[str, int] = {}

    def insert(self, text: str, tenant: str, now_ms: int) -> None:
        root = self.root
        root.tenants[tenant] = now_ms
        counts = self.tenant_char_count
        counts.setdefault(tenant, 0)
        prev = root
        pos = 0
        end = len(text)
        while pos < end:
            curr = prev
            child = curr.children.get(text[pos])
            if child is None:
                new = Node(text[pos:], curr)
                counts[tenant] += end - pos
                new.tenants[tenant] = now_ms
                curr.children[text[pos]] = new
                prev = new
                pos = end
                continue
            shared = _shared(child.text, text, pos)
            if shared < len(child.text):
                upper = Node(child.text[:shared], curr)
                upper.tenants = dict(child.tenants)
                child.text = child.text[shared:]
                child.parent = upper
                upper.children[child.text[0]] = child
                curr.children[upper.text[0]] = upper
                prev = upper
            else:
                prev = child
            if tenant not in prev.tenants:
                counts[tenant] += len(prev.text)
            prev.tenants[tenant] = now_ms
            pos += shared

    def prefix_match(self, text: str, now_ms: int) -> tuple[int, str]:
        """(matched characters, tenant) as sglang-router's ``prefix_match``."""
        prev = self.root
        pos = 0
        end = len(text)
        while pos < end:
            child = prev.children.get(text[pos])
            if child is None:
                break
            shared = _shared(child.text, text, pos)
            pos += shared
            prev = child
            if shared < len(child.text):
                break
        tenant = next(iter(prev.tenants), EMPTY)
        if tenant != EMPTY:
            node: Node | None = prev
            while node is not None:
                node.tenants[tenant] = now_ms
                node = node.parent
        return pos, tenant

    def get_smallest_tenant(self) -> str:
        if not self.tenant_char_count:
            return EMPTY
        return min(self.tenant_char_count.items(), key=lambda kv: kv[1])[0]

    @staticmethod
    def _leaf_of(node: Node) -> list[str]:
        below: set[str] = set()
        for child in node.children.values():
            below.update(child.tenants)
        return [t for t in node.tenants if t not in below]

    def _unlink_if_empty(self, node: Node) -> None:
        parent = node.parent
        if (
            not node.children
            and not node.tenants
            and parent is not None
            and parent.children.get(node.text[:1]) is node
        ):
            del parent.children[node.text[:1]]

    def evict_tenant_by_size(self, max_size: int) -> None:
        heap: list[tuple[int, int, str, Node]] = []
        seq = itertools.count()
        stack = [self.root]
        while stack:
            curr = stack.pop()
            stack.extend(curr.children.values())
            for tenant in self._leaf_of(curr):
                heap.append((curr.tenants[tenant], next(seq), tenant, curr))
        heapq.heapify(heap)
        counts = self.tenant_char_count
        while heap:
            _, _, tenant, node = heapq.heappop(heap)
            if counts.get(tenant, 0) <= max_size:
                continue
            if tenant in node.tenants:
                counts[tenant] = max(0, counts[tenant] - len(node.text))
                del node.tenants[tenant]
            self._unlink_if_empty(node)
            parent = node.parent
            if parent is not None and tenant in self._leaf_of(parent):
                heapq.heappush(heap, (parent.tenants[tenant], next(seq), tenant, parent))

    def remove_tenant(self, tenant: str) -> None:
        queue: list[Node] = []
        stack = [self.root]
        while stack:
            curr = stack.pop()
            stack.extend(curr.children.values())
            if tenant in self._leaf_of(curr):
                queue.append(curr)
        while queue:
            curr = queue.pop(0)
            curr.tenants.pop(tenant, None)
            self._unlink_if_empty(curr)
            parent = curr.parent
            if parent is not None and tenant in self._leaf_of(parent):
                queue.append(parent)
        self.tenant_char_count.pop(tenant, None)
