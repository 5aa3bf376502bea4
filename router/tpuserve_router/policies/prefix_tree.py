"""A character radix tree shared by all workers of a model, for approximate prefix routing.

Each node is a compressed edge of text. A node records which *tenants* (workers) hold it
and when each last touched it (a logical clock, one tick per insert). Inserting a request's
text for a worker attaches the worker to every node on the path, so a tenant present on a
node is present on all its ancestors; `match` walks the path once and reports, for every
tenant, how many leading characters it holds.

Memory is bounded per tenant, like an engine's KV cache: when a tenant holds more than
``max_chars_per_tenant`` characters, its least recently used *tenant-leaves* (nodes it
holds below which it holds nothing) are detached, oldest first, right away during the
insert that overflowed (no background thread). A node no tenant holds is unlinked, and a
node left with a single child holding the same tenants is merged back into it, so the tree
never keeps splits it no longer needs (the leak of Dynamo's radix tree, dynamo#10774).

Eviction order uses one min-heap per tenant with lazy entries: a node is pushed when it
becomes a tenant-leaf; an entry whose node stopped being a leaf is dropped when popped, and
one whose node was touched since is pushed again with its newer time. The heap is rebuilt
when stale entries outnumber live ones, so it stays proportional to the tree.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field


class _Node:
    __slots__ = ("children", "parent", "tenants", "text")

    def __init__(self, text: str, parent: _Node | None) -> None:
        self.text = text
        self.parent = parent
        self.children: dict[str, _Node] = {}
        self.tenants: dict[str, int] = {}


@dataclass(slots=True)
class _Tenant:
    chars: int = 0
    leaves: set[_Node] = field(default_factory=set)
    heap: list[tuple[int, int, _Node]] = field(default_factory=list)


class PrefixTree:
    """Multi-tenant radix tree over characters with per-tenant LRU eviction."""

    def __init__(self, max_chars_per_tenant: int) -> None:
        if max_chars_per_tenant < 1:
            raise ValueError(f"max_chars_per_tenant must be >= 1, got {max_chars_per_tenant}")
        self.max_chars_per_tenant = max_chars_per_tenant
        self._root = _Node("", None)
        self._tenants: dict[str, _Tenant] = {}
        self._tick = 0
        self._seq = 0  # heap tie-breaker, so entries never compare nodes
        self.node_count = 0

    # ------------------------------------------------------------------ queries

    def tenant_chars(self, tenant: str) -> int:
        """Characters held by ``tenant`` (0 if unknown)."""
        state = self._tenants.get(tenant)
        return state.chars if state else 0

    @property
    def total_chars(self) -> int:
        """Characters held, summed over tenants (what the memory bound applies to)."""
        return sum(t.chars for t in self._tenants.values())

    def tenants(self) -> list[str]:
        return list(self._tenants)

    def match(self, text: str) -> dict[str, int]:
        """For every tenant holding a prefix of ``text``, the length of that prefix."""
        matched: dict[str, int] = {}
        node = self._root
        pos = 0
        end = len(text)
        while pos < end:
            child = node.children.get(text[pos])
            if child is None:
                break
            edge = child.text
            if text.startswith(edge, pos):
                pos += len(edge)
                full = True
            else:
                pos += _common_prefix_length(edge, text, pos)
                full = False
            matched.update(dict.fromkeys(child.tenants, pos))
            if not full:
                break
            node = child
        return matched

    # ------------------------------------------------------------------ updates

    def insert(self, text: str, tenant: str) -> None:
        """Record that ``tenant`` now holds ``text``; evict its oldest text if over budget."""
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _Tenant()
        if not text:
            return
        self._tick += 1
        now = self._tick
        leaves = state.leaves
        node = self._root
        path: list[_Node] = []
        joined = False  # the tenant was added to a node that existed before this insert
        fresh = False  # the path ends in a node created by this insert
        pos = 0
        end = len(text)
        while pos < end:
            child = node.children.get(text[pos])
            if child is None:
                tenants = node.tenants
                if not node.children and len(tenants) == 1 and tenant in tenants and node.parent:
                    # Only this tenant's leaf ends here: lengthen it rather than chain a
                    # child that would hold exactly the same tenants.
                    node.text += text[pos:]
                    state.chars += end - pos
                    tenants[tenant] = now
                    break
                child = _Node(text[pos:], node)
                node.children[text[pos]] = child
                self.node_count += 1
                child.tenants[tenant] = now
                state.chars += end - pos
                fresh = True
                leaves.discard(node)
                path.append(child)
                node = child
                break
            edge = child.text
            if text.startswith(edge, pos):
                pos += len(edge)
            else:
                common = _common_prefix_length(edge, text, pos)
                if pos + common == end and tenant in child.tenants:
                    # The text ends inside an edge the tenant holds whole: splitting
                    # would only make a node that must be merged back later.
                    pos = end
                else:
                    child = self._split(child, common)
                    pos += common
            tenants = child.tenants
            if tenant not in tenants:
                state.chars += len(child.text)
                joined = True
            tenants[tenant] = now
            # The path goes on below ``node``, so it is no longer one of the tenant's leaves.
            leaves.discard(node)
            node = child
            path.append(child)
        if node not in leaves and (fresh or not _has_child_with(node, tenant)):
            leaves.add(node)
            self._push(state, node, now)
        if joined:
            # Adding the tenant along the path can make a node agree with its only child.
            below = node
            for upper in reversed(path[:-1]):
                if len(upper.children) == 1 and upper.tenants.keys() == below.tenants.keys():
                    self._merge_into_child(upper)
                else:
                    below = upper
        if state.chars > self.max_chars_per_tenant:
            self._evict(tenant, state)

    def remove_tenant(self, tenant: str) -> None:
        """Forget everything ``tenant`` holds (the worker left or its cache was reset)."""
        if self._tenants.pop(tenant, None) is None:
            return
        touched: list[_Node] = []
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.tenants.pop(tenant, None) is not None:
                touched.append(node)
                stack.extend(node.children.values())
        # Descendants were appended after their ancestors: tidy bottom-up.
        for node in reversed(touched):
            if node.parent is not None:
                self._tidy(node)

    # ------------------------------------------------------------------ internals

    def _split(self, child: _Node, length: int) -> _Node:
        """Cut ``child``'s edge after ``length`` chars; return the new upper node."""
        parent = child.parent
        assert parent is not None
        upper = _Node(child.text[:length], parent)
        upper.tenants = dict(child.tenants)
        child.text = child.text[length:]
        child.parent = upper
        upper.children[child.text[0]] = child
        parent.children[upper.text[0]] = upper
        self.node_count += 1
        return upper

    def _push(self, state: _Tenant, node: _Node, time: int) -> None:
        self._seq += 1
        heapq.heappush(state.heap, (time, self._seq, node))

    def _evict(self, tenant: str, state: _Tenant) -> None:
        """Detach the tenant's least recently used leaves until it fits its budget."""
        heap = state.heap
        leaves = state.leaves
        root = self._root
        while heap and state.chars > self.max_chars_per_tenant:
            time, _, node = heapq.heappop(heap)
            if node not in leaves:
                continue  # stale entry: the node grew a child or was already evicted
            current = node.tenants[tenant]
            if current != time:
                self._push(state, node, current)  # touched since: requeue at its real age
                continue
            leaves.discard(node)
            del node.tenants[tenant]
            state.chars -= len(node.text)
            parent = node.parent
            assert parent is not None
            if parent is not root and not _has_child_with(parent, tenant):
                leaves.add(parent)
                self._push(state, parent, parent.tenants[tenant])
            self._tidy(node)
        if len(heap) > 2 * len(leaves) + 64:
            state.heap = [(n.tenants[tenant], i, n) for i, n in enumerate(leaves)]
            heapq.heapify(state.heap)

    def _tidy(self, node: _Node) -> None:
        """Unlink ``node`` if nobody holds it; merge it into its only child if they agree."""
        parent = node.parent
        assert parent is not None
        if not node.tenants:
            if node.children:
                return  # emptied children not tidied yet; the last one to go unlinks us
            del parent.children[node.text[0]]
            node.parent = None
            self.node_count -= 1
            if parent is not self._root:
                self._tidy(parent)
            return
        if len(node.children) == 1:
            (child,) = node.children.values()
            if child.tenants.keys() == node.tenants.keys():
                self._merge_into_child(node)

    def _merge_into_child(self, node: _Node) -> None:
        """Fold ``node`` into its only child, which holds exactly the same tenants."""
        parent = node.parent
        assert parent is not None
        (child,) = node.children.values()
        child.text = node.text + child.text
        child.parent = parent
        child.tenants = node.tenants  # the upper node was touched at least as late
        parent.children[child.text[0]] = child
        node.parent = None
        node.children = {}
        self.node_count -= 1


def _has_child_with(node: _Node, tenant: str) -> bool:
    return any(tenant in child.tenants for child in node.children.values())


def _common_prefix_length(edge: str, text: str, pos: int) -> int:
    """Length of the common prefix of ``edge`` and ``text[pos:]``.

    Prefixes usually diverge within a few characters, so the search gallops: it compares
    chunks of doubling size (each one C-level ``startswith``) and then bisects the last one.
    """
    limit = min(len(edge), len(text) - pos)
    low = 0
    step = 8
    while low < limit:
        high = min(limit, low + step)
        if text.startswith(edge[low:high], pos + low):
            low = high
            step *= 2
        else:
            break
    else:
        return low
    high -= 1  # the answer is in [low, high]
    while low < high:
        mid = (low + high + 1) // 2
        if text.startswith(edge[low:mid], pos + low):
            low = mid
        else:
            high = mid - 1
    return low
