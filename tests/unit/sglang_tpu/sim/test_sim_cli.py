"""`tpuserve engine sim` takes every default from the settings dataclasses, written once."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from sglang_tpu.sim import cli as sim_cli
from sglang_tpu.sim.engine import EngineConfig
from sglang_tpu.sim.service import ServerSettings

pytestmark = pytest.mark.unit

OPTIONS = [option for _, group in sim_cli.OPTION_GROUPS for option in group]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sim_cli.configure(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    "option", [o for o in OPTIONS if o.source is not None], ids=lambda o: o.flag
)
def test_a_flag_that_sets_a_field_names_it_and_has_no_default_of_its_own(
    option: sim_cli.Option,
) -> None:
    assert option.source is not None
    assert option.dest in {f.name for f in fields(option.source)}
    assert option.default is None


def test_settings_built_from_no_flags_hold_the_dataclass_defaults() -> None:
    settings = sim_cli.build_settings(parse("--cache-tokens", "50000"))
    server_defaults = sim_cli.field_defaults(ServerSettings)
    for name in ("host", "port", "time_scale", "quantization", "kv_cache_dtype",
                 "kv_events_topic", "kv_events_buffer_steps", "drain_grace_seconds"):  # fmt: skip
        assert getattr(settings, name) == server_defaults[name], name
    engine_defaults = sim_cli.field_defaults(EngineConfig)
    for name in ("page_size", "max_running_requests", "chunked_prefill_size",
                 "max_queued_requests", "seed"):  # fmt: skip
        assert getattr(settings.engine, name) == engine_defaults[name], name


def test_flags_override_the_defaults() -> None:
    args = parse("--cache-tokens", "50000", "--page-size", "32", "--drain-grace-seconds", "2")
    settings = sim_cli.build_settings(args)
    assert settings.engine.page_size == 32
    assert settings.drain_grace_seconds == 2.0
