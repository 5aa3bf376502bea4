"""`tpuserve up`: a local fleet on loopback: engine twins, the router, and optional load.

It starts ``--workers`` `tpuserve engine sim` processes (each with its KV-event and replay
sockets) and one `tpuserve router` process in front of them, all bound to 127.0.0.1 on free
ports (the router on ``--port``), waits until the router has a routable worker and prints
the OpenAI base URL. With ``--load NAME`` it also drives traffic through the router and
shows, live: requests/s, output tokens/s, prefix-cache hit rate (cached / prompt tokens,
from the responses' usage) and p50/p99 time to first token; ``--json`` writes the same as
JSON lines on stdout for programs. Ctrl-C (or SIGTERM) stops the load, then the router and
the engines, and exits 0.

Modules: `command` (flags and the run), `fleet` (child processes), `loads` (the traces
``--load`` offers; `register_load` adds one), `load_driver` (replay and statistics),
`status` (the live table and the JSON lines), `errors`.
"""

from tpuserve.up.loads import LoadFactory, LoadRequest, load_names, make_load, register_load

__all__ = ["LoadFactory", "LoadRequest", "load_names", "make_load", "register_load"]
