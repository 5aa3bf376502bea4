"""Compare a real SGLang engine's JSON answers (and SSE streams) with the twin's.

`json_differences` walks both answers: every key on both sides, the same JSON types, the same
values — except where `tests.twin_differences` lists an intended difference. A stream is
compared by its kinds of chunks (consecutive chunks of one shape count once, since an engine
may merge token updates into one chunk) and, fully, by its last data chunk and its usage chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tests.twin_differences import JSON_DIFFERENCES, ONLY_ON_REAL

Signature = tuple[tuple[str, str], ...]


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    raise TypeError(f"not a JSON value: {value!r:.80}")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def json_differences(real: Any, twin: Any, path: str = "") -> list[str]:
    """How `twin` differs from `real`, one line per difference, naming the path."""
    listed = JSON_DIFFERENCES.get(path)
    real_type, twin_type = json_type(real), json_type(twin)
    if listed is not None and listed.aspect == "type":
        return []
    if real_type != twin_type:
        return [f"{path or '.'}: real {real_type} {real!r:.60}, twin {twin_type} {twin!r:.60}"]
    if isinstance(real, dict):
        found = []
        for key in real.keys() - twin.keys():
            if path or key not in ONLY_ON_REAL:
                found.append(f"{_join(path, key)}: only on the real engine ({real[key]!r:.60})")
        for key in twin.keys() - real.keys():
            found.append(f"{_join(path, key)}: only on the twin ({twin[key]!r:.60})")
        for key in real.keys() & twin.keys():
            found += json_differences(real[key], twin[key], _join(path, key))
        return sorted(found)
    if isinstance(real, list):
        if len(real) != len(twin):
            return [f"{path}: real has {len(real)} elements, twin {len(twin)}"]
        found = []
        for r, t in zip(real, twin, strict=True):
            found += json_differences(r, t, path + "[]")
        return found
    if listed is None and real != twin:
        return [f"{path or '.'}: real {real!r:.60}, twin {twin!r:.60}"]
    return []


def signature(value: Any, path: str = "") -> Signature:
    """The shape of a JSON value: every leaf's path and JSON type (any type where the types
    differ on purpose)."""
    if isinstance(value, dict):
        return tuple(sorted(s for k, v in value.items() for s in signature(v, _join(path, k))))
    if isinstance(value, list):
        return tuple(sorted({s for v in value for s in signature(v, path + "[]")})) or (
            (path, "empty list"),
        )
    listed = JSON_DIFFERENCES.get(path)
    return ((path, "any" if listed and listed.aspect == "type" else json_type(value)),)


def chunk_kinds(chunks: Sequence[Any]) -> list[Signature]:
    """The shapes of a stream's chunks, consecutive repeats counted once."""
    kinds: list[Signature] = []
    for chunk in chunks:
        shape = signature(chunk)
        if not kinds or kinds[-1] != shape:
            kinds.append(shape)
    return kinds


def _is_usage(chunk: Any) -> bool:
    return isinstance(chunk, dict) and chunk.get("choices") == [] and "usage" in chunk


def stream_differences(real: Sequence[Any], twin: Sequence[Any]) -> list[str]:
    """How the twin's stream of chunks differs from the real engine's."""
    found = []
    real_kinds, twin_kinds = chunk_kinds(real), chunk_kinds(twin)
    if real_kinds != twin_kinds:
        found.append(
            f"kinds of chunks differ: real {len(real_kinds)} kinds over {len(real)} chunks, "
            f"twin {len(twin_kinds)} kinds over {len(twin)} chunks; "
            + "; ".join(
                f"#{i}: real-only {sorted(set(r) - set(t))}, twin-only {sorted(set(t) - set(r))}"
                for i, (r, t) in enumerate(zip(real_kinds, twin_kinds, strict=False))
                if r != t
            )
        )
    for name, pick in (("usage chunk", _is_usage), ("last data chunk", None)):
        r = [c for c in real if (pick(c) if pick else not _is_usage(c))]
        t = [c for c in twin if (pick(c) if pick else not _is_usage(c))]
        if bool(r) != bool(t):
            found.append(f"{name}: real has {len(r)}, twin {len(t)}")
        elif r:
            found += [f"{name}: {d}" for d in json_differences(r[-1], t[-1])]
    return found
