"""Start SGLang-JAX's HTTP server on a unix socket (the TPU lane's machine refuses TCP sockets).

    python bench/sglang_jax_uds.py SOCKET_PATH [sgl_jax.launch_server arguments ...]

SGLang-JAX's ``http_server.launch`` calls ``uvicorn.run(app, host=..., port=...)``; this wraps
``uvicorn.run`` so the same call listens on ``SOCKET_PATH`` (uvicorn's ``uds``) instead, and then
runs ``sgl_jax.launch_server``'s ``main`` with the remaining arguments. Its own warm-up request
dials TCP: pass ``--skip-server-warmup``. Nothing of SGLang-JAX is copied here.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any


def main() -> None:
    socket_path, rest = sys.argv[1], sys.argv[2:]
    uvicorn = importlib.import_module("uvicorn")
    real_run = uvicorn.run

    def run_on_socket(app: Any, **kwargs: Any) -> None:
        kwargs.pop("host", None)
        kwargs.pop("port", None)
        real_run(app, uds=socket_path, **kwargs)

    setattr(uvicorn, "run", run_on_socket)  # noqa: B010 - http_server calls uvicorn.run
    sys.argv = ["sgl_jax.launch_server", *rest]
    importlib.import_module("sgl_jax.launch_server").main()


if __name__ == "__main__":
    main()
