"""Command-line flags that set a settings field: one table row per flag, defaults never repeated.

A `Flag` names the field it sets (a dotted path into a frozen settings dataclass, e.g.
`reconciler.render.engine_image` of `OperatorOptions`); its default is read from the
dataclass, so the CLI cannot drift from it (the router's `OPTIONS` table works the same
way). `tpuserve operator` and `tpuserve render` share the `RenderConfig` flags.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from sglang_tpu import cli_types

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Flag:
    flag: str
    field: str  # dotted path of the settings field the flag sets
    help: str  # %(default)s is the field's default
    kind: Callable[[str], Any] = str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    switch: bool = False  # a store_true flag (the field's default is False)

    def under(self, prefix: str) -> Flag:
        """The same flag for settings that hold these ones at `prefix`."""
        return dataclasses.replace(self, field=f"{prefix}.{self.field}")


def field_value(settings: object, path: str) -> Any:
    value = settings
    for part in path.split("."):
        value = getattr(value, part)
    return value


def with_field(settings: T, path: str, value: Any) -> T:
    """`settings` (a frozen dataclass) with the field at `path` replaced."""
    head, _, rest = path.partition(".")
    if rest:
        value = with_field(getattr(settings, head), rest, value)
    replaced: T = dataclasses.replace(cast(Any, settings), **{head: value})
    return replaced


def add_flags(parser: argparse.ArgumentParser, flags: Iterable[Flag], defaults: object) -> None:
    for f in flags:
        default = field_value(defaults, f.field)
        if f.switch:
            parser.add_argument(f.flag, dest=f.field, action="store_true", help=f.help)
            continue
        parser.add_argument(
            f.flag,
            dest=f.field,
            type=f.kind,
            default=default,
            metavar=f.metavar or _metavar(f),
            choices=f.choices,
            help=f.help,
        )


def _metavar(f: Flag) -> str | None:
    """What argparse would show for the flag alone (the field path is the flag's `dest`)."""
    return None if f.choices else f.flag.lstrip("-").upper().replace("-", "_")


def apply_flags(settings: T, flags: Iterable[Flag], args: argparse.Namespace) -> T:
    """`settings` with every flag's parsed value on its field."""
    for f in flags:
        settings = with_field(settings, f.field, getattr(args, f.field))
    return settings


def _none_if_empty(text: str) -> str | None:
    return text or None


def _networks(text: str) -> tuple[str, ...]:
    """Comma-separated CIDRs, each checked (the routers' --worker-networks)."""
    import ipaddress

    networks = tuple(part.strip() for part in text.split(",") if part.strip())
    for network in networks:
        try:
            ipaddress.ip_network(network, strict=False)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--router-worker-networks: {network!r} is not an IP network; allowed: CIDRs "
                "such as 10.0.0.0/8 or fd00::/8, comma-separated, or empty (any address)"
            ) from None
    return networks


# Operator settings that shape the children (RenderConfig), set by both commands.
RENDER_FLAGS: tuple[Flag, ...] = (
    Flag(
        "--engine-image",
        "engine_image",
        "SGLang-on-TPU image of servers that set none (default: %(default)s).",
    ),
    Flag(
        "--sglang-jax-engine-image",
        "sglang_jax_engine_image",
        "SGLang-JAX image of servers with engine.type sglang-jax that set none (default: "
        "%(default)s).",
    ),
    Flag(
        "--router-image",
        "router_image",
        "Router (and simulated engine) image of servers that set none (default: %(default)s).",
    ),
    Flag(
        "--router-policy",
        "router_policy",
        "Routing policy of routers whose TPUModelServer sets none (default: none given, so the "
        "router's own default applies; empty means the same).",
        kind=_none_if_empty,
        metavar="NAME",
    ),
    Flag(
        "--router-replicas",
        "router_replicas",
        "Router replicas of servers that set none (default: %(default)s).",
        kind=cli_types.positive_int,
    ),
    Flag(
        "--router-worker-networks",
        "router_worker_networks",
        "The networks (CIDRs, comma-separated) the routers may dial: their --worker-networks, "
        "so a discovered pod or a KV-event endpoint outside the cluster's pod network is "
        "never dialled (default: none, the router's own default).",
        kind=_networks,
        metavar="CIDR[,CIDR]",
    ),
    Flag(
        "--network-policy",
        "network_policy",
        "engines: a NetworkPolicy per server lets only its routers, its engine pods and "
        "Prometheus (--metrics-from) reach its engines, and one only its own router pods "
        "reach its routers' peer port; none: render none (default: %(default)s).",
        choices=("engines", "none"),
    ),
    Flag(
        "--keda-prometheus-url",
        "keda_prometheus_url",
        "Prometheus that KEDA ScaledObjects' triggers query (autoscaling.engine keda; "
        "default: %(default)s).",
    ),
)
