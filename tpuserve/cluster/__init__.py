"""A local Kubernetes control plane with simulated GKE TPU node pools, for tests and demos.

Public surface (see docs/development.md):

- `Cluster(run_dir, pools=..., lws=None, detach=False)`: start/stop or `with`; `kubeconfig`,
  `api_client()`, `kubectl(*args)`, `helm(*args)`, `add_node_pool(pool)`,
  `remove_node_pool(name)`, `restart_apiserver()`, `service_account_kubeconfig(ns, name)`,
  `server_version()`, `log_report()`; `Cluster.attach(run_dir)` for a detached one.
- `NodePool.tpu(name, generation, topology, nodes=None, spot=False)`, `NodePool.cpu_pool(...)`,
  `load_profile(path)`, `DEFAULT_PROFILE`.
- `Toolchain.discover()`, `ToolchainMissing`, `StartupError`, `CommandError`, `ProfileError`.
"""

from tpuserve.cluster.cluster import Cluster, default_run_dir
from tpuserve.cluster.node_pools import DEFAULT_PROFILE, NodePool, ProfileError, load_profile
from tpuserve.cluster.process import StartupError
from tpuserve.cluster.toolchain import Toolchain, ToolchainMissing
from tpuserve.cluster.tools import CommandError

__all__ = [
    "DEFAULT_PROFILE",
    "Cluster",
    "CommandError",
    "NodePool",
    "ProfileError",
    "StartupError",
    "Toolchain",
    "ToolchainMissing",
    "default_run_dir",
    "load_profile",
]
