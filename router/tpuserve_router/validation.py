"""The router's start-up check: every problem with a `RouterConfig`, reported at once.

`tpuserve_router.config_checks` checks what the values alone decide; each package checks its own
part with its own logic (PD mode's worker flags and performance model, the worker URLs and
networks, the peer key file and hosts, the API keys file, the policy and its parameters).
Like `app` and `cli`, this module wires packages together, and no package imports it.
"""

from __future__ import annotations

from tpuserve_router.config import ConfigError, RouterConfig
from tpuserve_router.config_checks import problems as config_problems
from tpuserve_router.engines.worker_networks import worker_problems
from tpuserve_router.peering.kv_snapshot import snapshot_source_problems
from tpuserve_router.peering.peer_settings import peering_problems
from tpuserve_router.pipeline.pd_settings import pd_problems
from tpuserve_router.policies.base import policy_problems
from tpuserve_router.tenancy.auth import api_keys_problems


def validate(config: RouterConfig) -> RouterConfig:
    """Return ``config`` if every setting is valid, else raise `ConfigError` listing all."""
    problems = [
        *pd_problems(config),
        *config_problems(config),
        *worker_problems(config),
        *snapshot_source_problems(config),
        *peering_problems(config),
        *api_keys_problems(config),
        *policy_problems(config.policy, config.policy_params),
    ]
    if problems:
        raise ConfigError(problems)
    return config
