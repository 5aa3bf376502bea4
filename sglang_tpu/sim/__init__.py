"""The simulated SGLang engine ("engine twin"): one core, a virtual clock and an HTTP server.

`sglang_tpu.sim.engine` holds the core and the virtual-clock driver benchmarks use;
`sglang_tpu.sim.server` serves SGLang's HTTP API on the real clock; `sglang_tpu.sim.cli` is
`tpuserve engine sim`.
"""
