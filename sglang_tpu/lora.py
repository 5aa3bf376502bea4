"""SGLang's LoRA contract (0.5.23): how a request names an adapter, how ``--lora-paths`` names
adapters, the names a server's adapters may have, and the errors for an adapter a server
cannot use. The router, the twin, the launcher and the operator all follow it from here."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence


def split_model(model: str, served: Collection[str]) -> tuple[str, str | None]:
    """``(model, adapter)`` of an OpenAI ``model`` value, as SGLang's ``_parse_model_parameter``
    reads it: a name without ``:`` or a served name as is; a served name followed by ``:`` and
    the adapter; else split at the first ``:``; both parts stripped, an empty adapter is none."""
    if ":" not in model or model in served:
        return model, None
    for name in served:
        if model.startswith(name + ":"):
            return name, model[len(name) + 1 :].strip() or None
    base, _, adapter = model.partition(":")
    return base.strip(), adapter.strip() or None


def parse_lora_paths(values: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``(name, path)`` of each ``--lora-paths`` value: ``NAME=PATH``, or ``PATH`` (named by
    its path), as SGLang reads them (its JSON form is not supported here)."""
    adapters = []
    for value in values:
        value = value.strip()
        name, sep, path = value.partition("=")
        adapters.append((name, path) if sep else (value, value))
    return tuple(adapters)


def adapter_problem(adapter: str, enabled: bool, loaded: Sequence[str]) -> str | None:
    """SGLang's message for a request naming ``adapter`` on a server with LoRA ``enabled``
    and the adapters ``loaded``, or None if it may be served (a 400 in SGLang)."""
    if not enabled:
        return (
            f"LoRA adapter '{adapter}' was requested, but LoRA is not enabled. Please launch "
            "the server with --enable-lora flag and preload adapters using --lora-paths or "
            "/load_lora_adapter endpoint."
        )
    if adapter not in loaded:
        return (
            f"Got LoRA adapter that has never been loaded: {adapter}\n"
            f"All loaded adapters: {dict.fromkeys(loaded).keys()}."
        )
    return None


# -- adapters a server is started with ------------------------------------------------------

# A name SGLang can be asked for: `model: "BASE:ADAPTER"` splits at ':' and `--lora-paths
# NAME=PATH` at the first '=', so neither may appear; SGLang strips spaces around both parts.
ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$"
MAX_ADAPTER_NAME_LENGTH = 63
MAX_ADAPTERS = 32  # preloaded adapters; SGLang keeps --max-loras-per-batch (8) in HBM at once
ADAPTER_NAME_ALLOWED = (
    f"letters, digits, '.', '_' and '-', starting and ending with a letter or digit, at most "
    f"{MAX_ADAPTER_NAME_LENGTH} characters (no ':', which separates MODEL:ADAPTER, or '=')"
)
LORA_FLAGS = ("--enable-lora", "--lora-paths")  # what `lora_args` sets, on SGLang and the twin


def adapters_problem(names: Sequence[str]) -> str | None:
    """What is wrong with the names of a server's adapters (the first problem), or None."""
    if len(names) > MAX_ADAPTERS:
        return f"{len(names)} adapters; at most {MAX_ADAPTERS}"
    seen: set[str] = set()
    for name in names:
        if len(name) > MAX_ADAPTER_NAME_LENGTH or not re.match(ADAPTER_NAME_PATTERN, name):
            return f"adapter name {name!r} is not allowed; allowed: {ADAPTER_NAME_ALLOWED}"
        if name in seen:
            return f"adapter name {name!r} repeats; each adapter needs its own name"
        seen.add(name)
    return None


def lora_path(name: str, path: str) -> str:
    """One ``--lora-paths`` value, ``NAME=PATH`` (what `parse_lora_paths` reads back)."""
    return f"{name}={path}"


def lora_args(adapters: Sequence[tuple[str, str]]) -> list[str]:
    """``--enable-lora --lora-paths NAME=PATH ...`` for ``(name, path)`` pairs; [] for none.
    SGLang 0.5.23 and the twin read them alike."""
    if not adapters:
        return []
    return [*LORA_FLAGS, *(lora_path(name, path) for name, path in adapters)]
