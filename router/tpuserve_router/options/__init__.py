"""The flags of `tpuserve router`, in the order `--help` lists them: each an `Option` naming its
`RouterConfig` field, its parser and its help (`option`), grouped by what they set
(`serving`, `limits`, `fleet`). `tpuserve_router.cli` turns them into argparse arguments and
environment variables."""

from __future__ import annotations

from tpuserve_router.options.fleet import FLEET
from tpuserve_router.options.limits import LIMITS
from tpuserve_router.options.option import DEFAULTS, Option
from tpuserve_router.options.serving import SERVING

OPTIONS: tuple[Option, ...] = (*SERVING, *LIMITS, *FLEET)

__all__ = ["DEFAULTS", "OPTIONS", "Option"]
