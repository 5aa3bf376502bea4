"""SGLang's LoRA contract (0.5.23): how a request names an adapter, how ``--lora-paths`` names
adapters, and the errors for an adapter a server cannot use. The router and the twin both
follow it from here."""

from __future__ import annotations

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
