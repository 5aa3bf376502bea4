"""The prefix tree answers like a brute-force model, keeps its invariants, and stays bounded."""

from __future__ import annotations

import random

import pytest

from tpuserve_router.policies.prefix_tree import PrefixTree, _Node

pytestmark = pytest.mark.unit


def common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def check_invariants(tree: PrefixTree) -> None:
    root = tree._root
    count = 0
    chars: dict[str, int] = {}
    leaves: dict[str, set[_Node]] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        for key, child in node.children.items():
            count += 1
            assert child.parent is node
            assert child.text
            assert child.text[0] == key
            assert child.tenants, "a node nobody holds must be unlinked"
            if node is not root:
                assert child.tenants.keys() <= node.tenants.keys()
            stack.append(child)
        if node is root:
            continue
        for tenant in node.tenants:
            chars[tenant] = chars.get(tenant, 0) + len(node.text)
            if not any(tenant in c.tenants for c in node.children.values()):
                leaves.setdefault(tenant, set()).add(node)
        if len(node.children) == 1:
            (only,) = node.children.values()
            assert only.tenants.keys() != node.tenants.keys(), "mergeable nodes must be merged"
    assert count == tree.node_count
    for tenant in tree.tenants():
        assert tree.tenant_chars(tenant) == chars.get(tenant, 0)
        assert tree._tenants[tenant].leaves == leaves.get(tenant, set())


def random_text(rng: random.Random) -> str:
    stems = ["system: be brief. ", "system: be kind. ", "tools: search, math. ", ""]
    return rng.choice(stems) + "".join(rng.choice("abc") for _ in range(rng.randint(0, 12)))


def test_match_equals_brute_force_without_eviction() -> None:
    rng = random.Random(5)
    tree = PrefixTree(max_chars_per_tenant=10**9)
    held: dict[str, list[str]] = {}
    for _ in range(600):
        text, tenant = random_text(rng), rng.choice("wxyz")
        tree.insert(text, tenant)
        held.setdefault(tenant, []).append(text)
        probe = random_text(rng)
        expected = {t: max(common_prefix(s, probe) for s in texts) for t, texts in held.items()}
        expected = {t: n for t, n in expected.items() if n > 0}
        assert tree.match(probe) == expected
    check_invariants(tree)


def test_invariants_hold_through_eviction_and_tenant_removal() -> None:
    rng = random.Random(11)
    tree = PrefixTree(max_chars_per_tenant=120)
    for step in range(3_000):
        text, tenant = random_text(rng), rng.choice("wxyz")
        tree.insert(text, tenant)
        assert tree.tenant_chars(tenant) <= 120 or len(text) > 120
        if text:
            assert tree.match(text).get(tenant) == len(text), "the newest text is never evicted"
        if step % 500 == 499:
            tree.remove_tenant(rng.choice("wxyz"))
        if step % 50 == 0:
            check_invariants(tree)
    check_invariants(tree)


def test_eviction_drops_the_least_recently_used_text_first() -> None:
    tree = PrefixTree(max_chars_per_tenant=30)
    tree.insert("a" * 10, "w")
    tree.insert("b" * 10, "w")
    tree.insert("c" * 10, "w")
    tree.insert("a" * 10, "w")  # touch a: b is now the oldest
    tree.insert("d" * 10, "w")
    assert tree.match("b" * 10) == {}
    assert tree.match("a" * 10) == {"w": 10}
    assert tree.match("c" * 10) == {"w": 10}


def test_a_shared_hot_stem_outlives_its_old_leaves() -> None:
    tree = PrefixTree(max_chars_per_tenant=60)
    stem = "S" * 20
    for i in range(26):
        tree.insert(stem + chr(ord("a") + i) * 5, "w")
    assert tree.match(stem + "#####") == {"w": 20}
    assert tree.match(stem + "aaaaa") == {"w": 20}  # evicted long ago
    assert tree.match(stem + "zzzzz") == {"w": 25}
    assert tree.tenant_chars("w") <= 60
    check_invariants(tree)


def test_remove_tenant_leaves_other_tenants_intact_and_merges_splits() -> None:
    tree = PrefixTree(max_chars_per_tenant=1000)
    tree.insert("hello world", "a")
    tree.insert("hello there", "b")
    assert tree.node_count == 3
    tree.remove_tenant("a")
    assert tree.match("hello world") == {"b": 6}
    assert tree.node_count == 1
    check_invariants(tree)


def test_memory_stays_flat_over_many_distinct_prompts() -> None:
    tree = PrefixTree(max_chars_per_tenant=5_000)
    rng = random.Random(2)
    for i in range(4_000):
        tree.insert(f"{rng.random()}" * 5, f"w{i % 4}")
    nodes = tree.node_count
    for i in range(4_000):
        tree.insert(f"{rng.random()}" * 5, f"w{i % 4}")
    assert tree.node_count <= nodes * 1.1
    assert tree.total_chars <= 4 * 5_000
    assert all(len(t.heap) <= 2 * len(t.leaves) + 64 for t in tree._tenants.values())


def test_rejects_a_non_positive_budget() -> None:
    with pytest.raises(ValueError, match="max_chars_per_tenant must be >= 1, got 0"):
        PrefixTree(0)
