"""Compare a real SGLang engine's JSON answers (and SSE streams) with the twin's.

`json_differences` walks both answers: every key on both sides, the same JSON types, the same
values — except where `tests.twin_differences` lists an intended difference (or a key a real
engine leaves out in a condition its answer shows). A stream is
compared by the shapes of its chunks (not their number: an engine may merge token updates into
one chunk) and, fully, by its last data chunk and its usage chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tests.twin_differences import JSON_DIFFERENCES, OMITTED_BY_REAL_WHEN, ONLY_ON_REAL
from tpuserve.json_types import json_type

Signature = tuple[tuple[str, str], ...]


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def json_differences(real: Any, twin: Any, path: str = "", *, streamed: bool = False) -> list[str]:
    """How `twin` differs from `real`, one line per difference, naming the path; `streamed`:
    they are chunks of a stream (where `OMITTED_BY_REAL_WHEN` does not apply)."""
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
            omission = None if streamed else OMITTED_BY_REAL_WHEN.get(_join(path, key))
            if omission is not None and omission.applies(real):
                continue
            found.append(f"{_join(path, key)}: only on the twin ({twin[key]!r:.60})")
        for key in real.keys() & twin.keys():
            found += json_differences(real[key], twin[key], _join(path, key), streamed=streamed)
        return sorted(found)
    if isinstance(real, list):
        if len(real) != len(twin):
            return [f"{path}: real has {len(real)} elements, twin {len(twin)}"]
        found = []
        for r, t in zip(real, twin, strict=True):
            found += json_differences(r, t, path + "[]", streamed=streamed)
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


def _is_usage(chunk: Any) -> bool:
    return isinstance(chunk, dict) and chunk.get("choices") == [] and "usage" in chunk


def _shapes(chunks: Sequence[Any]) -> list[Signature]:
    return sorted(set(map(signature, chunks)))


def stream_differences(real: Sequence[Any], twin: Sequence[Any]) -> list[str]:
    """How the twin's stream of chunks differs from the real engine's.

    An engine may merge token updates into one chunk, so the number of chunks is not
    compared: the first data chunk's shape (when neither stream's first chunk is also its
    last: a short answer merged whole is one final chunk), the shapes of the chunks between it
    and the last (when both streams have some), the last data chunk and the usage chunk in
    full."""
    found = []
    (real_data, real_usage), (twin_data, twin_usage) = (
        ([c for c in chunks if not _is_usage(c)], [c for c in chunks if _is_usage(c)])
        for chunks in (real, twin)
    )
    if not real_data or not twin_data:
        return [f"data chunks: real {len(real_data)}, twin {len(twin_data)}"]
    both_longer = len(real_data) > 1 and len(twin_data) > 1
    if both_longer and signature(real_data[0]) != signature(twin_data[0]):
        r, t = set(signature(real_data[0])), set(signature(twin_data[0]))
        found.append(f"first chunk: real-only {sorted(r - t)}, twin-only {sorted(t - r)}")
    real_middle, twin_middle = _shapes(real_data[1:-1]), _shapes(twin_data[1:-1])
    if real_middle and twin_middle and real_middle != twin_middle:
        r, t = {s for m in real_middle for s in m}, {s for m in twin_middle for s in m}
        found.append(
            f"chunks between the first and the last: real-only {sorted(r - t)}, "
            f"twin-only {sorted(t - r)}"
        )
    last = json_differences(real_data[-1], twin_data[-1], streamed=True)
    found += [f"last data chunk: {d}" for d in last]
    if len(real_usage) != len(twin_usage):
        found.append(f"usage chunks: real {len(real_usage)}, twin {len(twin_usage)}")
    elif real_usage:
        usage = json_differences(real_usage[-1], twin_usage[-1], streamed=True)
        found += [f"usage chunk: {d}" for d in usage]
    return found
