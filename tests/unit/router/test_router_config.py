"""Router settings: flags, then TPUSERVE_ROUTER_* variables, then defaults; every bad value is
reported with its name, its value and what is allowed."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tpuserve_router.cli import build_config, configure, env_name
from tpuserve_router.config import (
    DEFAULT_POLICY,
    ConfigError,
    RouterConfig,
    kv_events_enabled,
    parse_key_values,
)
from tpuserve_router.front.server import front_limits
from tpuserve_router.policies import make_policy
from tpuserve_router.validation import validate

pytestmark = pytest.mark.unit


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(argv)


def test_defaults_are_valid() -> None:
    config = build_config(parse(), environ={})
    assert config == RouterConfig()
    assert config.policy == DEFAULT_POLICY


def test_flags_win_over_environment() -> None:
    env = {"TPUSERVE_ROUTER_PORT": "9001", "TPUSERVE_ROUTER_POLICY": "random"}
    config = build_config(parse("--port", "9002"), environ=env)
    assert (config.port, config.policy) == (9002, "random")


def test_environment_fills_every_kind_of_setting() -> None:
    env = {
        env_name("--workers"): "http://127.0.0.1:1, http://127.0.0.1:2",
        env_name("--kv-events"): "true",
        env_name("--selector"): "a=b,c=d",
        env_name("--discovery"): "kubernetes",
        env_name("--policy-params"): "cache_threshold=0.5,balance_abs_threshold=8",
        env_name("--health-check-interval"): "0.5",
    }
    config = build_config(parse(), environ=env)
    assert config.workers == ("http://127.0.0.1:1", "http://127.0.0.1:2")
    assert config.kv_events is True
    assert config.selector == {"a": "b", "c": "d"}
    assert config.policy_params == {"cache_threshold": "0.5", "balance_abs_threshold": "8"}
    assert config.health_check_interval_seconds == 0.5


def test_kv_events_is_on_off_or_left_to_the_policy() -> None:
    assert build_config(parse("--kv-events"), environ={}).kv_events is True
    assert build_config(parse("--no-kv-events"), environ={}).kv_events is False
    assert build_config(parse(), environ={}).kv_events is None
    env = env_name("--kv-events")
    assert build_config(parse(), environ={env: "off"}).kv_events is False
    assert build_config(parse(), environ={env: "auto"}).kv_events is None
    assert build_config(parse("--kv-events"), environ={env: "false"}).kv_events is True
    with pytest.raises(ConfigError, match="TPUSERVE_ROUTER_KV_EVENTS: 'maybe' is not allowed"):
        build_config(parse(), environ={env: "maybe"})
    with pytest.raises(SystemExit):
        parse("--kv-events", "--no-kv-events")


@pytest.mark.parametrize(
    ("policy", "setting", "subscribes"),
    [
        ("precise", None, True),
        ("cost", None, True),
        ("cache_aware", None, False),
        ("round_robin", None, False),
        ("precise", False, False),
        ("cost", True, True),
        ("least_load", True, True),  # asked for; the app warns it has no index to feed
    ],
)
def test_kv_events_follow_the_policy_unless_set(
    policy: str, setting: bool | None, subscribes: bool
) -> None:
    assert kv_events_enabled(setting, make_policy(policy)) is subscribes


def test_the_default_policy_gets_kv_events_by_default() -> None:
    config = build_config(parse(), environ={})
    assert kv_events_enabled(config.kv_events, make_policy(config.policy)) is True


def test_unreadable_values_are_reported_together_with_their_source() -> None:
    env = {
        "TPUSERVE_ROUTER_PORT": "http",
        "TPUSERVE_ROUTER_MAX_RETRIES": "-1",
        "TPUSERVE_ROUTER_POLICY": "fastest",
    }
    with pytest.raises(ConfigError) as err:
        build_config(parse("--worker", "ftp://x:1"), environ=env)
    problems = err.value.problems
    assert (
        "TPUSERVE_ROUTER_PORT: 'http' is not allowed; allowed: an integer from 0 to 65535 "
        "(0: any free port)" in problems
    )
    assert "TPUSERVE_ROUTER_MAX_RETRIES: '-1' is not allowed; allowed: an integer >= 0" in problems
    assert any(
        p.startswith("TPUSERVE_ROUTER_POLICY='fastest': allowed cache_aware") for p in problems
    )
    assert any("ftp://x:1" in p for p in problems)


def test_a_flag_and_its_variable_obey_one_rule(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse("--max-retries", "-1")
    assert exit_.value.code == 2
    assert "argument --max-retries: '-1' is not allowed" in capsys.readouterr().err
    assert build_config(parse("--max-retries", "3"), environ={}).max_retries == 3


def test_an_empty_variable_for_a_number_is_unset() -> None:
    env = {env_name("--metrics-port"): "", env_name("--seed"): " ", env_name("--leader-label"): ""}
    config = build_config(parse(), environ=env)
    assert (config.metrics_port, config.seed, config.leader_label) == (None, None, "")


def test_validation_names_fields_and_allowed_values() -> None:
    with pytest.raises(ConfigError) as err:
        validate(
            RouterConfig(
                port=70000,
                max_retries=11,
                connect_timeout_seconds=0,
                discovery="kubernetes",
                workers=("http://h:1/path",),
                policy="cache_aware",
                policy_params={"cache_threshold": "2"},
            )
        )
    text = str(err.value)
    assert "port=70000: allowed 0..65535" in text
    assert "max_retries=11: allowed 0..10" in text
    assert "connect_timeout_seconds=0: must be > 0" in text
    assert "selector: required with discovery=kubernetes" in text
    assert "a path or query is not allowed" in text
    assert "cache_threshold=2.0 must be within [0, 1]" in text


def test_selector_keys_and_values_are_checked() -> None:
    with pytest.raises(ConfigError, match="selector value 'a b'"):
        validate(RouterConfig(discovery="kubernetes", selector={"app": "a b"}))
    validate(
        RouterConfig(discovery="kubernetes", selector={"app.kubernetes.io/instance": "llama-3"})
    )


def test_key_values_parse_and_reject_items_without_equals() -> None:
    assert parse_key_values("a=1, b = 2,", "x") == {"a": "1", "b": "2"}
    with pytest.raises(ValueError, match="x: 'oops' is not KEY=VALUE"):
        parse_key_values("a=1,oops", "x")


def test_front_limits_are_flags_and_variables_checked_together() -> None:
    env = {env_name("--max-connections"): "500", env_name("--header-timeout"): "2.5"}
    config = build_config(parse("--max-headers", "40"), environ=env)
    limits = front_limits(config)
    assert (limits.max_connections, limits.header_timeout_seconds, limits.max_headers) == (
        500,
        2.5,
        40,
    )
    assert limits.max_body_bytes == config.max_request_bytes
    assert front_limits(config, max_connections=7).max_connections == 7
    with pytest.raises(ConfigError) as err:
        validate(
            RouterConfig(
                max_header_bytes=512,
                max_request_line_bytes=4096,
                max_headers=2,
                keep_alive_timeout_seconds=0,
            )
        )
    text = str(err.value)
    assert "max_header_bytes=512: must be >= 1024" in text
    assert "max_headers=2: must be >= 8" in text
    assert "max_request_line_bytes=4096: must be <= max_header_bytes=512" in text
    assert "keep_alive_timeout_seconds=0: must be > 0" in text


def test_a_bad_keys_file_or_an_admin_mode_nobody_can_use_stops_the_start(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text('{"keys": [{"key": "short", "tenant": "a"}]}')
    with pytest.raises(ConfigError) as err:
        validate(RouterConfig(api_keys_file=str(keys), admin="sometimes"))  # type: ignore[arg-type]
    text = str(err.value)
    assert "keys[0].key: allowed: a string of at least 16 characters" in text
    assert "admin='sometimes': allowed loopback, keys, open, off" in text
    with pytest.raises(ConfigError, match="needs api_keys_file"):
        validate(RouterConfig(admin="keys"))
    keys.write_text('{"keys": [{"key": "sk-0123456789abcdef", "tenant": "a"}]}')
    with pytest.raises(ConfigError, match='has no key with "admin": true'):
        validate(RouterConfig(api_keys_file=str(keys), admin="keys"))
    with pytest.raises(ConfigError, match="No such file"):
        validate(RouterConfig(api_keys_file=str(tmp_path / "missing.json")))
    env = {env_name("--api-keys-file"): str(keys), env_name("--admin"): "open"}
    config = build_config(parse(), environ=env)
    assert (config.api_keys_file, config.admin) == (str(keys), "open")


@pytest.mark.parametrize(
    "pd_flags",
    [
        ("--prefill", "http://127.0.0.1:1 8998", "--decode", "http://127.0.0.1:2"),
        ("--discovery", "kubernetes", "--selector", "app=m", "--pd-disaggregation"),
    ],
)
def test_the_picker_with_pd_mode_stops_the_start_naming_both(pd_flags: tuple[str, ...]) -> None:
    """A gateway sends a request to the one endpoint the picker names, which in PD mode would
    be a prefill or a decode engine alone (docs/pd.md)."""
    with pytest.raises(ConfigError) as err:
        build_config(parse("--picker-port", "9002", *pd_flags), environ={})
    text = str(err.value)
    assert "picker_port=9002 (--picker-port)" in text
    assert "--prefill/--decode or --pd-disaggregation" in text
    assert build_config(parse(*pd_flags), environ={}).picker_port is None  # alone: valid


def test_hold_and_demand_settings_are_checked() -> None:
    with pytest.raises(ConfigError) as err:
        validate(
            RouterConfig(
                hold_max_requests=-1,
                hold_max_seconds=0,
                demand_lease="Not_A_Name",
                demand_interval_seconds=0,
            )
        )
    text = str(err.value)
    assert "hold_max_requests=-1: allowed 0..100000 (0 turns holding off)" in text
    assert "hold_max_seconds=0: must be > 0" in text
    assert "demand_interval_seconds=0: must be > 0" in text
    assert "demand_lease='Not_A_Name': needs discovery=kubernetes" in text
    assert "demand_lease='Not_A_Name': not a valid object name" in text


def test_hold_flags_and_variables() -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(["--hold-max-requests", "8", "--hold-models", "a,b"])
    config = build_config(args, {env_name("--hold-max-seconds"): "90"})
    assert (config.hold_max_requests, config.hold_max_seconds) == (8, 90.0)
    assert config.hold_models == ("a", "b")


def peer_key(tmp_path: Path, secret: str = "a-shared-secret-of-32-characters") -> str:
    path = tmp_path / "peer-key"
    path.write_text(secret + "\n")
    return str(path)


def test_peering_flags_and_variables(tmp_path: Path) -> None:
    key = peer_key(tmp_path)
    config = build_config(
        parse(
            *("--host", "0.0.0.0", "--peer-port", "8100", "--peer-key-file", key),
            *("--peer", "tcp://10.0.0.7:8100", "--peer", "tcp://[::1]:8100"),
        ),
        environ={env_name("--peers-from-dns"): "m-router-peers.serving.svc"},
    )
    assert (config.peer_port, config.peers) == (8100, ("tcp://10.0.0.7:8100", "tcp://[::1]:8100"))
    assert (config.peers_from_dns, config.peer_key_file) == ("m-router-peers.serving.svc", key)
    env = {env_name("--peer-port"): "8100", env_name("--peers"): "tcp://a:1, tcp://b:2",
           env_name("--host"): "::", env_name("--peer-key-file"): key}  # fmt: skip
    assert build_config(parse(), environ=env).peers == ("tcp://a:1", "tcp://b:2")
    assert RouterConfig().peer_port == 0  # peering is off unless asked for


def test_peering_other_hosts_reach_needs_a_key_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="peering on an address other hosts reach needs"):
        validate(RouterConfig(host="0.0.0.0", peer_port=8100))
    assert validate(RouterConfig(host="127.0.0.1", peer_port=8100))  # this host's peers only
    short = peer_key(tmp_path, "too-short")
    with pytest.raises(ConfigError, match="holds 9 bytes of secret; allowed: 16 to 4096"):
        validate(RouterConfig(host="0.0.0.0", peer_port=8100, peer_key_file=short))
    with pytest.raises(ConfigError, match="no such file"):
        validate(RouterConfig(peer_port=8100, peer_key_file=str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match="needs peer_port"):
        validate(RouterConfig(peer_key_file=peer_key(tmp_path)))


@pytest.mark.parametrize(
    "peer",
    ["tcp://10.0.0.7:8100", "tcp://[::1]:8100", "tcp://[fd00::7]:1", "tcp://localhost:5570",
     "tcp://m-router-peers.serving.svc.cluster.local.:5570", "tcp://Router-0.Peers:5570"],
)  # fmt: skip
def test_a_peer_is_an_ipv4_address_a_dns_name_or_a_bracketed_ipv6_address(
    peer: str, tmp_path: Path
) -> None:
    config = RouterConfig(  # reachable by peers
        host="0.0.0.0", peer_port=1, peers=(peer,), peer_key_file=peer_key(tmp_path)
    )
    assert validate(config).peers == (peer,)


def test_the_kv_snapshot_bound_may_be_4_gib() -> None:
    assert validate(RouterConfig(kv_snapshot_max_bytes=4 << 30)).kv_snapshot_max_bytes == 4 << 30


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"peer_port": 65535}, "peer_port=65535: allowed 1..65534 (the port after it"),
        ({"peer_port": 8000}, "peer_port=8000: it and the port after it must differ from port"),
        ({"peer_port": 7999}, "peer_port=7999: it and the port after it must differ from port"),
        ({"peer_port": 9000, "metrics_port": 9001}, "peer_port=9000: it and the port after"),
        ({"peer_port": 1, "peers": ("http://a:1",)}, "peer 'http://a:1': expected tcp://HOST:PORT"),
        ({"peer_port": 1, "peers": ("tcp://a:0",)}, "port 1..65535"),
        ({"peer_port": 1, "peers": ("tcp://*:5",)}, "'*' is not a host"),
        ({"peer_port": 1, "peers_from_dns": "Not A Name"}, "peers_from_dns='Not A Name': not a"),
        ({"peers": ("tcp://a:1",)}, "peers, peers_from_dns: need peer_port"),
        ({"peers_refresh_interval_seconds": 0.0}, "peers_refresh_interval_seconds=0.0: must be"),
        ({"kv_snapshot_timeout_seconds": 0.0}, "kv_snapshot_timeout_seconds=0.0: must be > 0"),
        ({"kv_snapshot_max_bytes": 10}, "kv_snapshot_max_bytes=10: must be >= 1024"),
        ({"kv_snapshot_max_bytes": 1 << 63}, "must be <= 4294967296 (4 GiB)"),
        ({"peer_port": 1, "peers": ("tcp://-:5570",)}, "peer 'tcp://-:5570': '-' is not a host"),
        ({"peer_port": 1, "peers": ("tcp://[::1:5570",)}, "'[::1' is not a host"),
        ({"peer_port": 1, "peers": ("tcp://a:b:5570",)}, "'a:b' is not a host"),
        ({"peer_port": 1, "peers": ("tcp://::1:5570",)}, "'::1' is not a host (an IPv4"),
        ({"peer_port": 1, "peers": ("tcp://[10.0.0.7]:1",)}, "'[10.0.0.7]' is not a host"),
        ({"peer_port": 1, "peers": ("tcp://a..b:1",)}, "'a..b' is not a host"),
        ({"peer_port": 1, "peers": ("tcp://a_b:1",)}, "'a_b' is not a host"),
    ],
)  # fmt: skip
def test_peering_settings_are_checked(settings: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(RouterConfig(**settings))  # type: ignore[arg-type]
    assert any(problem in p for p in err.value.problems), err.value.problems


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"peers": ("tcp://127.0.0.1:2", "tcp://10.0.0.7:2")}, "(tcp://10.0.0.7:2)"),
        ({"host": "::1", "peers": ("tcp://peer.svc:2",)}, "host='::1' with a peer on another"),
    ],
)
def test_peering_beyond_this_host_needs_a_host_peers_can_reach(
    settings: dict[str, object], problem: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as err:
        validate(RouterConfig(peer_port=5570, **settings))  # type: ignore[arg-type]
    assert any(
        problem in p and "peers could not reach peer_port on a loopback" in p
        for p in err.value.problems
    ), err.value.problems
    key = peer_key(tmp_path)
    for host in ("0.0.0.0", "::", "10.0.0.5"):
        validate(RouterConfig(peer_port=5570, peer_key_file=key, **{**settings, "host": host}))  # type: ignore[arg-type]
    validate(RouterConfig(peer_port=5570, peers=("tcp://127.0.0.1:2", "tcp://[::1]:2")))
    # a name's addresses are known only once resolved (local pods may be loopback addresses):
    # `peers` warns then rather than refusing here
    validate(RouterConfig(peer_port=5570, peers_from_dns="m-router-peers.serving.svc"))


def test_a_clients_share_of_the_buffer_budget_fits_a_body_and_the_budget() -> None:
    mib = 1024 * 1024
    assert RouterConfig().client_buffer_bytes() == 128 * mib  # a quarter of 512 MiB
    small = RouterConfig(max_buffered_bytes=64 * mib, max_request_bytes=32 * mib)
    assert small.client_buffer_bytes() == 32 * mib  # at least one body
    for share in (16 * mib, 80 * mib):
        with pytest.raises(ConfigError) as err:
            validate(small.replace(max_buffered_bytes_per_client=share))
        assert f"max_buffered_bytes_per_client={share}: allowed max_request_bytes=" in str(
            err.value
        )
    flagged = build_config(parse("--max-buffered-bytes-per-client", str(64 * mib)), environ={})
    assert flagged.max_buffered_bytes_per_client == 64 * mib


def test_the_token_cache_bound_is_a_flag_and_a_variable_with_a_floor() -> None:
    """`--token-cache-bytes` (issue 68 item 4: the cache's bound is one of the caps the
    router's memory plateaus under)."""
    flagged = build_config(parse("--token-cache-bytes", str(8 << 20)), {})
    assert flagged.token_cache_bytes == 8 << 20
    env = {env_name("token_cache_bytes"): str(4 << 20)}
    assert build_config(parse(), env).token_cache_bytes == 4 << 20
    assert build_config(parse(), {}).token_cache_bytes == 64 << 20
    with pytest.raises(ConfigError, match=r"token_cache_bytes=1000: must be >= 1048576"):
        validate(RouterConfig(token_cache_bytes=1000))
