"""One flag of `tpuserve router` (`Option`), how a switch and a list read from the environment,
and the defaults the flags' help shows (`DEFAULTS`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpuserve_router.config import RouterConfig


@dataclass(frozen=True)
class Option:
    flag: str
    field: str
    kind: Callable[[str], Any]
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    switch: bool = False  # --FLAG / --no-FLAG (its environment variable: true, false or auto)


def auto_bool(text: str) -> bool | None:
    """A switch's environment value: true or false, or auto (None: the router decides)."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("auto", ""):
        return None
    raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: true, false or auto")


def comma_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


DEFAULTS = RouterConfig()
