"""`sglang_tpu.hicache` says what SGLang 0.5.23's HiCache does, read from the wheel's sources.

Each fact the module (and docs/host-kv-tier.md) states is checked against the file it came
from: the flags' choices and defaults, the reserve, the write-through thresholds, the
`StorageMedium` values, and which `medium` each step of the unified tree records.
"""

from __future__ import annotations

import ast
import re

import pytest

from sglang_tpu import hicache
from sglang_tpu.kv_events import MEDIUM_GPU, MEDIUM_HOST
from sglang_tpu.topology import GIB, lookup
from tests.sglang_wheel import source

pytestmark = pytest.mark.unit


def _field_defaults(path: str) -> dict[str, ast.expr | None]:
    """Annotated class fields of a module: name -> default expression."""
    tree = ast.parse(source(path).read_text())
    return {
        node.target.id: node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }


def _choices(annotation_default: str, field: str, text: str) -> list[str]:
    block = text[text.index(f"    {field}: A[") :]
    block = block[: block.index(f"] = {annotation_default}")]
    match = re.search(r"choices=\[([^\]]*)\]", block, re.S)
    assert match is not None, field
    return [c.strip().strip('"') for c in match.group(1).split(",") if c.strip()]


def test_flags_and_defaults_are_the_wheels() -> None:
    path = "srt/arg_groups/fields/memory.py"
    defaults = _field_defaults(path)
    text = source(path).read_text()
    literal = {k: ast.literal_eval(v) for k, v in defaults.items() if v is not None}
    assert literal["enable_hierarchical_cache"] is False
    assert literal["hicache_write_policy"] == hicache.DEFAULT_WRITE_POLICY
    assert literal["hicache_host_memory_fraction"] == hicache.DEFAULT_HOST_MEMORY_FRACTION
    assert literal["hicache_size"] == 0
    assert literal["hicache_ratio"] is None
    policies = _choices('"write_through"', "hicache_write_policy", text)
    assert sorted(policies) == sorted(hicache.WRITE_POLICIES)
    assert hicache.IO_BACKEND in _choices('"kernel"', "hicache_io_backend", text)
    for flag in (hicache.FLAG_SIZE, hicache.FLAG_RATIO, hicache.FLAG_WRITE_POLICY):
        assert flag.removeprefix("--").replace("-", "_") in literal


def test_default_ratio_reserve_and_thresholds_are_the_wheels() -> None:
    hook = source("srt/arg_groups/hicache_hook.py").read_text()
    assert f'1.2 if cfg.hicache_host_memory_mode == "buffer_only" else {hicache.DEFAULT_RATIO}' in (
        " ".join(hook.split())
    )
    base = source("srt/mem_cache/pool_host/base.py").read_text()
    reserve = re.search(r"HICACHE_HOST_MEMORY_RESERVE_BYTES: int = (.+)", base)
    assert reserve is not None
    assert reserve.group(1).strip() == "10 * (1024**3)"
    assert hicache.SGLANG_RESERVE_BYTES == 10 * 1024**3
    assert "host_size * 1e9 // self.size_per_token" in base  # --hicache-size counts 10**9
    attach = source("srt/mem_cache/unified_cache/storage_attachment.py").read_text()
    assert '1 if hicache_write_policy == "write_through" else 2' in attach
    assert hicache.WRITE_THROUGH_HITS == {
        "write_through": 1,
        "write_through_selective": 2,
        "write_back": None,
    }


def test_media_are_the_storage_medium_values() -> None:
    tree = ast.parse(source("srt/disaggregation/kv_events.py").read_text())
    (medium,) = [
        n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "StorageMedium"
    ]
    values = {
        s.targets[0].id: ast.literal_eval(s.value)
        for s in medium.body
        if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name)
    }
    assert (values["GPU"], values["CPU"]) == hicache.MEDIA == (MEDIUM_GPU, MEDIUM_HOST)


def _recorded(function: ast.FunctionDef) -> set[tuple[str, str]]:
    """(record_store | record_remove, medium member) of every call in `function`."""
    found: set[tuple[str, str]] = set()
    for call in ast.walk(function):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
            continue
        if call.func.attr not in ("record_store", "record_remove"):
            continue
        medium: ast.expr | None = next(
            (k.value for k in call.keywords if k.arg == "medium"),
            call.args[1] if len(call.args) > 1 else None,
        )
        name = medium.attr if isinstance(medium, ast.Attribute) else "default"
        if isinstance(medium, ast.Name):
            name = f"param:{medium.id}"
        found.add((call.func.attr, name))
    return found


def test_each_tier_step_records_the_documented_medium() -> None:
    """docs/host-kv-tier.md's table: which step publishes which event with which medium."""
    tree = ast.parse(source("srt/mem_cache/unified_cache/unified_tree_core.py").read_text())
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    expected = {
        "_add_new_node": {("record_store", "default")},  # GPU, events.py's default
        "_unevict_node_on_insert": {("record_store", "GPU")},
        "finish_write_through": {("record_store", "CPU")},
        "_demote": {("record_remove", "GPU")},
        "commit_load_back": {("record_store", "GPU")},
        "_evict_host_leaf": {("record_remove", "CPU")},
        "_release_full_host_duplicate": {("record_remove", "CPU")},
        "insert_host": {("record_store", "CPU")},
        "_release_all_component_layers": {("record_remove", "param:medium")},
    }
    for name, records in expected.items():
        assert _recorded(functions[name]) == records, name
    events = source("srt/mem_cache/events.py").read_text()
    assert events.count("medium = StorageMedium.GPU") == 2  # both records default to GPU


def test_largest_size_is_the_pods_memory_less_engine_and_reserve_per_rank() -> None:
    shape = lookup("v5e", "2x4")  # 8 ranks on one host
    limit = 300 * GIB
    budget = limit - hicache.ENGINE_HOST_BYTES - hicache.SGLANG_RESERVE_BYTES
    assert hicache.max_size_gb(shape, limit) == int(budget / 8 / 10**9)
    assert hicache.max_size_gb(shape, 20 * GIB) == 0  # nothing left for a pool
    assert hicache.host_bytes_per_host(shape, size_gb=30, ratio=None, device_pool_bytes=0) == (
        30 * 10**9 * 8
    )
    two_hosts = lookup("v5e", "4x4")
    assert hicache.host_bytes_per_host(
        two_hosts, size_gb=None, ratio=3.0, device_pool_bytes=100.0
    ) == pytest.approx(3.0 * 100.0 / two_hosts.hosts)


def test_flags() -> None:
    assert hicache.flags(12, None, "write_back") == [
        "--enable-hierarchical-cache",
        "--hicache-write-policy",
        "write_back",
        "--hicache-io-backend",
        "direct",
        "--hicache-size",
        "12",
    ]
    assert hicache.flags(None, 2.5, "write_through")[-2:] == ["--hicache-ratio", "2.5"]
    assert "--hicache-size" not in hicache.flags(None, None, "write_through")
