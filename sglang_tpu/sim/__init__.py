"""The simulated SGLang engine ("engine twin"): one core, a virtual clock and an HTTP server.

`engine` is the scheduler core (with `request`, the requests it runs, and `output_text`, the
pseudo-text they produce); `virtual_clock` drives it for benchmarks; `service` drives it on
the real clock and `server` serves SGLang's HTTP API over it (handlers in `native_api`,
`openai_api`, `info_api`); `cli` is `tpuserve engine sim`.
"""
