"""The launch contract: every variable the operator sets on a model-server pod, defined once.

The operator builds a `GroupContract` (what every pod of a replica group shares) and turns it
into a pod template's `env` with `pod_env`; per-pod values (host index, replica index under
LeaderWorkerSet, pod name and IP) come from the downward API. Inside the pod,
`tpuserve engine launch` reads the same variables back with `LaunchContract.from_env`, which
reports every problem at once, and derives the TorchTPU environment (`torch_tpu_env`) and the
SGLang command (`sglang_tpu.sglang_flags`).

One module per job; import a name from the module that owns it:

- `env_names`: the variable names (`Var`) and the `{replica}` placeholder;
- `problems`: `Problem` and `ContractError`, what a rejected contract reports;
- `fields`: value types and `var`, which binds a field to its variable;
- `group_contract`: `GroupContract`, the fields and every consistency check;
- `launch_contract`: `LaunchContract` (the group plus this pod's host), `from_env`;
- `doc_rows`: `variables()`, the rows of the table in docs/engine-launch.md;
- `torch_tpu`: `torch_tpu_env`, the TorchTPU/libtpu rendezvous environment of one host;
- `pod_env`: what the operator puts on a pod (`pod_env`, `FieldRef`, hostname lists).

Hostnames. A replica group's hosts reach each other by stable DNS names in a headless
Service; `TPUSERVE_WORKER_HOSTNAMES` lists them in host-index order, so every host derives
the same `TPU_WORKER_HOSTNAMES` and `MASTER_ADDR` (the first name). Under LeaderWorkerSet
one pod template serves every group, so the list may contain `{replica}`, replaced by the
pod's `TPUSERVE_REPLICA_INDEX`; `statefulset_hostnames` and `lws_hostnames` build the lists.
"""
