"""SGLang's own KV-event module (`srt/disaggregation/kv_events.py`) loaded from the pinned wheel.

The module needs msgspec, pyzmq and pydantic (all in the dev environment) and two SGLang
modules whose import would pull in the whole engine: ``sglang.srt.runtime_context``
(`get_parallel`, used only to pick a publisher rank inside a scheduler) and
``sglang.srt.utils.network`` (`NetworkAddress`, used only to parse endpoints for
``/server_info``). Those two are stubbed while the file loads; the stubs raise if anything
calls them, so a test can never pass on a stub. Everything a test uses (the event structs,
`KVEventBatch`, `ZmqEventPublisher`, `KVEventsConfig`) is SGLang's code, unmodified.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import sys
from types import ModuleType
from typing import Any, NoReturn

import msgspec

from tests.sglang_wheel import source

MODULE = "srt/disaggregation/kv_events.py"
_STUBBED = (
    "sglang",
    "sglang.srt",
    "sglang.srt.runtime_context",
    "sglang.srt.utils",
    "sglang.srt.utils.network",
)


def _not_loaded(*_: Any, **__: Any) -> NoReturn:
    raise NotImplementedError("stubbed by tests/sglang_kv_events.py: not loaded from the wheel")


class _NetworkAddressStub:
    parse = staticmethod(_not_loaded)

    def __init__(self, *_: Any, **__: Any) -> None:
        _not_loaded()


def _stubs() -> dict[str, ModuleType]:
    modules = {name: ModuleType(name) for name in _STUBBED}
    for name in ("sglang", "sglang.srt", "sglang.srt.utils"):
        modules[name].__path__ = []  # packages, so the submodules resolve
    modules["sglang.srt.runtime_context"].get_parallel = _not_loaded  # type: ignore[attr-defined]
    modules["sglang.srt.utils.network"].NetworkAddress = _NetworkAddressStub  # type: ignore[attr-defined]
    return modules


@functools.cache
def sglang_kv_events() -> ModuleType:
    """The pinned wheel's ``sglang.srt.disaggregation.kv_events`` module (loaded once)."""
    path = source(MODULE)
    spec = importlib.util.spec_from_file_location("sglang_wheel_kv_events", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = {name: sys.modules.get(name) for name in _STUBBED}
    sys.modules.update(_stubs())
    try:
        spec.loader.exec_module(module)
    finally:  # nothing else in the test session sees the stubs
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
    return module


@functools.cache
def batch_decoder() -> msgspec.msgpack.Decoder[Any]:
    """SGLang's own decoder of a KV-event payload (a ``KVEventBatch``): what a consumer built
    on SGLang's classes accepts; anything else raises ``msgspec.ValidationError``."""
    return msgspec.msgpack.Decoder(sglang_kv_events().KVEventBatch)


def as_fields(event: Any) -> tuple[str, dict[str, Any]]:
    """(type name, fields) of an event: one of SGLang's structs or one of tpuserve's dataclasses."""
    if isinstance(event, msgspec.Struct):
        return type(event).__name__, msgspec.structs.asdict(event)
    return type(event).__name__, dataclasses.asdict(event)
